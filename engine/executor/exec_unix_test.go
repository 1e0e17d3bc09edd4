//go:build unix

package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func mustExec(t testing.TB, spec ExecSpec) Executor {
	t.Helper()
	e, err := NewExec(spec)
	if err != nil {
		t.Fatalf("NewExec(%+v): %v", spec, err)
	}
	return e
}

func TestExec_Success(t *testing.T) {
	for _, argv := range [][]string{
		{"true"},                    // looked up in PATH
		{"/bin/sh", "-c", "exit 0"}, // absolute
		{"sh", "-c", `test "$1" = "a b" && test "$2" = '$HOME;'`, "sh", "a b", "$HOME;"}, // no shell between us and argv
	} {
		if err := mustExec(t, ExecSpec{Command: argv}).Execute(context.Background(), testFire()); err != nil {
			t.Errorf("%q: %v", argv, err)
		}
	}
}

func TestExec_Env(t *testing.T) {
	t.Setenv("SHARDCRON_AUTH_TOKEN", "secret") // must not reach the command
	t.Setenv("HOME", "/home/shardcron")
	t.Setenv("PATH", "/usr/bin:/bin")
	out := filepath.Join(t.TempDir(), "env")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := mustExec(t, ExecSpec{
		Command: []string{self, out},
		Env: map[string]string{
			helperEnv:         "env",
			"B_VAR":           "two words",
			"A_VAR":           "x=y",
			"SHARDCRON_TASK":  "forged", // ours win
			"SHARDCRON_FENCE": "forged",
		},
	})
	if err := e.Execute(context.Background(), testFire()); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(string(b), "\n")
	slices.Sort(got)
	want := []string{
		"A_VAR=x=y",
		"B_VAR=two words",
		helperEnv + "=env",
		"HOME=/home/shardcron",
		"PATH=/usr/bin:/bin",
		"SHARDCRON_ATTEMPT=2",
		"SHARDCRON_FENCE=12345",
		"SHARDCRON_IDEMPOTENCY_KEY=billing/invoice-42@1774746000000",
		"SHARDCRON_NODE=node-a",
		"SHARDCRON_SCHEDULED_AT=2026-03-29T01:00:00.000Z",
		"SHARDCRON_TASK=billing/invoice-42",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("environment:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestExec_EnvDefaults(t *testing.T) {
	t.Setenv("PATH", "")
	t.Setenv("HOME", "") // restored after the test, like PATH
	os.Unsetenv("HOME")
	env := baseEnv(ExecSpec{Env: map[string]string{"PATH": "/opt/bin"}})
	want := []string{"PATH=" + defaultPath, "PATH=/opt/bin"}
	if !slices.Equal(env, want) {
		t.Errorf("baseEnv = %q, want %q (the task's PATH last, so it wins)", env, want)
	}
}

func TestExec_Failure(t *testing.T) {
	long := strings.Repeat("0123456789", 100) // 1000 bytes
	tests := []struct {
		name     string
		script   string
		wantCode int
		want     string
	}{
		{"exit status", "exit 3", 3, "exec: exit status 3"},
		{"stderr in the error", "echo starting >&2; echo 'cannot connect' >&2; exit 1", 1, "exec: exit status 1: starting cannot connect"},
		{"stdout not in the error", "echo out; exit 2", 2, "exec: exit status 2"},
		{"stderr tail", "printf 'HEAD%s' " + long + " >&2; exit 4", 4,
			"exec: exit status 4: …" + long[len(long)-maxStderr:]},
		{"signal", "kill -SEGV $$", -1, "exec: signal: segmentation fault"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := mustExec(t, ExecSpec{Command: []string{"sh", "-c", tt.script}}).Execute(context.Background(), testFire())
			var ee *ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("Execute = %v, want an *ExitError", err)
			}
			if ee.ExitCode != tt.wantCode || err.Error() != tt.want {
				t.Errorf("Execute = %q (code %d)\nwant      %q (code %d)", err, ee.ExitCode, tt.want, tt.wantCode)
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				t.Errorf("%v counts as a timeout or cancel", err)
			}
		})
	}
}

// A command that is not there is named once, with the cause: through an
// allow-list a bare name read "exec: exec: \"x\": executable file not
// found in $PATH", and a path "exec: start \"/x\": fork/exec /x: no such
// file or directory", the cause past the 72 characters of task history's
// column.
func TestExec_NotFound(t *testing.T) {
	everywhere, err := ParsePathAllow([]string{"/"})
	if err != nil {
		t.Fatal(err)
	}
	const name, path = "shardcron-no-such-command", "/nonexistent/shardcron-no-such-command"
	tests := []struct {
		argv0 string
		allow *PathAllow
		is    error
		want  string
	}{
		{name, nil, exec.ErrNotFound, `exec: start "` + name + `": executable file not found in $PATH`},
		{name, everywhere, exec.ErrNotFound, `exec: start "` + name + `": executable file not found in $PATH`},
		{path, nil, os.ErrNotExist, `exec: start "` + path + `": no such file or directory`},
		{path, everywhere, os.ErrNotExist, `exec: start "` + path + `": no such file or directory`},
	}
	for _, tt := range tests {
		err := mustExec(t, ExecSpec{Command: []string{tt.argv0}, Allow: tt.allow}).Execute(context.Background(), testFire())
		if !errors.Is(err, tt.is) {
			t.Errorf("Execute(%q) = %v, want an error wrapping %v", tt.argv0, err, tt.is)
		}
		if err == nil || err.Error() != tt.want {
			t.Errorf("Execute(%q), allow-list %v: %v\nwant %s", tt.argv0, tt.allow, err, tt.want)
		}
	}
}

// alive reports whether pid is a live process (a zombie is dead: it only
// waits for whoever adopted it to reap it).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false // ESRCH; EPERM would be a stranger that reused the pid
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) // no /proc on this system: trust kill
	}
	i := bytes.LastIndexByte(b, ')') // after the command name, which may hold anything
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// readPids reads the pids a script appended to file, one a line.
func readPids(t *testing.T, file string) []int {
	t.Helper()
	b, _ := os.ReadFile(file)
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pid file %q: %v", b, err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// treeScript starts a child, a grandchild and a great-grandchild that sleep,
// each appending its pid to "$1", and waits: nPids lines in all.
const (
	treeScript = `sleep 60 & echo $! >> "$1"
sh -c 'sleep 60 & echo $! >> "$1"; echo $$ >> "$1"; wait' inner "$1" &
echo $$ >> "$1"
echo started >&2
wait`
	nPids = 4
)

func TestExec_KillsProcessGroup(t *testing.T) {
	errReplaced := errors.New("replaced")
	tests := []struct {
		name string
		// ctx returns the fire's context and, unless it ends by itself, a
		// function that ends it.
		ctx  func(t *testing.T) (context.Context, func())
		want []error
	}{
		{"timeout", func(t *testing.T) (context.Context, func()) {
			// Long enough for the script to start its processes on a busy
			// machine; the test fails, rather than passes, if it did not.
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			t.Cleanup(cancel)
			return ctx, nil
		}, []error{context.DeadlineExceeded}},
		{"cancel with cause", func(t *testing.T) (context.Context, func()) {
			ctx, cancel := context.WithCancelCause(context.Background())
			t.Cleanup(func() { cancel(nil) })
			return ctx, func() { cancel(errReplaced) }
		}, []error{context.Canceled, errReplaced}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pids")
			e := mustExec(t, ExecSpec{Command: []string{"sh", "-c", treeScript, "outer", pidFile}})
			ctx, end := tt.ctx(t)
			errc := make(chan error, 1)
			go func() { errc <- e.Execute(ctx, testFire()) }()
			var err error
			if end != nil {
				waitFor(t, 10*time.Second, "the script's pids", func() bool { return len(readPids(t, pidFile)) == nPids })
				end()
				err = <-errc
			} else {
				err = <-errc
			}
			pids := readPids(t, pidFile)
			if len(pids) != nPids {
				t.Fatalf("the script recorded %d pids before the fire ended, want %d (machine too slow?)", len(pids), nPids)
			}
			for _, target := range tt.want {
				if !errors.Is(err, target) {
					t.Errorf("Execute = %v, want an error wrapping %v", err, target)
				}
			}
			if err != nil && !strings.Contains(err.Error(), "process group killed; stderr: started") {
				t.Errorf("error %q does not say the group was killed and quote stderr", err)
			}
			waitFor(t, 10*time.Second, "every process of the group to die", func() bool {
				return !slices.ContainsFunc(pids, alive)
			})
		})
	}
}

func TestExec_KillsLeftovers(t *testing.T) {
	// argv[0] exits at once, leaving a background child that holds stderr.
	pidFile := filepath.Join(t.TempDir(), "pids")
	e := mustExec(t, ExecSpec{Command: []string{"sh", "-c", `sleep 60 & echo $! >> "$1"`, "sh", pidFile}})
	if err := e.Execute(context.Background(), testFire()); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	pids := readPids(t, pidFile)
	if len(pids) != 1 {
		t.Fatalf("pids %v, want 1", pids)
	}
	waitFor(t, 10*time.Second, "the leftover child to die", func() bool { return !alive(pids[0]) })
}

func TestExec_EscapedProcessDoesNotBlock(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid command")
	}
	// A process that leaves the group keeps stderr open: Execute must still
	// return, after a bounded wait.
	pidFile := filepath.Join(t.TempDir(), "pids")
	script := `setsid sh -c 'echo $$ >> "$1"; exec sleep 60' inner "$1" &
while [ ! -s "$1" ]; do sleep 0.01; done`
	e := mustExec(t, ExecSpec{Command: []string{"sh", "-c", script, "sh", pidFile}})
	t.Cleanup(func() {
		for _, pid := range readPids(t, pidFile) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if err := e.Execute(context.Background(), testFire()); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	// It escaped the kill, so this test did test an escaped process.
	if pids := readPids(t, pidFile); len(pids) != 1 || !alive(pids[0]) {
		t.Errorf("escaped process %v is not alive", pids)
	}
}

func TestExec_AlreadyEnded(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := mustExec(t, ExecSpec{Command: []string{"sh", "-c", `echo $$ > "$1"`, "sh", pidFile}}).Execute(ctx, testFire())
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotStarted) {
		t.Errorf("Execute = %v, want context.Canceled and ErrNotStarted", err)
	}
	if _, err := os.Stat(pidFile); err == nil {
		t.Error("the command ran although ctx had ended")
	}
}

func TestNewExec_Invalid(t *testing.T) {
	tests := []struct {
		name string
		spec ExecSpec
	}{
		{"no command", ExecSpec{}},
		{"empty argv0", ExecSpec{Command: []string{""}}},
		{"NUL in argument", ExecSpec{Command: []string{"echo", "a\x00b"}}},
		{"empty env name", ExecSpec{Command: []string{"true"}, Env: map[string]string{"": "x"}}},
		{"= in env name", ExecSpec{Command: []string{"true"}, Env: map[string]string{"A=B": "x"}}},
		{"NUL in env value", ExecSpec{Command: []string{"true"}, Env: map[string]string{"A": "\x00"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := NewExec(tt.spec)
			if !errors.Is(err, ErrInvalidSpec) || e != nil {
				t.Errorf("NewExec = %v, %v; want nil, an error wrapping ErrInvalidSpec", e, err)
			}
		})
	}
}

func TestTail(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"empty", nil, ""},
		{"short", []string{"a\n", "b\n"}, "a b"},
		{"exactly max", []string{strings.Repeat("x", maxStderr)}, strings.Repeat("x", maxStderr)},
		{"one big write", []string{"HEAD" + strings.Repeat("x", maxStderr)}, "…" + strings.Repeat("x", maxStderr)},
		{"many small writes", []string{"HEAD", strings.Repeat("y", maxStderr-2), "zz"}, "…" + strings.Repeat("y", maxStderr-2) + "zz"},
		{"cut rune dropped", []string{"é" + strings.Repeat("x", maxStderr-1)}, "…" + strings.Repeat("x", maxStderr-1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tl tail
			for _, w := range tt.writes {
				_, _ = tl.Write([]byte(w))
			}
			if got := tl.String(); got != tt.want {
				t.Errorf("tail = %q, want %q", got, tt.want)
			}
		})
	}
}

func BenchmarkExec(b *testing.B) {
	e := mustExec(b, ExecSpec{Command: []string{"true"}})
	ctx := context.Background()
	f := testFire()
	b.ReportAllocs()
	for b.Loop() {
		if err := e.Execute(ctx, f); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "fires/s")
}

// TestExec_CapturesStdoutAndStderr: with Fire.Output, both streams are
// kept (up to the bound), and the error's stderr tail stays stderr only.
func TestExec_CapturesStdoutAndStderr(t *testing.T) {
	f := testFire()
	f.Output = NewOutput(4096)
	err := mustExec(t, ExecSpec{Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}).Execute(context.Background(), f)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.ExitCode != 3 || ee.Stderr != "err" {
		t.Fatalf("got %v, want exit 3 with stderr \"err\"", err)
	}
	got := f.Output.String()
	if !strings.Contains(got, "out\n") || !strings.Contains(got, "err\n") || len(got) != len("out\nerr\n") {
		t.Errorf("captured %q, want stdout and stderr", got)
	}
	// Without capture, stdout goes nowhere and nothing is kept.
	if err := mustExec(t, ExecSpec{Command: []string{"sh", "-c", "echo out"}}).Execute(context.Background(), testFire()); err != nil {
		t.Fatal(err)
	}
}
