package engine

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// BenchmarkQuery measures Engine.Query on a node holding n every-second
// tasks, one in a hundred failing (and stale: no success for 10 s) and one
// in a hundred paused: one op is
// one query for the first page of 1000, which scans every record in
// chunks of queryChunk, the dispatch loop running meanwhile. Reported:
// ms/query and the matches found.
func BenchmarkQuery(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		for _, st := range []TaskStatus{StatusFailing, StatusPaused, StatusStale} {
			b.Run(fmt.Sprintf("tasks=%d/status=%s", n, st), func(b *testing.B) { benchQuery(b, n, st) })
		}
	}
}

func benchQuery(b *testing.B, n int, st TaskStatus) {
	clock := &shiftedClock{}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock.setNow(base.Add(-time.Second / 2))
	cfg := DefaultConfig("bench").withDefaults()
	cfg.Clock = clock
	start := clock.Now().UnixNano()
	stats := &stats{}
	notFenced := func() bool { return false }
	var acked atomic.Int64
	acked.Store(math.MaxInt64 / 2)
	p := newPool(cfg, nil, stats, notFenced, start)
	l, err := newLoop(cfg, schedule.NewTable(), p, newHolds(), stats, nil, notFenced, &acked, make(chan struct{}, 1), start)
	if err != nil {
		b.Fatal(err)
	}
	prof := &profile{key: "noop", exec: executor.Noop, noop: true, timeout: time.Minute, maxAttempts: 1,
		misfire: task.MisfireFireOnce, catchup: time.Minute, concurrency: task.ConcurrencyAllow}
	defs := make([]taskDef, 0, loadChunk)
	load := func() {
		l.handle(&loadCmd{part: 0, resume: base.UnixNano() - 1, defs: defs, first: true, done: make(chan struct{})})
		defs = defs[:0]
	}
	for i := range n {
		id := fmt.Sprintf("bench/%010d", i)
		h, err := l.scheds.Intern("* * * * * *", "UTC", id)
		if err != nil {
			b.Fatal(err)
		}
		defs = append(defs, taskDef{id: id, hash: xxhash.Sum64String(id), part: 0, sched: h, prof: prof, paused: i%100 == 1})
		if len(defs) == cap(defs) {
			load()
		}
	}
	load()
	for i := 0; i < n; i += 100 { // one in a hundred failing, and stale
		k, r, _ := l.tab.lookup(fmt.Sprintf("bench/%010d", i))
		l.outcome(k, r, base.UnixNano()-int64(time.Second), statusFailed, "boom")
		r.okAt, r.lastFire = unixSecs(base.UnixNano()-int64(10*time.Second)), base.UnixNano()-int64(time.Second)
	}
	clock.setNow(base.Add(-time.Second / 4)) // nothing due: the loop idles
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	defer func() {
		cancel()
		<-done
		close(p.quit)
		p.drain(time.Second)
	}()
	e := &Engine{loop: l, loopDone: done}
	var found int
	b.ResetTimer()
	for range b.N {
		ms, _, err := e.Query(ctx, StatusQuery{Status: st, Limit: registry.DefaultListLimit})
		if err != nil {
			b.Fatal(err)
		}
		found = len(ms)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/query")
	b.ReportMetric(float64(found), "matches")
}
