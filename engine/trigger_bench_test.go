package engine

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/internal/cputime"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// BenchmarkCheckedAnswers is the dispatch loop's cost of the answers of
// checkTriggers for n triggers waiting for them among the early triggers
// (an acquire that read n triggers older than its tasks' latest creation,
// from the cache), answered answer triggers a command: a transaction's
// read, as checkTriggers answers, or 64 of them, as it did while the loop
// went through all its early triggers once an answer. It goes through
// the early triggers of the tasks an answer names (earlyTriggers): the
// two cost about as much in all, and the loop's time for an answer is
// that over the answers.
//
//	go test -run '^$' -bench CheckedAnswers -benchtime 3x ./engine/
func BenchmarkCheckedAnswers(b *testing.B) {
	const n = 100_000
	for _, answer := range []int{registry.MaxTxnOps, 64 * registry.MaxTxnOps} {
		b.Run(fmt.Sprintf("triggers=%d/answer=%d", n, answer), func(b *testing.B) {
			base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			tl := newTestLoop(b, base, nil)
			tl.parts[0].owned = true
			fires := make([]triggerFire, n)
			for i := range fires {
				fires[i] = triggerFire{part: 0, id: fmt.Sprintf("t%06d", i), at: base.UnixNano() + int64(i), rev: 10, checking: true}
			}
			created := make(map[string]int64, n)
			for _, f := range fires {
				created[f.id] = 5 // before its key: the trigger stands, its task not here
			}
			var cpu time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				tl.early = earlyTriggers{}
				for _, f := range fires {
					tl.early.add(f)
				}
				b.StartTimer()
				cpu += loopCPU(func() {
					for batch := range slices.Chunk(fires, answer) {
						tl.handle(&checkedCmd{fires: batch, created: created, rev: 20})
					}
				})
			}
			reportLoopCPU(b, cpu)
		})
	}
}

// BenchmarkChangesBehindEarlyTriggers is the dispatch loop's cost of a
// partition's changes while n triggers wait among the early triggers for
// the reads of their tasks' creations (an acquire from the cache with a
// bulk trigger pending): one op is 100 changes, each of one task none of
// them names, as the partition's watch brings them.
//
//	go test -run '^$' -bench ChangesBehindEarlyTriggers -count 6 ./engine/
func BenchmarkChangesBehindEarlyTriggers(b *testing.B) {
	const n, changes = 100_000, 100
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(b, base, nil)
	tl.parts[0].owned = true
	for i := range n {
		tl.early.add(triggerFire{part: 0, id: fmt.Sprintf("t%06d", i), at: base.UnixNano() + int64(i), rev: 10, checking: true})
	}
	prof := noopProfile(task.MisfireFireOnce)
	defs := make([]taskDef, changes)
	for i := range defs {
		id := fmt.Sprintf("c%03d", i)
		h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", id)
		if err != nil {
			b.Fatal(err)
		}
		defs[i] = taskDef{id: id, hash: xxhash.Sum64String(id), sched: h, prof: prof}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := loopCPU(func() {
		for range b.N {
			for i := range defs {
				tl.handle(&eventsCmd{part: 0, upserts: defs[i : i+1], rev: 20})
			}
		}
	})
	b.StopTimer()
	reportLoopCPU(b, cpu)
	if tl.early.len() != n {
		b.Fatalf("%d triggers early, want %d", tl.early.len(), n)
	}
}

// BenchmarkTriggerPath is the dispatch loop's cost of a bulk trigger of
// 100 000 tasks, from the trigger watch's responses (1 000 triggers each)
// to the fires' ends (64 a completion batch) and the sweep that forgets
// them past triggerWait: the loop remembers each trigger
// (loop.triggered) from its fire to that sweep. Workers take nothing: the
// benchmark takes the fires off the queue as they would.
//
//	go test -run '^$' -bench TriggerPath -benchtime 3x ./engine/
func BenchmarkTriggerPath(b *testing.B) {
	const n, resp = 100_000, 1_000
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prof := noopProfile(task.MisfireFireOnce)
	b.ReportAllocs()
	var cpu time.Duration
	for range b.N {
		b.StopTimer()
		tl := newTestLoop(b, base, func(cfg *Config) { cfg.Queue = n })
		tasks := ids("t", n)
		tl.add(b, 0, base, prof, "0 0 0 1 1 *", tasks...)
		fires := make([]triggerFire, n)
		for i, id := range tasks {
			fires[i] = triggerFire{part: 0, id: id, at: base.Add(time.Millisecond).UnixNano(), rev: int64(10 + i)}
		}
		b.StartTimer()
		cpu += loopCPU(func() {
			for chunk := range slices.Chunk(fires, resp) {
				tl.handle(&triggersCmd{fires: chunk, reply: make(chan struct{}, 1)})
			}
		})
		jobs := make([]job, 0, n)
		tl.pool.mu.Lock()
		for i := range tl.pool.queued() {
			jobs = append(jobs, *tl.pool.at(i))
		}
		tl.pool.mu.Unlock()
		tl.pool.reset()
		if len(jobs) != n {
			b.Fatalf("%d fires queued, want %d", len(jobs), n)
		}
		dones := make([]completionBatch, 0, n/chunkMax+1)
		for chunk := range slices.Chunk(jobs, chunkMax) {
			var done completionBatch
			for i := range chunk {
				done.add(&chunk[i], statusOK, "", false)
			}
			dones = append(dones, done)
		}
		cpu += loopCPU(func() {
			for i := range dones {
				tl.complete(&dones[i])
			}
			tl.clock.Advance(triggerWait + time.Second)
			tl.sweepTriggers()
		})
		if len(tl.triggered) != 0 {
			b.Fatalf("%d triggers remembered after the sweep, want none", len(tl.triggered))
		}
	}
	reportLoopCPU(b, cpu)
}

// loopCPU runs f, the dispatch loop's part of a benchmark, on a thread of
// its own, and returns the CPU time it took (cputime.Thread).
func loopCPU(f func()) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := cputime.Thread()
	f()
	return cputime.Thread() - start
}

// reportLoopCPU reports cpu, the loop's CPU time over b.N ops, as
// loop-cpu-ms/op: what the loop spends, whatever else the machine runs.
func reportLoopCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "loop-cpu-ms/op")
}
