//go:build unix

package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"
)

// stderrGrace is how long, after the process group is killed, stderr is
// still read: enough for what the pipe holds, bounded for a process that
// left the group (setsid) and keeps the pipe open.
const stderrGrace = 200 * time.Millisecond

// execExec is an exec executor; immutable.
type execExec struct {
	argv  []string
	env   []string   // baseEnv; the fire's variables are appended per fire
	allow *PathAllow // nil: every command
}

// NewExec returns an executor that runs spec.Command once per fire (see the
// package documentation for its environment, process group and what is
// killed when). An empty command, a NUL byte in an argument, or an invalid
// variable name is an error wrapping ErrInvalidSpec. Whether argv[0] exists
// is checked at each fire, since it may be installed later.
func NewExec(spec ExecSpec) (Executor, error) {
	if err := spec.check(false); err != nil {
		return nil, err
	}
	if err := spec.Allow.CheckCommand(spec.Command[0]); err != nil {
		return nil, err
	}
	if err := spec.Allow.CheckEnv(spec.Env); err != nil {
		return nil, err
	}
	return &execExec{argv: slices.Clone(spec.Command), env: baseEnv(spec), allow: spec.Allow}, nil
}

// Execute runs the command once: nil when it exits with status 0, an
// *ExitError for another status, an error wrapping ctx.Err() when ctx ended
// first (the process group is then killed), or the error of starting it
// (e.g. wrapping exec.ErrNotFound).
func (e *execExec) Execute(ctx context.Context, f *Fire) error {
	if ctx.Err() != nil {
		return notStarted(ctx, "exec", "not started")
	}
	name := e.argv[0]
	if e.allow != nil {
		// The path checked is the path run: no second PATH lookup.
		p, err := e.allow.resolve(name)
		if err != nil {
			return err
		}
		name = p
	}
	cmd := exec.CommandContext(ctx, name, e.argv[1:]...)
	cmd.Args[0] = e.argv[0]
	cmd.Env = fireEnv(e.env, f)
	// Stdin stays nil, and Stdout unless the task captures its output:
	// os/exec connects them to /dev/null.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	// Our own pipe rather than an io.Writer as Stderr: os/exec would then
	// wait, in Wait, for every process holding the pipe (a background
	// grandchild) to close it, whereas we want Wait to return when argv[0]
	// exits, so that we can kill the rest of its group.
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("exec: stderr pipe: %w", err)
	}
	cmd.Stderr = pw
	// The capture reads stdout through a pipe of its own, for the same
	// reason, so that the error's stderr tail stays stderr only.
	var opr, opw *os.File
	if f.Output != nil {
		if opr, opw, err = os.Pipe(); err != nil {
			pr.Close()
			pw.Close()
			return fmt.Errorf("exec: stdout pipe: %w", err)
		}
		cmd.Stdout = opw
	}
	closeAll := func(fs ...*os.File) {
		for _, x := range fs {
			if x != nil {
				x.Close()
			}
		}
	}

	var (
		mu     sync.Mutex // guards exited, and orders Cancel's kill before the reap
		exited bool       // the group was killed after argv[0] exited
	)
	cmd.Cancel = func() error {
		mu.Lock()
		defer mu.Unlock()
		if exited {
			return nil
		}
		// -pid: the whole group, whose id is argv[0]'s pid (Setpgid).
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		return nil
	}
	if err := cmd.Start(); err != nil {
		closeAll(pr, pw, opr, opw)
		if ctx.Err() != nil {
			return notStarted(ctx, "exec", "not started")
		}
		return startError(e.argv[0], err)
	}
	closeAll(pw, opw) // the children hold their copies: EOF when the last one exits
	pgid := cmd.Process.Pid

	var stderr tail
	var errOut io.Writer = &stderr
	if f.Output != nil {
		errOut = io.MultiWriter(&stderr, f.Output)
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(errOut, pr)
	}()
	outCopied := make(chan struct{})
	if opr != nil {
		go func() {
			defer close(outCopied)
			_, _ = io.Copy(f.Output, opr)
		}()
	} else {
		close(outCopied)
	}

	killGroup := func() {
		mu.Lock()
		defer mu.Unlock()
		exited = true
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // ESRCH: nothing was left
	}
	// Kill what argv[0] left in its group, before Wait reaps argv[0] where
	// the platform allows it: while argv[0] is an unreaped zombie its pid,
	// the group's id, cannot be reused, so the kill cannot hit a stranger.
	exitedFirst := waitExited(pgid)
	if exitedFirst {
		killGroup()
	}
	waitErr := cmd.Wait()
	if !exitedFirst {
		killGroup()
	}
	_ = pr.SetReadDeadline(time.Now().Add(stderrGrace))
	if opr != nil {
		_ = opr.SetReadDeadline(time.Now().Add(stderrGrace))
	}
	<-copied
	<-outCopied
	closeAll(pr, opr)

	state := cmd.ProcessState
	switch {
	case state != nil && state.Success():
		// It finished, even if ctx ended at the same moment.
		return nil
	case ctx.Err() != nil:
		detail := "process group killed"
		if s := stderr.String(); s != "" {
			detail += "; stderr: " + s
		}
		return interrupted(ctx, "exec", detail)
	case state != nil:
		return &ExitError{ExitCode: state.ExitCode(), Status: state.String(), Stderr: stderr.String()}
	}
	return fmt.Errorf("exec: wait: %w", waitErr)
}
