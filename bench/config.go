package bench

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/internal/tuning"
)

// Scenario names, as 'shardcron bench <scenario>' takes them.
const (
	Throughput  = "throughput"
	Burst       = "burst"
	Memory      = "memory"
	Import      = "import"
	Restart     = "restart"
	Query       = "query"
	Trigger     = "trigger"
	Rebalance   = "rebalance"
	Failover    = "failover"
	LockPerFire = "lock-per-fire"
	Robfig      = "robfig"
	AfterFunc   = "afterfunc"
	All         = "all"
)

// ProcScenarios are the scenarios Config.Procs applies to: those whose
// figures depend on nodes not sharing a process. Memory's node process is
// 'shardcron bench memory --etcd' (Config.Etcd), which reads its own heap
// after a full GC; the others' are 'shardcron server'.
var ProcScenarios = []string{Throughput, Burst, Memory, Import, Restart, Query, Trigger, Rebalance, Failover}

// Scenarios lists every scenario but All, in the order All runs them.
var Scenarios = []string{Throughput, Burst, Memory, Import, Restart, Query, Trigger, Rebalance, Failover, LockPerFire, Robfig, AfterFunc}

// Executors the throughput-like scenarios can give their tasks.
const (
	// ExecNoop is the engine's noop executor: the engine alone. Fires are
	// keyed through one probe task per partition.
	ExecNoop = "noop"
	// ExecHandler is an in-process handler that records every fire.
	ExecHandler = "handler"
	// ExecHTTP posts every fire to a receiver on loopback that records it.
	ExecHTTP = "http"
)

// Config says what to run. Zero fields take the scenario's defaults
// (Defaults); Validate reports what is out of range.
type Config struct {
	// Scenario is one of Scenarios or All.
	Scenario string
	// Tasks is how many tasks the scenario holds.
	Tasks int
	// Nodes is the number of in-process nodes. For rebalance it is the
	// cluster's size once the joining node is in; for failover its size
	// before one node is killed; both need at least 2.
	Nodes int
	// Duration is how long the measured window lasts (for rebalance and
	// failover: how long the cluster runs after the event).
	Duration time.Duration
	// Schedule is every task's schedule (default "@every 1s"; memory's
	// tasks "@yearly"). Trigger's tasks are always yearly, so that only its
	// bulk trigger fires them: it refuses another.
	Schedule string
	// Executor is ExecNoop (default), ExecHandler or ExecHTTP.
	Executor string

	// Engine tuning, as the server flags of the same names. Zero: the
	// engine's default.
	Partitions  int
	Replication int
	Load        float64
	Workers     int
	Queue       int
	Tick        time.Duration
	// LeaseTTL is the nodes' session lease (default 10s): failover takes
	// about this long.
	LeaseTTL time.Duration

	// Procs runs the nodes of the scenarios in ProcScenarios as separate
	// processes of Binary ('shardcron server'; memory's one node:
	// 'shardcron bench memory --etcd'), so that their heaps and
	// garbage collections share nothing with each other, with the embedded
	// etcd or with the harness (which stay in the bench's process). With
	// All or a list, the other scenarios run in-process; alone, they refuse
	// it.
	Procs bool
	// Binary is the shardcron command node processes run (required with
	// Procs; the bench command passes its own executable).
	Binary string

	// Etcd, for Memory only, is the client URL of an etcd that already
	// holds the tasks (as 'memory --procs' writes them): the bench then
	// starts no etcd and writes no task (only the node its session and
	// partition locks), and loads them into one engine, so that its
	// process holds the node alone and its heap and full GC are the
	// node's. Empty: the bench starts its own etcd.
	Etcd string

	// Runs is how many times each scenario runs; a Result then holds the
	// median of each figure (default 1).
	Runs int

	// Trace, for Burst in-process only, is a file the Go execution trace
	// of the bench's process is written to, from 250 ms before the burst's
	// second until every fire ran (go tool trace): where the node's loop
	// and workers waited, and for what. Empty: no trace.
	Trace string

	// Dir holds etcd's data and the nodes' caches (default: a temporary
	// directory removed at the end).
	Dir string
	// Progress receives progress lines (default: discarded).
	Progress io.Writer
}

// defaultTasks is each scenario's task count when Config.Tasks is 0.
var defaultTasks = map[string]int{
	Throughput: 100_000, Burst: 100_000, Memory: 10_000_000, Import: 100_000,
	Restart: 100_000, Query: 100_000, Trigger: 100_000, Rebalance: 100_000, Failover: 100_000,
	LockPerFire: 1_000, Robfig: 100_000, AfterFunc: 100_000,
}

// Defaults returns c with its zero fields set to the scenario's defaults.
func (c Config) Defaults() Config {
	if c.Tasks == 0 {
		c.Tasks = defaultTasks[c.Scenario]
		if c.Tasks == 0 {
			c.Tasks = 100_000
		}
	}
	if c.Nodes == 0 {
		switch c.Scenario {
		case Rebalance, Failover, LockPerFire:
			c.Nodes = 3
		default:
			c.Nodes = 1
		}
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Schedule == "" {
		c.Schedule = "@every 1s"
		if c.Scenario == Memory || c.Scenario == Trigger {
			c.Schedule = quietSchedule
		}
	}
	if c.Executor == "" {
		c.Executor = ExecNoop
	}
	d := engine.DefaultConfig("")
	if c.Partitions == 0 {
		c.Partitions = d.Partitions
	}
	if c.Replication == 0 {
		c.Replication = d.ReplicationFactor
	}
	if c.Load == 0 {
		c.Load = d.Load
	}
	if c.Workers == 0 {
		c.Workers = d.Workers
	}
	if c.Queue == 0 {
		c.Queue = d.Queue
	}
	if c.Tick == 0 {
		c.Tick = d.Tick
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = d.LeaseTTL
	}
	if c.Runs == 0 {
		c.Runs = 1
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// Validate applies the defaults and checks every field. Its error has a
// line a field at fault, which starts with the field's name.
func (c Config) Validate() error {
	given := c
	c = c.Defaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Scenario == Trigger && given.Schedule != "" && given.Schedule != quietSchedule {
		// Scheduled fires would count as the trigger's, in with its own.
		bad("schedule", "trigger's tasks fire once a year (%s), so that only the trigger fires them: leave it out", quietSchedule)
	}
	for _, s := range strings.Split(c.Scenario, ",") {
		if s != All && !slices.Contains(Scenarios, s) {
			bad("scenario", "unknown scenario %q (want %s or all, or a comma-separated list)", s, strings.Join(Scenarios, ", "))
		}
	}
	if c.Runs < 1 || c.Runs > 100 {
		bad("runs", "must be between 1 and 100, got %d", c.Runs)
	}
	if c.Procs && slices.Contains(Scenarios, c.Scenario) && !slices.Contains(ProcScenarios, c.Scenario) {
		bad("procs", "applies to %s, not to %s", strings.Join(ProcScenarios, ", "), c.Scenario)
	}
	if c.Procs {
		if c.Executor == ExecHandler {
			bad("executor", "handler runs in-process only; node processes take noop or http")
		}
		if c.Binary == "" {
			bad("binary", "node processes need the shardcron binary")
		} else if fi, err := os.Stat(c.Binary); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			bad("binary", "%q is not an executable file", c.Binary)
		}
	}
	if c.Dir != "" {
		if err := checkWorkDir(c.Dir); err != nil {
			bad("dir", "%v", err)
		}
	}
	if c.Trace != "" && (c.Scenario != Burst || c.Procs || c.Runs > 1) {
		bad("trace", "applies to one in-process burst (no --procs, --runs 1), not to %s", c.Scenario)
	}
	if c.Etcd != "" {
		if c.Scenario != Memory {
			bad("etcd", "applies to memory only, not to %s", c.Scenario)
		}
		if c.Procs {
			bad("etcd", "memory --procs starts its own etcd; give --etcd or --procs, not both")
		}
		if u, err := url.Parse(c.Etcd); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("etcd", "want a client URL such as http://127.0.0.1:2379, got %q", c.Etcd)
		}
	}
	if c.Tasks < 1 || c.Tasks > 100_000_000 {
		bad("tasks", "must be between 1 and 100000000, got %d", c.Tasks)
	}
	if c.Nodes < 1 || c.Nodes > 64 {
		bad("nodes", "must be between 1 and 64, got %d", c.Nodes)
	}
	if (c.Scenario == Rebalance || c.Scenario == Failover) && c.Nodes < 2 {
		bad("nodes", "%s needs at least 2 nodes, got %d", c.Scenario, c.Nodes)
	}
	if c.Duration < time.Second {
		bad("duration", "must be at least 1s, got %v", c.Duration)
	}
	// Every scenario counts the fires it expects with shardcron's parser;
	// the baselines run robfig/cron's too, which takes other specs: both
	// are checked now, not after the scenarios before them ran.
	if _, err := schedule.Parse(c.Schedule, "UTC", "t"); err != nil {
		bad("schedule", "%v", err)
	} else if names := robfigScenarios(c.Scenario); len(names) > 0 {
		if _, err := parseRobfig(c.Schedule); err != nil {
			bad("schedule", "robfig/cron (used by %s) cannot parse %q: %v", strings.Join(names, ", "), c.Schedule, err)
		}
	}
	if !slices.Contains([]string{ExecNoop, ExecHandler, ExecHTTP}, c.Executor) {
		bad("executor", "unknown executor %q (want noop, handler or http)", c.Executor)
	}
	// The engine's tuning, named by its flags rather than by an engine
	// field (and the ring's error not given twice, by the ring and by the
	// engine that validates it too).
	for _, e := range tuning.Check(tuning.Values{
		Partitions: c.Partitions, Replication: c.Replication, Workers: c.Workers, Queue: c.Queue,
		Load: c.Load, Tick: c.Tick, LeaseTTL: c.LeaseTTL,
	}) {
		bad(e.Flag, "%s", e.Msg)
	}
	if len(errs) == 0 {
		// What the checks above miss; a node would refuse it at start.
		if err := c.engineConfig("n").Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkWorkDir refuses a work directory that is not one, or that holds an
// earlier run's etcd, directly or in a scenario's subdirectory: its tasks
// and caches would mix with this run's, whose nodes then wait for tasks it
// did not write. Anything else in it (a report) may stay.
func checkWorkDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() == "etcd" || e.IsDir() && fileExists(filepath.Join(dir, e.Name(), "etcd")) {
			return fmt.Errorf("%s holds an earlier run (%s): give a new or empty directory", dir, filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// robfigScenarios returns the scenarios of scenario (All, a list) that
// run robfig/cron's parser on the schedule.
func robfigScenarios(scenario string) []string {
	var out []string
	for _, s := range scenarioList(scenario) {
		if (s == LockPerFire || s == Robfig || s == AfterFunc) && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// engineConfig is a node's engine configuration.
func (c Config) engineConfig(nodeID string) engine.Config {
	ec := engine.DefaultConfig(nodeID)
	ec.Partitions, ec.ReplicationFactor, ec.Load = c.Partitions, c.Replication, c.Load
	ec.Workers, ec.Queue, ec.Tick = c.Workers, c.Queue, c.Tick
	ec.LeaseTTL = c.LeaseTTL
	ec.BatchSize = min(ec.BatchSize, c.Queue)
	return ec
}
