package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/shardcron/shardcron/bench"
	"github.com/shardcron/shardcron/engine"
)

const benchHelp = `Usage: shardcron bench SCENARIO[,SCENARIO...] [flags]

Runs benchmark scenarios on nodes that share an embedded etcd on loopback,
and prints what they measured. The nodes run in the bench's process, or with
--procs as 'shardcron server' processes. Progress goes to stderr.

Scenarios:
  throughput     --nodes nodes fire --tasks tasks on --schedule for --duration:
                 fires/s, lag, CPU, RSS, etcd requests, duplicates, misses
  burst          --tasks tasks due in the same second: that burst's lag
  memory         --tasks tasks loaded into one engine: bytes a task, full GC,
                 load time, RSS, and etcd's bytes a task; with --etcd URL,
                 the tasks that etcd already holds, with no etcd in this
                 process and no task written
  import         --tasks tasks through the HTTP batch API: tasks/s
  restart        a warm restart of a node with --tasks tasks from its cache:
                 time to ready and to the first fire, and the graceful stop's
                 time before it
  query          --tasks tasks with two labels on --nodes nodes: p50 and p99
                 over 100 rounds of GET /v1/tasks to the first node (the first
                 page of 100 prefix matches, 100 label matches, a page of
                 1000 without a filter), then the export of every task
  trigger        --tasks yearly tasks on --nodes nodes, all triggered at once
                 through the first node's HTTP API (POST /v1/tasks:trigger
                 {"all": true}, as 'task trigger --all'): the call's time and
                 triggers/s, the time to the last fire and fires/s,
                 duplicates and misses, and the trigger keys left in etcd
                 (waited for while the owners delete them: how long until
                 none)
  rebalance      a node joins a cluster of --nodes - 1 under load, leaves
                 gracefully (SIGTERM), then starts again from its data
                 directory, as in a rolling restart: for each event,
                 hand-over lag per moved partition, misfires, duplicates,
                 misses, time to ready
  failover       one of --nodes nodes is killed under load: the same figures
  lock-per-fire  the seed design: every node's robfig cron fires every task
                 and each fire races for an etcd mutex (NewSession + TryLock)
  robfig         robfig/cron/v3's own runner with --tasks entries
  afterfunc      one time.AfterFunc per task
  all            every scenario, then the comparison table

Several scenarios (all, or a list such as throughput,lock-per-fire,robfig)
run side by side: with --runs N they take turns, run after run, and each
row is the median of its N runs. When throughput (and memory) run with a
baseline (lock-per-fire, robfig, afterfunc), a ratio table follows: how many
times better shardcron does on fires/s, lag p99, CPU per fire, etcd requests
per fire and bytes per task.

--procs runs the nodes of throughput, burst, import, restart, query,
trigger, rebalance and failover as separate 'shardcron server' processes (this
executable, or --bin), so that the nodes' heaps and garbage collections
share nothing with each other or with etcd; etcd, the HTTP receiver of the
keyed fires and the bookkeeping stay in the bench's process. memory's node
is then 'shardcron bench memory --etcd' on the bench's etcd: its bytes a task
are the growth of its own live heap after a full GC, and its full GC marks
no etcd (in-process, both are the whole process's, the embedded etcd's heap
included). Figures then come from the nodes' /metrics and
/v1/partitions and from the receiver; cpu_cores and rss_bytes are the node
processes' (harness_cpu_cores is the bench's own). Each node's log is
written to its work directory (--dir to keep it).

Lag is when the executor ran minus the scheduled time; burst, and
throughput with --procs, report the nodes' own lag histograms instead (due
to a worker taking the fire), since a probe's lag through a process times
its HTTP request too, and a burst probes too few tasks for a p99.
Duplicates and misses are counted by idempotency key; with the noop
executor on one probe task per partition (noop fires are invisible; 64
partitions for burst, and for throughput with --procs, where each probe
costs the node far more than a noop fire), with handler and http on every
task.
In-process, CPU and RSS are the whole process's, embedded etcd included;
in a list (or with --runs), rss_bytes also holds what the scenarios before
it left in the process (the Go runtime returns memory to the system
slowly): run a scenario alone, or with --procs, for its own RSS. A
baseline's bytes_per_task is the growth of the live heap after a full GC,
0 if it shrank.

A scenario that measured nothing (no fire in its window; in rebalance or
failover, no partition moved) says so in a warning on stderr and in its
note (the line after the table; "note" in the JSON): its zeros are not
results.

A numeric flag given as 0 is refused: leave it out for its default.

Examples:
  shardcron bench throughput --tasks 1000000 --duration 20s
  shardcron bench rebalance --tasks 1000000 --nodes 2 --procs --json
  shardcron bench query --tasks 1000000 --nodes 3 --procs --json
  shardcron bench trigger --tasks 1000000 --procs --json
  shardcron bench throughput,lock-per-fire,robfig,afterfunc --runs 3
  shardcron bench all --tasks 100000 --report ./bench-report
`

func runBench(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron bench", benchHelp, stdout, stderr)
	var cfg bench.Config
	var asJSON bool
	var report string
	c.fs.IntVar(&cfg.Tasks, "tasks", 0, "tasks, 1-100000000 (default: the scenario's, 100000; memory 10000000; lock-per-fire 1000)")
	c.fs.IntVar(&cfg.Nodes, "nodes", 0, "nodes, 1-64 (default 1; lock-per-fire 3, and rebalance and failover 3, at least 2)")
	c.fs.DurationVar(&cfg.Duration, "duration", 0, "measured window, at least 1s; for rebalance and failover, how long the cluster runs after each event (default 10s)")
	c.fs.StringVar(&cfg.Schedule, "schedule", "", `every task's schedule (default "@every 1s"; burst makes its own, trigger's tasks are yearly); lock-per-fire, robfig and afterfunc run it on robfig/cron, which must parse it too`)
	c.fs.StringVar(&cfg.Executor, "executor", "", "noop (default), handler (in-process nodes only, records every fire) or http (posts to a loopback receiver)")
	c.fs.IntVar(&cfg.Partitions, "partitions", 0, "partitions, 1-32768 (default 1024)")
	c.fs.IntVar(&cfg.Replication, "replication", 0, "ring virtual nodes per member, 2-256 (default 20)")
	c.fs.Float64Var(&cfg.Load, "load", 0, "bounded-load factor, above 1 (default 1.25)")
	c.fs.IntVar(&cfg.Workers, "workers", 0, fmt.Sprintf("worker pool size of each node, 1-%d (default 256)", engine.MaxWorkers))
	c.fs.IntVar(&cfg.Queue, "queue", 0, fmt.Sprintf("dispatch queue length of each node, 1-%d (default 65536)", engine.MaxQueue))
	c.fs.DurationVar(&cfg.Tick, "tick", 0, "timing wheel resolution, 100µs to 100ms (default 1ms)")
	c.fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 0, "session lease of each node, a whole number of seconds, at least 2s (etcd leases count whole seconds): failover takes about this long (default 10s)")
	c.fs.BoolVar(&cfg.Procs, "procs", false, "run the nodes of throughput, burst, import, restart, query, trigger, rebalance and failover as 'shardcron server' processes, and memory's node as 'shardcron bench memory --etcd'")
	c.fs.StringVar(&cfg.Etcd, "etcd", "", "memory only: the client URL of an etcd that already holds --tasks tasks; the bench starts no etcd, writes no task and measures the one engine it loads them into")
	c.fs.StringVar(&cfg.Binary, "bin", "", "the shardcron executable node processes run (default: this one)")
	c.fs.IntVar(&cfg.Runs, "runs", 1, "run each scenario N times, in turns, and report the medians")
	c.fs.StringVar(&cfg.Dir, "dir", "", "work directory for etcd, the caches and the node logs, not one an earlier run used, kept afterwards; several scenarios or runs each get a subdirectory (default: a temporary directory, removed afterwards)")
	c.fs.BoolVar(&asJSON, "json", false, `print the result as one JSON object on the last line of stdout (several scenarios: {"results":[...],"ratios":[...]})`)
	c.fs.StringVar(&report, "report", "", "write DIR/report.html (the comparison table, the ratios and SVG charts, self-contained) and each chart as DIR/*.svg; DIR is made and checked for writing before the run")
	c.fs.StringVar(&cfg.Trace, "trace", "", "burst only, in-process: write the Go execution trace of the burst, from 250 ms before its second until every fire ran, to FILE (go tool trace)")
	var cpuProfile string
	c.fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to FILE (go tool pprof)")
	pos, code, done := c.parse(args)
	if done {
		return code
	}
	switch {
	case len(pos) == 0:
		return c.usageError("missing SCENARIO (one of %s, all)", strings.Join(bench.Scenarios, ", "))
	case len(pos) > 1:
		return c.tooManyArgs("SCENARIO", pos)
	}
	cfg.Scenario = pos[0]
	cfg.Progress = stderr
	if cfg.Procs && cfg.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(stderr, "shardcron bench: --procs: this executable: %v (give --bin)\n", err)
			return exitError
		}
		cfg.Binary = exe
	}
	// bench.Config takes 0 for "the default", which only an omitted flag
	// means: an explicit --tasks 0 is a mistake, as it is for the server.
	var errs []error
	for _, name := range zeroIsDefault {
		if c.given(name) && isZero(c.fs.Lookup(name).Value.(flag.Getter).Get()) {
			errs = append(errs, fmt.Errorf("%s: must not be 0 (leave --%s out for the default)", name, name))
		}
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return c.usageError("%v", err)
	}
	if report != "" {
		if err := checkReportDir(report); err != nil {
			return c.usageError("--report: %v", err)
		}
	}

	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(stderr, "shardcron bench: cpu profile: %v\n", err)
			return exitError
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := bench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "shardcron bench: %v\n", err)
		if len(results) == 0 {
			return exitError
		}
	}
	bench.WriteTable(stdout, results)
	ratios := bench.Ratios(results)
	bench.WriteRatios(stdout, ratios)
	// The JSON comes first: a report that fails at the end must not lose
	// what the run measured.
	if asJSON {
		var b []byte
		if bench.IsList(cfg.Scenario) {
			if ratios == nil {
				ratios = []bench.Ratio{}
			}
			b, _ = json.Marshal(struct {
				Results []*bench.Result `json:"results"`
				Ratios  []bench.Ratio   `json:"ratios"`
			}{results, ratios})
		} else {
			b, _ = json.Marshal(results[0])
		}
		fmt.Fprintf(stdout, "%s\n", b)
	}
	if report != "" {
		path, rerr := bench.WriteReport(report, results, ratios)
		if rerr != nil {
			fmt.Fprintf(stderr, "shardcron bench: %v\n", rerr)
			return exitError
		}
		fmt.Fprintf(stderr, "shardcron bench: wrote %s\n", path)
	}
	if err != nil {
		return exitError
	}
	return exitOK
}

// zeroIsDefault are the bench flags whose 0 bench.Config takes for the
// default.
var zeroIsDefault = []string{"tasks", "nodes", "duration", "partitions", "replication", "load",
	"workers", "queue", "tick", "lease-ttl", "runs"}

// isZero reports whether v, the value of an int, float or duration flag,
// is 0.
func isZero(v any) bool {
	switch v := v.(type) {
	case int:
		return v == 0
	case float64:
		return v == 0
	case time.Duration:
		return v == 0
	}
	return false
}

// checkReportDir makes dir and checks that a file can be written there,
// so that a bad --report is found before the run rather than after it.
func checkReportDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".shardcron-bench-probe-*")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %w", dir, err)
	}
	_ = f.Close()
	return os.Remove(f.Name())
}
