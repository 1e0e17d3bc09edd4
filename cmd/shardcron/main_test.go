package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/childproc"
)

// binPath is the shardcron binary built once for the tests that run it as
// a process.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shardcron-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "shardcron")
	build := exec.Command("go", "build", "-o", binPath, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building shardcron:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a shardcron server process started by a test.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []map[string]any // JSON log lines
	raw    strings.Builder
	exited chan struct{}
	err    error // from Wait, once exited
	API    string
}

// startServer runs 'shardcron server' with JSON logs, args appended to the
// defaults (listen on a free port). wait says whether to wait until the
// node logs that it started.
func startServer(t *testing.T, wait bool, args ...string) *proc {
	t.Helper()
	return startServerEnv(t, nil, wait, args...)
}

// startServerEnv is startServer with env added to the environment.
func startServerEnv(t *testing.T, env []string, wait bool, args ...string) *proc {
	t.Helper()
	all := append([]string{"server", "--listen", "127.0.0.1:0", "--log-format", "json", "--lease-ttl", "2s"}, args...)
	p := &proc{t: t, cmd: exec.Command(binPath, all...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.SysProcAttr = childproc.Attr()
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var m map[string]any
			p.mu.Lock()
			p.raw.WriteString(line + "\n")
			if json.Unmarshal([]byte(line), &m) == nil {
				p.lines = append(p.lines, m)
				if m["msg"] == "shardcron node started" {
					select {
					case started <- m["api"].(string):
					default:
					}
				}
			}
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("server log:\n%s", p.log())
		}
	})
	if wait {
		select {
		case p.API = <-started:
		case <-p.exited:
			t.Fatalf("server exited before starting: %v\n%s", p.err, p.log())
		case <-time.After(60 * time.Second):
			t.Fatalf("server did not start within 60s\n%s", p.log())
		}
	}
	return p
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// started returns the value of key in the node's "shardcron node
// started" log line, "" before that line.
func (p *proc) started(key string) string {
	return p.logged("shardcron node started", key)
}

// logged returns the value of key in the node's first log line with
// message msg, "" before that line.
func (p *proc) logged(msg, key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.lines {
		if m["msg"] == msg {
			v, _ := m[key].(string)
			return v
		}
	}
	return ""
}

func (p *proc) kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop() int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.waitExit(60 * time.Second)
}

func (p *proc) waitExit(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		p.t.Fatalf("server did not exit within %v\n%s", d, p.log())
	}
	if p.err == nil {
		return 0
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	p.t.Fatalf("wait: %v", p.err)
	return -1
}

// waitReady polls /readyz until it answers 200.
func (p *proc) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(p.API + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s/readyz never answered 200\n%s", p.API, p.log())
}

// runCLI runs the binary with args and returns stdout, stderr and the exit
// code.
func runCLI(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}
