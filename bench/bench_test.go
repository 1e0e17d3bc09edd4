package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardcron/shardcron/task"
)

// binDir holds the shardcron binary the process tests build; removed at
// the end.
var binDir string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.Cleanup(func(code int) {
			if binDir != "" {
				_ = os.RemoveAll(binDir)
			}
			os.Exit(code)
		}),
		// HTTP connections (the http executor, the import client) end their
		// reader goroutines asynchronously after their transports close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// small is a configuration every scenario runs quickly with.
func small(scenario string) Config {
	cfg := Config{
		Scenario: scenario, Tasks: 300, Duration: 2 * time.Second,
		Partitions: 16, LeaseTTL: 2 * time.Second, Workers: 16, Queue: 4096,
	}
	switch scenario {
	case Rebalance, Failover:
		cfg.Nodes = 2
	case LockPerFire:
		cfg.Tasks, cfg.Nodes = 50, 2
	case Memory:
		cfg.Tasks = 5000 // etcd's database grows by pages: a few tasks may not move it
	}
	return cfg
}

// runJSON runs cfg and returns its result as the JSON object the command
// prints.
func runJSON(t *testing.T, cfg Config) (*Result, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run %s: %v", cfg.Scenario, err)
	}
	if len(rs) != 1 {
		t.Fatalf("run %s: %d results, want 1", cfg.Scenario, len(rs))
	}
	b, err := json.Marshal(rs[0])
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	t.Logf("%s", b)
	return rs[0], m
}

// TestRun_EveryScenario runs each scenario at a small size and checks that
// its JSON holds exactly its documented fields, with values consistent
// with each other. It asserts nothing about speed.
func TestRun_EveryScenario(t *testing.T) {
	for _, s := range Scenarios {
		t.Run(s, func(t *testing.T) {
			cfg := small(s)
			if s == Burst {
				cfg.Trace = filepath.Join(t.TempDir(), "burst.trace")
			}
			r, m := runJSON(t, cfg)
			if cfg.Trace != "" {
				// A Go execution trace begins "go 1.N trace".
				if b, err := os.ReadFile(cfg.Trace); err != nil || !bytes.HasPrefix(b, []byte("go 1.")) {
					t.Errorf("the burst's trace: %d bytes, %v; want a Go execution trace", len(b), err)
				}
			}
			var keys []string
			for k := range m {
				if _, ok := optional[k]; !ok {
					keys = append(keys, k)
				}
			}
			slices.Sort(keys)
			want := slices.Sorted(slices.Values(Fields[s]))
			if !slices.Equal(keys, want) {
				t.Errorf("JSON fields\n got %v\nwant %v", keys, want)
			}
			if m["scenario"] != s || int(m["tasks"].(float64)) != cfg.Tasks {
				t.Errorf("scenario %v, tasks %v; want %s, %d", m["scenario"], m["tasks"], s, cfg.Tasks)
			}
			checkConsistent(t, cfg, r)
		})
	}
}

// checkConsistent checks what a result's figures say of each other.
func checkConsistent(t *testing.T, cfg Config, r *Result) {
	t.Helper()
	has := func(f string) bool { return slices.Contains(Fields[r.Scenario], f) }
	if has("fires_per_sec") {
		if r.Fires == 0 || r.DurationS <= 0 {
			t.Fatalf("fires %d in %.3f s: nothing fired", r.Fires, r.DurationS)
		}
		if got := r.FiresPerSec * r.DurationS; math.Abs(got-float64(r.Fires)) > 0.05*float64(r.Fires) {
			t.Errorf("fires_per_sec × duration_s = %.0f, fires = %d: more than 5 %% apart", got, r.Fires)
		}
	}
	if has("lag_p50_ms") && !(0 <= r.LagP50Ms && r.LagP50Ms <= r.LagP99Ms && r.LagP99Ms <= r.LagMaxMs) {
		t.Errorf("lag p50 %.3f, p99 %.3f, max %.3f: not ordered", r.LagP50Ms, r.LagP99Ms, r.LagMaxMs)
	}
	if has("handoff_p50_ms") {
		if !(0 <= r.HandoffP50Ms && r.HandoffP50Ms <= r.HandoffP99Ms && r.HandoffP99Ms <= r.HandoffMaxMs) {
			t.Errorf("hand-over p50 %.3f, p99 %.3f, max %.3f: not ordered", r.HandoffP50Ms, r.HandoffP99Ms, r.HandoffMaxMs)
		}
		if r.MovedPartitions < 1 || r.MovedPartitions > cfg.Partitions {
			t.Errorf("moved_partitions %d: want 1..%d", r.MovedPartitions, cfg.Partitions)
		}
		if r.ReadyMs <= 0 {
			t.Errorf("ready_ms %.1f: want > 0", r.ReadyMs)
		}
	}
	for _, ev := range []struct {
		name string
		e    Event
	}{{"leave", r.Leave}, {"rejoin", r.Rejoin}} {
		if !has(ev.name + "_handoff_p50_ms") {
			continue
		}
		e := ev.e
		if !(0 <= e.HandoffP50Ms && e.HandoffP50Ms <= e.HandoffP99Ms && e.HandoffP99Ms <= e.HandoffMaxMs) {
			t.Errorf("%s hand-over p50 %.3f, p99 %.3f, max %.3f: not ordered", ev.name, e.HandoffP50Ms, e.HandoffP99Ms, e.HandoffMaxMs)
		}
		// The partitions the joining node took go back when it leaves,
		// and come to it again when it starts again.
		if e.MovedPartitions != r.MovedPartitions {
			t.Errorf("%s_moved_partitions %d, moved_partitions %d: want the same", ev.name, e.MovedPartitions, r.MovedPartitions)
		}
		if e.ReadyMs <= 0 {
			t.Errorf("%s_ready_ms %.1f: want > 0", ev.name, e.ReadyMs)
		}
	}
	if has("keyed_tasks") && (r.KeyedTasks < 1 || r.KeyedTasks > r.Tasks) {
		t.Errorf("keyed_tasks %d: want 1..%d", r.KeyedTasks, r.Tasks)
	}
	if has("missed") {
		// Misses are counted among the keyed tasks' expected fires.
		perTask := float64(r.ExpectedFires) / float64(r.Tasks)
		if float64(r.Missed) > perTask*float64(max(r.KeyedTasks, r.Tasks))+0.5 {
			t.Errorf("missed %d of %d expected fires", r.Missed, r.ExpectedFires)
		}
		if r.ExpectedFires == 0 {
			t.Errorf("expected_fires 0: the window holds no scheduled second")
		}
	}
	if has("duplicates") && r.Duplicates > r.Fires {
		t.Errorf("duplicates %d > fires %d", r.Duplicates, r.Fires)
	}
	if has("tasks_per_sec") {
		if got := r.TasksPerSec * r.DurationS; math.Abs(got-float64(r.Tasks)) > 0.05*float64(r.Tasks) {
			t.Errorf("tasks_per_sec × duration_s = %.0f, tasks = %d", got, r.Tasks)
		}
	}
	if has("bytes_per_task") && r.BytesPerTask <= 0 {
		t.Errorf("bytes_per_task %.1f: want > 0", r.BytesPerTask)
	}
	if has("etcd_bytes_per_task") && r.EtcdBytesPerTask <= 0 {
		t.Errorf("etcd_bytes_per_task %.1f: want > 0", r.EtcdBytesPerTask)
	}
	if has("ready_ms") && r.Scenario == Restart && (r.ReadyMs <= 0 || r.FirstFireMs <= 0 || r.StopMs <= 0) {
		t.Errorf("ready_ms %.1f, first_fire_ms %.1f, stop_ms %.1f: want all > 0", r.ReadyMs, r.FirstFireMs, r.StopMs)
	}
	if has("prefix100_p50_ms") {
		for _, q := range [][2]float64{{r.PrefixP50Ms, r.PrefixP99Ms}, {r.LabelP50Ms, r.LabelP99Ms}, {r.PageP50Ms, r.PageP99Ms}} {
			if !(0 < q[0] && q[0] <= q[1]) {
				t.Errorf("query p50 %.3f, p99 %.3f: want 0 < p50 <= p99", q[0], q[1])
			}
		}
		if got := r.ExportTasksPerSec * r.DurationS; math.Abs(got-float64(r.Tasks)) > 0.05*float64(r.Tasks) {
			t.Errorf("export_tasks_per_sec × duration_s = %.0f, tasks = %d", got, r.Tasks)
		}
	}
	if has("rss_bytes") && r.RSSBytes == 0 {
		t.Errorf("rss_bytes 0")
	}
}

// TestRun_KeyedExecutors checks that the handler and http executors key
// every task, and that a healthy small run of either counts each expected
// fire once.
func TestRun_KeyedExecutors(t *testing.T) {
	for _, x := range []string{ExecHandler, ExecHTTP} {
		t.Run(x, func(t *testing.T) {
			cfg := small(Throughput)
			cfg.Executor = x
			r, _ := runJSON(t, cfg)
			if r.KeyedTasks != cfg.Tasks {
				t.Errorf("keyed_tasks %d, want every task (%d)", r.KeyedTasks, cfg.Tasks)
			}
			checkConsistent(t, cfg, r)
		})
	}
}

func TestConfig_Validate(t *testing.T) {
	used := t.TempDir() // a directory an earlier run left
	if err := os.Mkdir(filepath.Join(used, "etcd"), 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	report := t.TempDir() // a report made before the run: no earlier run
	if err := os.Mkdir(filepath.Join(report, "report"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := (Config{Scenario: Throughput, Dir: report}).Validate(); err != nil {
		t.Errorf("a work directory holding a report: %v", err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown scenario", Config{Scenario: "fast"}, `unknown scenario "fast"`},
		{"rebalance alone", Config{Scenario: Rebalance, Nodes: 1}, "rebalance needs at least 2 nodes"},
		{"bad executor", Config{Scenario: Throughput, Executor: "exec"}, `unknown executor "exec"`},
		{"bad schedule", Config{Scenario: Throughput, Schedule: "61 * * * * *"}, "schedule"},
		{"schedule on trigger", Config{Scenario: Trigger, Schedule: "@every 1s"}, "schedule: trigger's tasks fire once a year"},
		{"short duration", Config{Scenario: Throughput, Duration: time.Millisecond}, "duration: must be at least 1s"},
		{"negative tasks", Config{Scenario: Throughput, Tasks: -1}, "tasks: must be between"},
		{"bad partitions", Config{Scenario: Throughput, Partitions: -3}, "artitions"},
		{"unknown in a list", Config{Scenario: "throughput,fast"}, `unknown scenario "fast"`},
		{"negative runs", Config{Scenario: Throughput, Runs: -1}, "runs: must be between"},
		{"procs on a baseline", Config{Scenario: Robfig, Procs: true, Binary: "/bin/sh"}, "procs: applies to"},
		{"etcd on throughput", Config{Scenario: Throughput, Etcd: "http://127.0.0.1:2379"}, "etcd: applies to memory only"},
		{"etcd with procs", Config{Scenario: Memory, Etcd: "http://127.0.0.1:2379", Procs: true, Binary: "/bin/sh"}, "not both"},
		{"etcd not a URL", Config{Scenario: Memory, Etcd: "127.0.0.1:2379"}, "etcd: want a client URL"},
		{"procs without binary", Config{Scenario: Rebalance, Procs: true}, "binary: node processes need"},
		{"procs with a directory", Config{Scenario: Rebalance, Procs: true, Binary: "/"}, "is not an executable"},
		{"procs with handler", Config{Scenario: Throughput, Procs: true, Binary: "/bin/sh", Executor: ExecHandler}, "handler runs in-process only"},
		{"trace on throughput", Config{Scenario: Throughput, Trace: "t.out"}, "trace: applies to one in-process burst"},
		{"trace through processes", Config{Scenario: Burst, Trace: "t.out", Procs: true, Binary: "/bin/sh"}, "trace: applies to one in-process burst"},
		{"trace over runs", Config{Scenario: Burst, Trace: "t.out", Runs: 3}, "trace: applies to one in-process burst"},
		{"schedule robfig cannot parse", Config{Scenario: "throughput,robfig", Schedule: "H/2 * * * * *"},
			`schedule: robfig/cron (used by robfig) cannot parse "H/2 * * * * *"`},
		{"schedule in a list", Config{Scenario: All, Schedule: "H * * * * *"}, "schedule: robfig/cron (used by lock-per-fire, robfig, afterfunc)"},
		{"lease of 1s", Config{Scenario: Failover, LeaseTTL: time.Second}, "lease-ttl: must be a whole number of seconds, at least 2s"},
		{"dir of an earlier run", Config{Scenario: Throughput, Dir: used}, "holds an earlier run"},
		{"dir a file", Config{Scenario: Throughput, Dir: file}, "dir: "},
		{"lease of 2.5s", Config{Scenario: Failover, LeaseTTL: 2500 * time.Millisecond}, "lease-ttl: must be a whole number"},
		{"negative queue", Config{Scenario: Throughput, Queue: -1}, "queue: must be between 1 and 16777216, got -1"},
		{"negative workers", Config{Scenario: Throughput, Workers: -1}, "workers: must be between 1 and 65536, got -1"},
		{"tick past the watermark", Config{Scenario: Throughput, Tick: time.Second}, "tick: must be between"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	for _, ok := range []Config{{Scenario: "throughput,burst", Schedule: "H/2 * * * * *"}, {Scenario: All}, {Scenario: All, Procs: true, Binary: "/bin/sh"}, {Scenario: "throughput,robfig", Runs: 3}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%s) = %v", ok.Scenario, err)
		}
	}
}

// TestRun_MemoryFromEtcd runs memory on an etcd that already holds the
// tasks (Config.Etcd), as memory's node process does: the bench starts no
// etcd (its work directory is never made), writes no task, and measures
// the engine it loaded them into.
func TestRun_MemoryFromEtcd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := small(Memory)
	c, err := startCluster(ctx, cfg.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if err := c.putTasks(ctx, cfg.Tasks, quietSchedule, func(int) task.Executor { return task.Executor{Type: task.ExecutorNoop} }); err != nil {
		t.Fatal(err)
	}
	cfg.Etcd, cfg.Dir = c.endpoint, filepath.Join(t.TempDir(), "work")
	r, m := runJSON(t, cfg)
	if _, err := os.Stat(cfg.Dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("work directory %s: %v; want none made (no etcd started)", cfg.Dir, err)
	}
	// Here the etcd shares the test's process, and its heap moves while the
	// engine loads (-651 B a task in one run): bytes_per_task is only
	// checked through a node process (TestRun_ProcsMemory).
	if r.Tasks != cfg.Tasks || r.GCPauseMs <= 0 || r.LoadMs <= 0 || r.RSSBytes == 0 {
		t.Errorf("tasks %d, gc_pause_ms %.3f, load_ms %.1f, rss %d: want the loaded engine's",
			r.Tasks, r.GCPauseMs, r.LoadMs, r.RSSBytes)
	}
	if m["etcd_bytes_per_task"].(float64) != 0 {
		t.Errorf("etcd_bytes_per_task %v: want 0 (the tasks were written by someone else)", m["etcd_bytes_per_task"])
	}
	n, _, err := c.reg.Export(ctx, task.Selector{All: true}, func([]byte) error { return nil })
	if err != nil || n != cfg.Tasks {
		t.Errorf("etcd holds %d tasks (%v), want the %d written before", n, err, cfg.Tasks)
	}
}

func TestMemoryResult(t *testing.T) {
	out := []byte("  scenario ...\n" + `{"scenario":"memory","tasks":5000,"nodes":1,"rss_bytes":9,"bytes_per_task":150.5,"etcd_bytes_per_task":0,"gc_pause_ms":2.5,"load_ms":40}` + "\n")
	r, err := memoryResult(out, 5000)
	if err != nil || r.BytesPerTask != 150.5 || r.GCPauseMs != 2.5 || r.RSSBytes != 9 || r.LoadMs != 40 {
		t.Errorf("memoryResult = %+v, %v", r, err)
	}
	for _, tc := range []struct {
		out  string
		want string
	}{
		{`{"tasks":4000}`, "loaded 4000 tasks, want 5000"},
		{"bench: nodes not ready\n", "its result"},
		{"", "its result"},
	} {
		if _, err := memoryResult([]byte(tc.out), 5000); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("memoryResult(%q) = %v, want an error containing %q", tc.out, err, tc.want)
		}
	}
}

// TestRun_ErrorNamesScenarioOnce: a scenario's error is prefixed by its
// name, without the package's "bench: " after it.
func TestRun_ErrorNamesScenarioOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the scenario fails as it starts
	_, err := Run(ctx, small(Throughput))
	if err == nil || !strings.HasPrefix(err.Error(), "throughput: ") || strings.Contains(err.Error(), "bench: ") {
		t.Errorf("Run() = %v, want an error starting \"throughput: \", without \"bench: \"", err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run() = %v: the cause is not kept", err)
	}
}

// TestParseRobfig_Panic: robfig/cron v3.0.1 panics on a "TZ=" prefix
// without a spec; parseRobfig returns that as an error.
func TestParseRobfig_Panic(t *testing.T) {
	for _, spec := range []string{"TZ=UTC", "CRON_TZ=UTC"} {
		if _, err := parseRobfig(spec); err == nil {
			t.Errorf("parseRobfig(%q): no error", spec)
		}
	}
}

// TestRun_NoFireIsNoted: a window in which the schedule gives no fire
// reports 0 fires and 0 lag, with a warning on the progress writer and in
// the result's note, not as a perfect result.
func TestRun_NoFireIsNoted(t *testing.T) {
	cfg := small(Throughput)
	cfg.Duration, cfg.Schedule = time.Second, "0 0 1 1 *"
	var progress bytes.Buffer
	cfg.Progress = &progress
	r, m := runJSON(t, cfg)
	if r.Fires != 0 {
		t.Skipf("%d fires: the run crossed new year", r.Fires)
	}
	if note, _ := m["note"].(string); !strings.Contains(note, "no fire ran in the measured window") {
		t.Errorf("note %q: want it to say no fire ran", note)
	}
	if !strings.Contains(progress.String(), "bench: warning: throughput: no fire ran") {
		t.Errorf("no warning in the progress:\n%s", progress.String())
	}
}

func TestNothingMeasured(t *testing.T) {
	for _, tc := range []struct {
		r    Result
		want []string
	}{
		{Result{Scenario: Throughput, Fires: 10}, nil},
		{Result{Scenario: Throughput}, []string{"no fire ran"}},
		{Result{Scenario: Robfig}, []string{"no fire ran"}},
		{Result{Scenario: Memory}, nil},
		{Result{Scenario: Failover, Fires: 10}, []string{"no partition moved when the node was killed"}},
		{Result{Scenario: Failover, Fires: 10, MovedPartitions: 3}, nil},
		{Result{Scenario: Rebalance, Fires: 10, MovedPartitions: 3, Leave: Event{MovedPartitions: 3}}, []string{"no partition moved when the node started again"}},
		{Result{Scenario: Rebalance}, []string{"no fire ran", "no partition moved when the node joined", "no partition moved when the node left",
			"no partition moved when the node started again"}},
		{Result{Scenario: Restart, ReadyMs: 900}, []string{"no fire came within a minute of ready"}},
		{Result{Scenario: Restart, ReadyMs: 900, FirstFireMs: 950}, nil},
	} {
		got := nothingMeasured(&tc.r)
		if len(got) != len(tc.want) {
			t.Errorf("%s %+v: %q, want %d notes", tc.r.Scenario, tc.r, got, len(tc.want))
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], tc.want[i]) {
				t.Errorf("%s: note %q, want %q", tc.r.Scenario, got[i], tc.want[i])
			}
		}
	}
}
