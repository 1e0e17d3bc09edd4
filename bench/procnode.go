package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/childproc"
)

// procStopTimeout bounds how long a node process may take to leave after
// SIGTERM before it is killed. The server's own bounds (release, drain,
// shutdown) are well under it.
const procStopTimeout = 90 * time.Second

// startedMsg is the log message of 'shardcron server' that carries the
// address its API listens on.
const startedMsg = "shardcron node started"

// procNode is one 'shardcron server' process on the bench's etcd. Its
// API listens on a port the kernel chose; the node's start-up log line
// says which.
type procNode struct {
	cmd     *exec.Cmd
	url     string        // "http://127.0.0.1:port", set before startProc returns
	exited  chan struct{} // closed once the process has exited and its log is flushed
	exitErr error         // set before exited is closed
	http    *http.Client

	mu   sync.Mutex // guards last
	last counters   // the latest successful scrape
}

// procArgs are the server flags of node id: the engine tuning of cfg, the
// bench's etcd, a data directory of its own, and no execution history, so
// that the node does the same work as an in-process one.
func procArgs(cfg Config, id, endpoint, dataDir string) []string {
	batch := min(engine.DefaultConfig(id).BatchSize, cfg.Queue)
	return []string{"server",
		"--etcd", endpoint, "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--node-id", id,
		"--log-format", "json", "--log-level", "info", "--history", "none",
		"--partitions", strconv.Itoa(cfg.Partitions), "--replication", strconv.Itoa(cfg.Replication),
		"--load", strconv.FormatFloat(cfg.Load, 'g', -1, 64),
		"--workers", strconv.Itoa(cfg.Workers), "--queue", strconv.Itoa(cfg.Queue), "--batch", strconv.Itoa(batch),
		"--tick", cfg.Tick.String(), "--lease-ttl", cfg.LeaseTTL.String(),
	}
}

// startProc starts a node process and returns once its API listens (it
// is then a member; it is ready later). Its log goes to logPath, after
// that of an earlier process of the node (restart).
func startProc(ctx context.Context, bin string, args []string, logPath string, timeout time.Duration) (*procNode, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("bench: node log: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = childproc.Attr()
	cmd.Stdout = logf
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("bench: start %s: %w", bin, err)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("bench: start %s: %w", bin, err)
	}
	p := &procNode{cmd: cmd, exited: make(chan struct{}), http: &http.Client{Timeout: 5 * time.Second}}
	urlc := make(chan string, 1)
	go func() {
		// The log is read to its end, as Wait must not run before the
		// pipe is drained; the process cannot outlive this goroutine.
		found := false
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logf.Write(append(line, '\n'))
			if !found {
				if u := startedURL(line); u != "" {
					found = true
					urlc <- u
				}
			}
		}
		_, _ = io.Copy(logf, stderr) // a line longer than the buffer: keep the rest
		p.exitErr = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case p.url = <-urlc:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("bench: node exited at start (%v); its log: %s", p.exitErr, logPath)
	case <-timer.C:
		err = fmt.Errorf("bench: node did not start within %v; its log: %s", timeout, logPath)
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.kill()
	return nil, err
}

// startedURL returns the API URL of the server's start-up line, "" for
// any other line.
func startedURL(line []byte) string {
	var l struct {
		Msg string `json:"msg"`
		API string `json:"api"`
	}
	if json.Unmarshal(line, &l) != nil || l.Msg != startedMsg {
		return ""
	}
	return l.API
}

// running reports whether the process has not exited.
func (p *procNode) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// scrape reads the node's /metrics: its counters and whether it is ready
// with how many tasks. A node that does not answer (it is leaving, or
// gone) keeps the counters of its last answer.
func (p *procNode) scrape(ctx context.Context) (k counters, ready bool, tasks int, err error) {
	m, err := p.metrics(ctx)
	if err != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.last, false, 0, err
	}
	k = counters{
		fires:    uint64(m["shardcron_fires_total"]),
		misfires: uint64(m["shardcron_misfires_total"]),
		requests: uint64(m["shardcron_etcd_requests_total"]),
		cpu:      time.Duration(m["process_cpu_seconds_total"] * float64(time.Second)),
		rss:      uint64(m["process_resident_memory_bytes"]),
	}
	p.mu.Lock()
	p.last = k
	p.mu.Unlock()
	return k, m["shardcron_ready"] == 1, int(m["shardcron_tasks"]), nil
}

// metrics returns the samples of /metrics by name, those of one name with
// different labels summed. Histograms and summaries are left out.
func (p *procNode) metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: scrape %s: %w", p.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: scrape %s: %s", p.url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads Prometheus' text format: "name{labels} value" lines.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		// The value follows the last space (no timestamps are written);
		// label values may hold spaces.
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		name := line[:sp]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			continue // not a figure the bench reads
		}
		out[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: read metrics: %w", err)
	}
	return out, nil
}

// owners returns the owner index of every partition as the node's ring
// has it (-1: none, or not a bench node).
func (p *procNode) owners(ctx context.Context, partitions int) ([]int, error) {
	ps, err := client.NewClient(p.url, "").Partitions(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: partitions of %s: %w", p.url, err)
	}
	out := make([]int, partitions)
	for i := range out {
		out[i] = -1
	}
	for _, q := range ps {
		if q.Partition >= 0 && q.Partition < partitions {
			out[q.Partition] = nodeIndex(q.Owner)
		}
	}
	return out, nil
}

// stop sends SIGTERM (a graceful leave: partitions released, executions
// drained) and waits for the process to exit; past procStopTimeout it is
// killed. An exit other than 0 is an error.
func (p *procNode) stop() error {
	if !p.running() {
		return p.exitErr
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("bench: stop node: %w", err)
	}
	timer := time.NewTimer(procStopTimeout)
	defer timer.Stop()
	select {
	case <-p.exited:
		if p.exitErr != nil {
			return fmt.Errorf("bench: node exited: %w", p.exitErr)
		}
		return nil
	case <-timer.C:
		p.kill()
		return fmt.Errorf("bench: node did not leave within %v after SIGTERM; killed", procStopTimeout)
	}
}

// kill sends SIGKILL (a crash) and waits for the process to be gone.
func (p *procNode) kill() {
	if p.running() {
		_ = p.cmd.Process.Kill()
	}
	<-p.exited
}

// logPath is where node id's log goes in dir.
func logPath(dir, id string) string { return filepath.Join(dir, id+".log") }
