package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/childproc"
	"github.com/shardcron/shardcron/internal/etcdtest"
)

// stopTimeout bounds how long Stop waits for a node to exit after SIGTERM.
// The server's own bounds (release, drain, shutdown) are well under it.
const stopTimeout = 90 * time.Second

// startLine begins the line a node's log gets before each process's own:
// the stopped line read back (readStoppedMisfires) is the last process's.
const startLine = "=== clustertest: start #"

// Node is one `shardcron server` process. It keeps its node id, data
// directory, API port, log file and etcd proxies across restarts, so a
// restarted node is the same node to the cluster. Its methods must be called
// from the test goroutine.
type Node struct {
	// ID is the node id (--node-id).
	ID string

	bin     string
	args    []string // flags after the fixed ones
	listen  string   // "127.0.0.1:port", reserved at creation and kept
	dataDir string
	logPath string
	proxies []*etcdtest.Proxy // one per etcd member

	mu      sync.Mutex // guards cmd, exited, exitErr, paused and starts
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the current process has exited
	exitErr error
	paused  bool
	starts  int

	// misfires are the misfires (shardcron_misfires_total) the node's
	// processes counted, as last read (readMisfires): base for the
	// processes before the one of start misfireStart, last for that one.
	misfireBase, misfireLast uint64
	misfireStart             int
}

// newNode prepares a node; it starts nothing.
func newNode(t testing.TB, bin, id string, etcdAddrs []string, args []string) *Node {
	t.Helper()
	dir := t.TempDir()
	n := &Node{ID: id, bin: bin, args: args, dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, id+".log"), listen: reservePort(t)}
	for _, a := range etcdAddrs {
		n.proxies = append(n.proxies, etcdtest.NewProxy(t, a))
	}
	t.Cleanup(n.kill)
	return n
}

// reserved are the ports reservePort handed out in this process: a port
// is free until its node binds it, so two nodes of parallel tests could
// draw the same one and the second would fail to start.
var reserved struct {
	sync.Mutex
	ports map[int]bool
}

// reservePort returns a loopback address whose port was free a moment ago
// and that no other node of this process got. The node keeps it across
// restarts so that its published API address stays right. The port is
// drawn below the kernel's ephemeral range (32768 and up by default), so
// that the kernel does not hand it to a listener on port 0, such as the
// node's own etcd proxies, before the node binds it, and from
// etcdtest.NodePorts up, where no etcd member of any test process takes
// one.
func reservePort(t testing.TB) string {
	t.Helper()
	reserved.Lock()
	defer reserved.Unlock()
	if reserved.ports == nil {
		reserved.ports = map[int]bool{}
	}
	hi := etcdtest.EphemeralStart()
	if hi < etcdtest.NodePorts+1000 {
		hi = 32768 // Linux's default
	}
	for range 100 {
		port := etcdtest.NodePorts + rand.IntN(hi-etcdtest.NodePorts)
		if reserved.ports[port] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		reserved.ports[port] = true
		return addr
	}
	t.Fatalf("clustertest: no free port below the ephemeral range")
	return ""
}

// API is the node's API base URL ("http://127.0.0.1:port").
func (n *Node) API() string { return "http://" + n.listen }

// Running reports whether the node's process is started and has not exited
// (a paused process is running).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// Start starts the node's process; it does not wait for it to be ready.
func (n *Node) Start(t testing.TB) {
	t.Helper()
	if n.Running() {
		t.Fatalf("clustertest: start %s: already running", n.ID)
	}
	var eps []string
	for _, p := range n.proxies {
		eps = append(eps, p.Endpoint())
	}
	args := append([]string{"server", "--etcd", strings.Join(eps, ","), "--listen", n.listen,
		"--data-dir", n.dataDir, "--node-id", n.ID, "--log-format", "json"}, n.args...)
	f, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatalf("clustertest: start %s: %v", n.ID, err)
	}
	n.mu.Lock()
	n.starts++
	fmt.Fprintf(f, startLine+"%d of %s at %s: %s %s\n", n.starts, n.ID,
		time.Now().Format("15:04:05.000"), n.bin, strings.Join(args, " "))
	n.mu.Unlock()
	cmd := exec.Command(n.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childproc.Attr() // a test killed by -timeout leaves no node running
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("clustertest: start %s: %v", n.ID, err)
	}
	exited := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.exited, n.exitErr, n.paused = cmd, exited, nil, false
	n.mu.Unlock()
	go func() {
		err := cmd.Wait()
		f.Close()
		n.mu.Lock()
		n.exitErr = err
		n.mu.Unlock()
		close(exited)
	}()
}

// WaitReady waits until the node's /readyz answers 200: it owns every
// partition the ring gives it. It fails the test if the process exits or
// timeout passes first.
func (n *Node) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for {
		if !n.Running() {
			t.Fatalf("clustertest: %s exited while waiting for /readyz (%v); log tail:\n%s", n.ID, n.exitError(), n.LogTail(40))
		}
		resp, err := client.Get(n.API() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("clustertest: %s not ready within %v; log tail:\n%s", n.ID, timeout, n.LogTail(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *Node) exitError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exitErr
}

func (n *Node) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	n.mu.Lock()
	cmd := n.cmd
	n.mu.Unlock()
	if cmd == nil || !n.Running() {
		t.Fatalf("clustertest: %v to %s: not running", sig, n.ID)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatalf("clustertest: %v to %s: %v", sig, n.ID, err)
	}
}

// Stop sends SIGTERM (a graceful leave) and waits for the process to exit.
// It fails the test if the process does not exit 0 within stopTimeout.
func (n *Node) Stop(t testing.TB) {
	t.Helper()
	n.readMisfires()
	n.signal(t, syscall.SIGTERM)
	if err := n.wait(stopTimeout); err != nil {
		t.Fatalf("clustertest: stop %s: %v; log tail:\n%s", n.ID, err, n.LogTail(40))
	}
	n.readStoppedMisfires()
}

// Kill sends SIGKILL (a crash) and waits for the process to be gone.
func (n *Node) Kill(t testing.TB) {
	t.Helper()
	n.readMisfires()
	n.signal(t, syscall.SIGKILL)
	_ = n.wait(stopTimeout)
}

// Pause sends SIGSTOP: the process stops at once, keep-alives included, as
// in a long GC pause or a frozen VM.
func (n *Node) Pause(t testing.TB) {
	t.Helper()
	n.signal(t, syscall.SIGSTOP)
	n.mu.Lock()
	n.paused = true
	n.mu.Unlock()
}

// Resume sends SIGCONT to a paused node.
func (n *Node) Resume(t testing.TB) {
	t.Helper()
	n.signal(t, syscall.SIGCONT)
	n.mu.Lock()
	n.paused = false
	n.mu.Unlock()
}

// Cut cuts the node off from every etcd member (its proxies blackhole its
// connections); the node itself keeps running.
func (n *Node) Cut() {
	for _, p := range n.proxies {
		p.Cut()
	}
}

// Restore ends a Cut.
func (n *Node) Restore() {
	for _, p := range n.proxies {
		p.Restore()
	}
}

// wait waits for the current process to exit and returns an error unless it
// exited 0.
func (n *Node) wait(timeout time.Duration) error {
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(timeout):
		return fmt.Errorf("did not exit within %v", timeout)
	}
	return n.exitError()
}

// kill ends the process whatever its state; it is the node's cleanup.
func (n *Node) kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-exited
}

// LogTail returns the last entries of the node's log (every run of it, in
// order, each introduced by a "=== clustertest: start" line). Consecutive
// JSON lines with the same level and message are folded into their last
// one, marked with how many there were, so that a warning repeated every
// 100 ms does not hide what came before it.
func (n *Node) LogTail(entries int) string {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	type entry struct {
		line, key string
		count     int
	}
	var out []entry
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		var m struct{ Level, Msg string }
		key := ""
		if json.Unmarshal([]byte(line), &m) == nil && m.Msg != "" {
			key = m.Level + " " + m.Msg
		}
		if k := len(out); k > 0 && key != "" && out[k-1].key == key {
			out[k-1].line, out[k-1].count = line, out[k-1].count+1
			continue
		}
		out = append(out, entry{line, key, 1})
	}
	if len(out) > entries {
		out = out[len(out)-entries:]
	}
	var sb strings.Builder
	for _, e := range out {
		if e.count > 1 {
			fmt.Fprintf(&sb, "(%d times, the last:) ", e.count)
		}
		sb.WriteString(e.line)
		sb.WriteString("\n")
	}
	return strings.TrimRight(sb.String(), "\n")
}

// LogCount returns how many lines of the node's log contain s.
func (n *Node) LogCount(s string) int {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte(s))
}

// Misfires returns the misfires the node's processes counted so far
// (shardcron_misfires_total, summed over policies and restarts), as of the
// last read, which it attempts first.
func (n *Node) Misfires() uint64 {
	n.readMisfires()
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.misfireBase + n.misfireLast
}

// readMisfires reads the running process's shardcron_misfires_total.
func (n *Node) readMisfires() {
	n.mu.Lock()
	paused, starts := n.paused, n.starts
	n.mu.Unlock()
	if paused || !n.Running() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	code, body, err := getStatus(ctx, n.API()+"/metrics")
	if err != nil || code != http.StatusOK {
		return
	}
	var v uint64
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, "shardcron_misfires_total{"); ok {
			if _, num, ok := strings.Cut(rest, "} "); ok {
				f, _ := strconv.ParseFloat(num, 64)
				v += uint64(f)
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if starts != n.starts {
		return // restarted during the read: v may be either process's
	}
	n.noteMisfires(v)
}

// noteMisfires takes v, read from the current process, as its count. n.mu
// is held.
func (n *Node) noteMisfires(v uint64) {
	if n.starts != n.misfireStart {
		n.misfireBase, n.misfireLast, n.misfireStart = n.misfireBase+n.misfireLast, 0, n.starts
	}
	n.misfireLast = max(n.misfireLast, v)
}

// readStoppedMisfires takes the misfires a process that stopped cleanly
// counted in all, from its last line: those of its drain, after /metrics
// stopped answering, are only there. A node far behind counts hundreds
// in it.
func (n *Node) readStoppedMisfires() {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return
	}
	if start := bytes.LastIndex(b, []byte(startLine)); start >= 0 {
		b = b[start:] // this process's lines: an earlier one's count is not this one's
	}
	i := bytes.LastIndex(b, []byte(`"msg":"shardcron node stopped"`))
	if i < 0 {
		return
	}
	line := b[bytes.LastIndexByte(b[:i], '\n')+1:]
	line, _, _ = bytes.Cut(line, []byte("\n"))
	var stopped struct{ Misfires *uint64 }
	if json.Unmarshal(line, &stopped) != nil || stopped.Misfires == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.noteMisfires(*stopped.Misfires)
}

// getJSON GETs url into nothing but its status; it is used for readiness
// style probes with a short timeout.
func getStatus(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, buf.Bytes(), nil
}

var errNoLiveNode = errors.New("clustertest: no running node to ask")
