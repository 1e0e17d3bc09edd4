package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"time"

	"github.com/shardcron/shardcron/internal/childproc"
	"github.com/shardcron/shardcron/task"
)

// quietSchedule is the schedule of the memory scenario's tasks when none
// is given, and of the trigger scenario's: it does not fire while the heap
// is measured, nor among the triggered fires.
const quietSchedule = "@yearly"

// runMemory writes cfg.Tasks tasks to the bench's etcd and measures etcd's
// database per task, then loads the tasks into one engine and measures its
// heap per task, a full GC, the load time and the RSS.
//
// In-process (the default) the engine shares its heap with the embedded
// etcd: etcd's heap moves while the engine loads (its raft log is dropped
// at each snapshot) and a full GC marks it too, so bytes_per_task and
// gc_pause_ms are the whole process's. With Procs the node is a process of
// its own, 'shardcron bench memory --etcd', which holds the engine alone.
// With Etcd the bench is that process: it loads the tasks that etcd holds
// and writes no task.
func runMemory(ctx context.Context, cfg Config) (*Result, error) {
	c, err := startCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.close() }()
	if cfg.Etcd != "" {
		return loadNode(ctx, c, cfg)
	}
	db0, err := c.dbSize(ctx)
	if err != nil {
		return nil, err
	}
	noop := func(int) task.Executor { return task.Executor{Type: task.ExecutorNoop} }
	if err := c.putTasks(ctx, cfg.Tasks, cfg.Schedule, noop); err != nil {
		return nil, err
	}
	db1, err := c.dbSize(ctx)
	if err != nil {
		return nil, err
	}
	gcEtcd := timeGC()
	var r *Result
	if cfg.Procs {
		fmt.Fprintf(cfg.Progress, "bench: loading the tasks into a node process\n")
		if r, err = memoryProc(ctx, cfg, c.endpoint); err != nil {
			return nil, err
		}
		r.Procs = true
		r.Note = fmt.Sprintf("the node ran in its own process: bytes_per_task, gc_pause_ms and rss_bytes are its own; "+
			"a full GC of the bench's process (the embedded etcd, RSS %d MiB) took %.1f ms", rss()>>20, gcEtcd)
	} else {
		if r, err = loadNode(ctx, c, cfg); err != nil {
			return nil, err
		}
		r.Note = fmt.Sprintf("in-process: bytes_per_task and gc_pause_ms are the whole process's, the embedded etcd's heap included "+
			"(a full GC of it alone took %.1f ms before the engine loaded); --procs measures the node alone", gcEtcd)
	}
	r.EtcdBytesPerTask = float64(max(db1-db0, 0)) / float64(cfg.Tasks) // etcd may compact its pages meanwhile
	return r, nil
}

// loadNode starts one node on c's etcd, waits until it is ready with
// cfg.Tasks tasks, and measures how much the live heap grew per task, a
// full GC and the process's RSS.
func loadNode(ctx context.Context, c *cluster, cfg Config) (*Result, error) {
	heap0 := liveHeap()
	start := time.Now()
	if _, err := c.addNode(ctx, false); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, cfg.Tasks, readyTimeout(cfg)); err != nil {
		return nil, err
	}
	r := &Result{Scenario: Memory, Tasks: cfg.Tasks, Nodes: 1, LoadMs: ms(int64(time.Since(start)))}
	heap1 := liveHeap()
	r.BytesPerTask = heapGrowth(heap0, heap1, cfg.Tasks)
	r.GCPauseMs = timeGC()
	r.RSSBytes = rss()
	return r, nil
}

// memoryProc runs memory's node as a process of cfg.Binary on the etcd at
// endpoint, which holds the tasks, and returns what the process measured.
// Its progress goes to cfg.Progress.
func memoryProc(ctx context.Context, cfg Config, endpoint string) (*Result, error) {
	cmd := exec.CommandContext(ctx, cfg.Binary, memoryArgs(cfg, endpoint)...)
	cmd.SysProcAttr = childproc.Attr()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, cfg.Progress
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("bench: memory node process: %w", err)
	}
	return memoryResult(out.Bytes(), cfg.Tasks)
}

// memoryArgs are the arguments of memory's node process: the bench's
// memory scenario on the etcd at endpoint, with cfg's engine tuning.
func memoryArgs(cfg Config, endpoint string) []string {
	return []string{"bench", Memory, "--etcd", endpoint, "--json",
		"--tasks", strconv.Itoa(cfg.Tasks),
		"--partitions", strconv.Itoa(cfg.Partitions), "--replication", strconv.Itoa(cfg.Replication),
		"--load", strconv.FormatFloat(cfg.Load, 'g', -1, 64),
		"--workers", strconv.Itoa(cfg.Workers), "--queue", strconv.Itoa(cfg.Queue),
		"--tick", cfg.Tick.String(), "--lease-ttl", cfg.LeaseTTL.String(),
	}
}

// memoryResult reads the node process's result: the JSON object on the
// last line of its output, for want tasks.
func memoryResult(out []byte, want int) (*Result, error) {
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	var m struct {
		Tasks        int     `json:"tasks"`
		BytesPerTask float64 `json:"bytes_per_task"`
		GCPauseMs    float64 `json:"gc_pause_ms"`
		RSSBytes     uint64  `json:"rss_bytes"`
		LoadMs       float64 `json:"load_ms"`
	}
	if err := json.Unmarshal(lines[len(lines)-1], &m); err != nil {
		return nil, fmt.Errorf("bench: memory node process: its result %q: %w", lines[len(lines)-1], err)
	}
	if m.Tasks != want {
		return nil, fmt.Errorf("bench: memory node process: loaded %d tasks, want %d", m.Tasks, want)
	}
	return &Result{Scenario: Memory, Tasks: m.Tasks, Nodes: 1, BytesPerTask: m.BytesPerTask,
		GCPauseMs: m.GCPauseMs, RSSBytes: m.RSSBytes, LoadMs: m.LoadMs}, nil
}

// timeGC is the wall time of a full, blocking GC in milliseconds.
func timeGC() float64 {
	runtime.GC()
	start := time.Now()
	runtime.GC()
	return ms(int64(time.Since(start)))
}

// dbSize is the part of etcd's database in use.
func (c *cluster) dbSize(ctx context.Context) (int64, error) {
	st, err := c.admin.Status(ctx, c.endpoint)
	if err != nil {
		return 0, fmt.Errorf("bench: etcd status: %w", err)
	}
	return st.DbSizeInUse, nil
}
