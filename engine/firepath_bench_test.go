package engine

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// shiftedClock is real time shifted by an offset the benchmark sets, so that
// "now" can be placed on a second boundary while time keeps flowing.
type shiftedClock struct{ offset atomic.Int64 }

func (c *shiftedClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *shiftedClock) Until(t time.Time) time.Duration {
	return t.Sub(c.Now())
}

// setNow shifts the clock so that it reads t now.
func (c *shiftedClock) setNow(t time.Time) { c.offset.Store(int64(time.Until(t))) }

// BenchmarkFirePath measures the fire path of one node: the dispatch loop,
// the worker pool and the noop executor, with every task due at the same
// second, as a fleet of every-second tasks is. No etcd: the watermark is
// taken as acknowledged. One op is one burst of n fires: the clock is moved
// to benchIdle before the second, and the loop's own timer wakes it at the
// second, as in a node.
//
// Reported: fires/s (n / time from the second boundary until the last fire
// was executed), last-ms (that time: the whole burst, an upper bound of
// every fire's lag, exact to the 0.1 ms poll; the median burst), first-ms
// (that time for the first burst: a burst that comes once, as the
// harness's burst scenario measures it), p99-lag-ms (boundary to a
// worker taking the fire, read off the engine's histogram, whose buckets
// grow by a quarter), staged/fire (the share of fires released from a stage
// built before the second: stage.go),
// allocs/fire, B/task (engine heap per task held, wheel included) and
// gc-ms (one full collection with the tasks loaded).
//
// SHARDCRON_BENCH_TASKS=N runs N tasks instead (10000000 for the fleet
// size whose memory the bench issue budgets).
func BenchmarkFirePath(b *testing.B) {
	sizes := []int{100_000, 1_000_000}
	if v := os.Getenv("SHARDCRON_BENCH_TASKS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("SHARDCRON_BENCH_TASKS=%q: want a number of tasks", v)
		}
		sizes = []int{n}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("tasks=%d", n), func(b *testing.B) { benchFirePath(b, n) })
	}
}

func benchFirePath(b *testing.B, n int) {
	l, p, clock, base := newBenchLoop(b)
	st := l.stats
	// The queue and batch buffers are per node, not per task.
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	loadNoopTasks(b, l, n, base, func(int) bool { return false })

	runtime.GC()
	var loaded runtime.MemStats
	runtime.ReadMemStats(&loaded)
	gcStart := time.Now()
	runtime.GC()
	gcTime := time.Since(gcStart)

	// Loading took real time, which moved the clock: the loop starts idle
	// a second before the first burst, as a node that loaded its tasks
	// before a burst that comes once (an hourly job's second).
	clock.setNow(base.Add(-time.Second))
	runBenchLoop(b, l, p)
	// Completions flow back to the loop; count executions to know a burst
	// is over.
	executed := func() uint64 { return st.execs[statusOK].Load() }

	var durations []time.Duration
	var mallocs uint64
	b.ResetTimer()
	for i := range b.N {
		boundary := base.Add(time.Duration(i) * time.Second)
		target := uint64(i+1) * uint64(n)
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		// The loop sleeps until the second on its timer, as in a node, and
		// has the last stretch before it to itself (stage.go).
		if i > 0 {
			clock.setNow(boundary.Add(-benchIdle))
			l.cmds <- wakeCmd{} // its timer was set by the old clock
		}
		t0 := time.Now().Add(clock.Until(boundary))
		for executed() < target {
			time.Sleep(100 * time.Microsecond)
		}
		durations = append(durations, time.Since(t0))
		runtime.ReadMemStats(&m1)
		mallocs += m1.Mallocs - m0.Mallocs
	}
	b.StopTimer()
	first := durations[0] // a burst that comes once, as the harness's burst
	slices.Sort(durations)
	median := durations[len(durations)/2]
	b.ReportMetric(float64(n)/median.Seconds(), "fires/s")
	b.ReportMetric(float64(median.Microseconds())/1000, "last-ms")
	b.ReportMetric(float64(first.Microseconds())/1000, "first-ms")
	b.ReportMetric(st.lag().Quantile(0.99)*1000, "p99-lag-ms")
	b.ReportMetric(float64(mallocs)/float64(b.N*n), "allocs/fire")
	b.ReportMetric(float64(loaded.HeapAlloc-before.HeapAlloc)/float64(n), "B/task")
	b.ReportMetric(float64(gcTime.Microseconds())/1000, "gc-ms")
	b.ReportMetric(float64(st.staged.Load())/float64(b.N*n), "staged/fire")
}

// benchIdle is how long before each burst's second, after the first, the
// benchmark moves the clock to: the loop is idle there, as a node's is
// before the second.
const benchIdle = 200 * time.Millisecond

// newBenchLoop builds a dispatch loop and its pool on a fake clock, half a
// second before base, with no etcd and no lead limit, and a store that
// keeps no history, as the harness's nodes have.
func newBenchLoop(b *testing.B) (*loop, *pool, *shiftedClock, time.Time) {
	clock := &shiftedClock{}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock.setNow(base.Add(-time.Second / 2))
	cfg := DefaultConfig("bench").withDefaults()
	cfg.Clock = clock
	start := clock.Now().UnixNano()
	st := &stats{}
	notFenced := func() bool { return false }
	ack := new(acked)
	ack.at.Store(math.MaxInt64 / 2) // no lead limit: etcd is not in these benchmarks
	sc := store.DefaultConfig(b.TempDir())
	sc.History = store.HistoryNone
	history, err := store.Open(sc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = history.Close() })
	p := newPool(cfg, history, st, notFenced, start)
	l, err := newLoop(cfg, schedule.NewTable(), p, newHolds(), st, nil, notFenced, ack, make(chan struct{}, 1), start)
	if err != nil {
		b.Fatal(err)
	}
	return l, p, clock, base
}

// loadNoopTasks loads n every-second noop tasks bench/0000000000... into
// partition 0, resuming at base; paused(i) pauses task i.
func loadNoopTasks(b *testing.B, l *loop, n int, base time.Time, paused func(i int) bool) {
	prof := &profile{key: "noop", exec: executor.Noop, noop: true, timeout: time.Minute, maxAttempts: 1,
		misfire: task.MisfireFireOnce, catchup: time.Minute, concurrency: task.ConcurrencyAllow}
	defs := make([]taskDef, 0, loadChunk)
	load := func() {
		l.handle(&loadCmd{part: 0, resume: base.UnixNano() - 1, defs: defs, first: true, done: make(chan struct{})})
		defs = defs[:0]
	}
	for i := range n {
		id := fmt.Sprintf("bench/%010d", i) // 16 bytes
		h, err := l.scheds.Intern("* * * * * *", "UTC", id)
		if err != nil {
			b.Fatal(err)
		}
		defs = append(defs, taskDef{id: id, hash: xxhash.Sum64String(id), part: 0, sched: h, prof: prof, paused: paused(i)})
		if len(defs) == cap(defs) {
			load()
		}
	}
	load()
}

// runBenchLoop runs l until the benchmark ends, then stops it and drains
// its pool.
func runBenchLoop(b *testing.B, l *loop, p *pool) (context.Context, chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
		close(p.quit)
		p.drain(time.Second)
	})
	return ctx, done
}
