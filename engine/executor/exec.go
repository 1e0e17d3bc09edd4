package executor

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"slices"
)

// ExecSpec says what command an exec executor runs: the exec fields of a
// task's executor.
type ExecSpec struct {
	// Command is the argv, argv[0] first: a path, or a name looked up in the
	// node's PATH when the fire starts. No shell is involved.
	Command []string
	// Env is added to the command's minimal environment (see the package
	// documentation), after PATH and HOME, so it may replace them.
	Env map[string]string
	// Allow, when set, is the node's exec allow-list: a command outside it
	// is refused (errors wrap ErrNotAllowed) by NewExec when argv[0] is a
	// path, at each fire when it is a name looked up in PATH. Default nil:
	// every command.
	Allow *PathAllow
}

// ExitError is the error of a command that did not exit with status 0
// (and was not killed because ctx ended).
type ExitError struct {
	// ExitCode is the exit status, or -1 when a signal ended the command.
	ExitCode int
	// Status is e.g. "exit status 3" or "signal: segmentation fault".
	Status string
	// Stderr is the end of the command's standard error, at most 512 bytes,
	// on one line: whitespace runs become one space and other control
	// characters U+FFFD. It starts with "…" when stderr was longer.
	Stderr string
}

// Error returns e.g. "exec: exit status 1: cp: cannot stat 'x': No such
// file or directory".
func (e *ExitError) Error() string {
	if e.Stderr == "" {
		return "exec: " + e.Status
	}
	return "exec: " + e.Status + ": " + e.Stderr
}

// maxStderr is how much of the end of stderr an ExitError keeps.
const maxStderr = 512

// defaultPath is the PATH of commands when the node has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// The variables every command gets, which the task's env cannot replace.
const (
	EnvIdempotencyKey = "SHARDCRON_IDEMPOTENCY_KEY"
	EnvTask           = "SHARDCRON_TASK"
	EnvScheduledAt    = "SHARDCRON_SCHEDULED_AT"
	EnvAttempt        = "SHARDCRON_ATTEMPT"
	EnvNode           = "SHARDCRON_NODE"
	EnvFence          = "SHARDCRON_FENCE"
)

// baseEnv returns the environment a command starts from: the node's PATH
// (or defaultPath) and HOME, then the task's variables in name order. The
// rest of the node's environment is left out on purpose: it may hold
// secrets (SHARDCRON_AUTH_TOKEN, etcd passwords) that a task author, who may
// not be the node's operator, must not read.
func baseEnv(spec ExecSpec) []string {
	env := make([]string, 0, 2+len(spec.Env)+6)
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	env = append(env, "PATH="+path)
	if home, ok := os.LookupEnv("HOME"); ok {
		env = append(env, "HOME="+home)
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, k+"="+spec.Env[k])
	}
	return env
}

// fireVars are the variables fireEnv sets for every fire.
var fireVars = []string{EnvIdempotencyKey, EnvTask, EnvScheduledAt, EnvAttempt, EnvNode, EnvFence}

// fireEnv returns base followed by the fire's variables. Later entries win
// in os/exec, so the task cannot override ours.
func fireEnv(base []string, f *Fire) []string {
	v := f.values()
	env := make([]string, len(base), len(base)+6)
	copy(env, base)
	return append(env,
		EnvIdempotencyKey+"="+v.key,
		EnvTask+"="+f.TaskID,
		EnvScheduledAt+"="+v.scheduledAt,
		EnvAttempt+"="+v.attempt,
		EnvNode+"="+f.Node,
		EnvFence+"="+v.fence,
	)
}

// tail keeps the last maxStderr bytes written to it. It is used by one
// goroutine at a time.
type tail struct {
	buf       []byte
	truncated bool // bytes were dropped from the front
}

func (t *tail) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= maxStderr {
		t.truncated = t.truncated || len(t.buf) > 0 || len(p) > maxStderr
		t.buf = append(t.buf[:0], p[len(p)-maxStderr:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - maxStderr; over > 0 {
		t.truncated = true
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the tail on one line.
func (t *tail) String() string {
	b := t.buf
	if t.truncated {
		// Drop a rune cut by the truncation.
		for i := 0; i < len(b) && i < 3 && b[0]&0xC0 == 0x80; i++ {
			b = b[1:]
		}
	}
	s := oneLine(b, false)
	if t.truncated && s != "" {
		s = "…" + s
	}
	return s
}

// startError is the error of a command that could not start, naming it
// once with the cause ("exec: start \"x\": no such file or directory"):
// os/exec's own errors repeat the name (exec: "x": …, fork/exec x: …).
func startError(argv0 string, err error) error {
	var ee *exec.Error
	var pe *fs.PathError
	switch {
	case errors.As(err, &ee):
		argv0, err = ee.Name, ee.Err
	case errors.As(err, &pe) && pe.Op == "fork/exec": // argv0's own; another file's keeps its name
		err = pe.Err
	}
	return fmt.Errorf("exec: start %q: %w", argv0, err)
}
