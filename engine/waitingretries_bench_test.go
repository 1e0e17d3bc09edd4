package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardcron/shardcron/task"
)

// BenchmarkFailedBurst: every task of a burst fails (its downstream is
// down) and waits for its retry: what the loop spends on the completions,
// a batch of 64 a millisecond, publishing the waiting retries between
// batches as its run does (publishRetriesDue).
func BenchmarkFailedBurst(b *testing.B) {
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.maxAttempts, prof.backoff, prof.maxBackoff = "noop/retry3", 3, 10*time.Second, 10*time.Second
	benchBurst(b, prof, func(b *testing.B, tl *testLoop, jobs []job) {
		completeBurst(tl, jobs, statusFailed, "down")
	})
}

// BenchmarkSlowBurst: every task of a burst keeps its fires apart
// (buffer_one) and runs past the next second: the loop's time for that
// second's burst, each fire waiting for the running one, and for the
// completions of the first, a batch of 64 a millisecond, each starting
// the fire that waited, calling publishRetriesDue and openGate between
// batches as its run does: each waiting fire is published for the
// watermark writes, and most start at the gate, once a write etcd
// acknowledged no longer lists them (BENCHMARKS.md).
func BenchmarkSlowBurst(b *testing.B) {
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.concurrency = "noop/buffer", task.ConcurrencyBufferOne
	benchBurst(b, prof, func(b *testing.B, tl *testLoop, jobs []job) {
		tl.clock.Advance(time.Second)
		tl.dispatchAll()
		if len(tl.pending) != len(jobs) {
			b.Fatalf("%d fires wait for the %d running", len(tl.pending), len(jobs))
		}
		completeBurst(tl, jobs, statusOK, "")
	})
}

// benchBurst times timed, given a loop of 10 000 or 100 000 tasks of prof
// in 1 024 partitions, firing every second, and the jobs of a burst of
// them taken by workers.
func benchBurst(b *testing.B, prof *profile, timed func(b *testing.B, tl *testLoop, jobs []job)) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("tasks=%d", n), func(b *testing.B) {
			base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			for b.Loop() {
				b.StopTimer()
				tl := newTestLoop(b, base.Add(-time.Second/2), func(cfg *Config) {
					cfg.Partitions, cfg.Queue, cfg.BatchSize = 1024, 2*n, 1024
				})
				for p := range 1024 {
					ids := make([]string, 0, n/1024)
					for k := range n / 1024 {
						ids = append(ids, fmt.Sprintf("t-%d-%d", p, k))
					}
					tl.add(b, p, base.Add(-time.Second), prof, "* * * * * *", ids...)
				}
				for p := range 1024 {
					tl.setApplied(p, 10)
				}
				tl.clock.Advance(time.Second/2 + time.Millisecond)
				tl.dispatchAll()
				tl.pool.mu.Lock()
				jobs := make([]job, 0, n)
				for i := range tl.pool.queued() {
					jobs = append(jobs, *tl.pool.at(i))
				}
				tl.pool.mu.Unlock()
				tl.pool.reset()
				b.StartTimer()
				timed(b, tl, jobs)
			}
		})
	}
}

// completeBurst completes jobs with status st, a batch of 64 a
// millisecond, publishing and opening the gate between batches as the
// loop's run does, with a watermark write acknowledged every
// WatermarkInterval of the clock.
func completeBurst(tl *testLoop, jobs []job, st uint8, errMsg string) {
	var written int64
	for k := 0; k < len(jobs); k += 64 {
		var done completionBatch
		for i := k; i < min(k+64, len(jobs)); i++ {
			done.add(&jobs[i], st, errMsg, false)
		}
		tl.complete(&done)
		tl.clock.Advance(time.Millisecond)
		tl.publishRetriesDue()
		if now := tl.clock.Now().UnixNano(); now >= written+int64(tl.cfg.WatermarkInterval) {
			_, seq := tl.retryMarks.carriedAt()
			tl.acked.retries.Store(seq)
			written = now
		}
		tl.openGate()
	}
}
