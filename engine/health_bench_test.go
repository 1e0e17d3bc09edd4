package engine

import (
	"fmt"
	"testing"
	"time"

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
		for _, st := range []task.Status{task.StatusFailing, task.StatusPaused, task.StatusStale} {
			b.Run(fmt.Sprintf("tasks=%d/status=%s", n, st), func(b *testing.B) { benchQuery(b, n, st) })
		}
	}
}

func benchQuery(b *testing.B, n int, st task.Status) {
	l, p, clock, base := newBenchLoop(b)
	loadNoopTasks(b, l, n, base, func(i int) bool { return i%100 == 1 })
	for i := 0; i < n; i += 100 { // one in a hundred failing, and stale
		k, r, _ := l.tab.lookup(fmt.Sprintf("bench/%010d", i))
		l.outcome(k, r, base.UnixNano()-int64(time.Second), statusFailed, "boom")
		r.okAt, r.lastFire = unixSecs(base.UnixNano()-int64(10*time.Second)), base.UnixNano()-int64(time.Second)
	}
	clock.setNow(base.Add(-time.Second / 4)) // nothing due: the loop idles
	ctx, done := runBenchLoop(b, l, p)
	e := &Engine{loop: l, loopDone: done}
	var found int
	b.ResetTimer()
	for range b.N {
		ms, _, _, err := e.Query(ctx, task.StatusQuery{Status: st, Limit: registry.DefaultListLimit})
		if err != nil {
			b.Fatal(err)
		}
		found = len(ms)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/query")
	b.ReportMetric(float64(found), "matches")
}
