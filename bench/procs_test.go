package bench

import (
	"bytes"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shardcron/shardcron/internal/buildinputs"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// shardcronBinary builds the shardcron command once per test binary, into a
// directory removed by TestMain's cleanup.
func shardcronBinary(t *testing.T) string {
	t.Helper()
	// So that go test reruns this when the binary\'s sources change.
	if _, err := buildinputs.Open(); err != nil {
		t.Fatal(err)
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "shardcron-bench-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		binPath = filepath.Join(dir, "shardcron")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/shardcron/shardcron/cmd/shardcron").CombinedOutput()
		if err != nil {
			buildErr = err
			binPath = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build shardcron: %v\n%s", buildErr, binPath)
	}
	return binPath
}

// TestRun_ProcsRebalance runs rebalance with node processes at a small
// size: a node joins, leaves with SIGTERM, and starts again from its data
// directory. Each event must be seen
// through the processes' API and the receiver: partitions moved each way,
// the probes' first fires on their new owners timed, the node processes'
// CPU and RSS read from their /metrics, and each node's log in the work
// directory.
func TestRun_ProcsRebalance(t *testing.T) {
	cfg := small(Rebalance)
	// A work directory that does not exist yet is made.
	cfg.Procs, cfg.Binary, cfg.Dir = true, shardcronBinary(t), filepath.Join(t.TempDir(), "work")
	r, m := runJSON(t, cfg)
	checkFields(t, m, append(slices.Clone(Fields[Rebalance]), "procs", "harness_cpu_cores"))
	checkConsistent(t, cfg, r)
	if !r.Procs {
		t.Errorf("procs false: the nodes ran in-process")
	}
	if r.HandoffMaxMs <= 0 || r.Leave.HandoffMaxMs <= 0 || r.Rejoin.HandoffMaxMs <= 0 {
		t.Errorf("hand-over max %.3f ms at the join, %.3f ms at the leave, %.3f ms at the rejoin: want each measured (> 0)",
			r.HandoffMaxMs, r.Leave.HandoffMaxMs, r.Rejoin.HandoffMaxMs)
	}
	// engine/doc.go: graceful hand-overs neither repeat nor miss a fire.
	if r.Missed+r.Duplicates+r.Leave.Missed+r.Leave.Duplicates+r.Rejoin.Missed+r.Rejoin.Duplicates != 0 {
		t.Errorf("join: %d missed, %d duplicates; leave: %d missed, %d duplicates; rejoin: %d missed, %d duplicates; want none",
			r.Missed, r.Duplicates, r.Leave.Missed, r.Leave.Duplicates, r.Rejoin.Missed, r.Rejoin.Duplicates)
	}
	if r.CPUCores <= 0 || r.RSSBytes == 0 {
		t.Errorf("cpu_cores %.3f, rss_bytes %d: want the node processes' (> 0)", r.CPUCores, r.RSSBytes)
	}
	for _, id := range []string{"bench-0", "bench-1"} {
		b, err := os.ReadFile(logPath(cfg.Dir, id))
		if err != nil || !strings.Contains(string(b), startedMsg) {
			t.Errorf("log of %s: %v; want it to hold %q", id, err, startedMsg)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	in := `# HELP shardcron_fires_total Fires dispatched.
# TYPE shardcron_fires_total counter
shardcron_fires_total 1.2345e+06
shardcron_etcd_requests_total{op="get"} 7
shardcron_etcd_requests_total{op="txn put"} 5
shardcron_ready 1
shardcron_fire_lag_seconds_bucket{le="+Inf"} 3
weird_line_without_value
process_resident_memory_bytes NaN
`
	m, err := parseMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"shardcron_fires_total":         1234500,
		"shardcron_etcd_requests_total": 12,
		"shardcron_ready":               1,
	} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}
	if _, ok := m["process_resident_memory_bytes"]; ok {
		t.Errorf("NaN sample read as a figure")
	}
}

func TestStartedURL(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"time":"x","level":"INFO","msg":"shardcron node started","node":"bench-0","api":"http://127.0.0.1:4242"}`, "http://127.0.0.1:4242"},
		{`{"level":"INFO","msg":"started the embedded etcd","api":"http://127.0.0.1:1"}`, ""},
		{`time=x level=INFO msg="shardcron node started"`, ""},
	} {
		if got := startedURL([]byte(tc.line)); got != tc.want {
			t.Errorf("startedURL(%s) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestRun_ProcsFailover kills a node process with SIGKILL: its partitions
// move once its lease ends, and their probes fire again on the survivor.
func TestRun_ProcsFailover(t *testing.T) {
	cfg := small(Failover)
	cfg.Procs, cfg.Binary = true, shardcronBinary(t)
	r, _ := runJSON(t, cfg)
	checkConsistent(t, cfg, r)
	if !r.Procs || r.HandoffMaxMs <= 0 {
		t.Errorf("procs %v, hand-over max %.3f ms: want node processes and the moved partitions' first fires timed", r.Procs, r.HandoffMaxMs)
	}
	// engine/doc.go: after a crash none is missed inside the catch-up
	// window (1 m by default), which covers the 2 s lease.
	if r.Missed != 0 {
		t.Errorf("missed %d keyed fires after the kill, want 0", r.Missed)
	}
}

// TestRun_ProcsScenarios runs throughput, burst, import, restart, query and
// trigger with a node process at a small size: each must measure through the
// process (its /metrics, its API, the receiver), with the process's CPU and
// RSS, and a lag that is the node's own.
func TestRun_ProcsScenarios(t *testing.T) {
	for _, s := range []string{Throughput, Burst, Import, Restart, Query, Trigger} {
		t.Run(s, func(t *testing.T) {
			cfg := small(s)
			cfg.Procs, cfg.Binary = true, shardcronBinary(t)
			r, m := runJSON(t, cfg)
			checkConsistent(t, cfg, r)
			if m["procs"] != true {
				t.Errorf("procs %v: the node ran in-process", m["procs"])
			}
			if s == Import && r.CPUCores <= 0 {
				t.Errorf("cpu_cores %.3f: want the node process's (> 0)", r.CPUCores)
			}
			if s == Trigger && (r.Fires != uint64(cfg.Tasks) || r.Missed+r.Duplicates+r.TriggerKeysLeft != 0) {
				t.Errorf("fires %d of %d triggers, missed %d, duplicates %d, trigger keys left %d: want each fired once, no key left",
					r.Fires, cfg.Tasks, r.Missed, r.Duplicates, r.TriggerKeysLeft)
			}
			if s == Throughput {
				// The node's histogram holds every fire of the window; the
				// probes are one task a partition.
				var n uint64
				for _, b := range r.LagDist {
					n += b.Count
				}
				if math.Abs(float64(n)-float64(r.Fires)) > 0.1*float64(r.Fires) {
					t.Errorf("the lag is of %d fires, the window's are %d: want the node's fire lag, of every fire", n, r.Fires)
				}
			}
		})
	}
}

// TestRun_ProcsMemory loads memory's tasks into a node process of its own
// ('shardcron bench memory --etcd' on the bench's etcd): the tasks are
// written once, by the bench, and the figures are the process's.
func TestRun_ProcsMemory(t *testing.T) {
	cfg := small(Memory)
	var progress bytes.Buffer
	cfg.Procs, cfg.Binary, cfg.Progress = true, shardcronBinary(t), &progress
	r, m := runJSON(t, cfg)
	checkFields(t, m, append(slices.Clone(Fields[Memory]), "procs"))
	checkConsistent(t, cfg, r)
	if !r.Procs || !strings.Contains(r.Note, "own process") || r.LoadMs <= 0 {
		t.Errorf("procs %v, load_ms %.1f, note %q: want the node process's figures", r.Procs, r.LoadMs, r.Note)
	}
	// The node process loads what the bench wrote: it writes no task and
	// starts no etcd of its own.
	if n := strings.Count(progress.String(), "tasks to etcd in"); n != 1 {
		t.Errorf("the tasks were written %d times, want once (by the bench):\n%s", n, progress.String())
	}
}

// checkFields checks that a result's JSON m holds exactly the fields want,
// and a note or not.
func checkFields(t *testing.T, m map[string]any, want []string) {
	t.Helper()
	var keys []string
	for k := range m {
		if k != "note" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	if want = slices.Sorted(slices.Values(want)); !slices.Equal(keys, want) {
		t.Errorf("JSON fields\n got %v\nwant %v", keys, want)
	}
}
