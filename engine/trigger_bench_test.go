package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/task"
)

// BenchmarkCheckedAnswers is the dispatch loop's cost of the answers of
// checkTriggers for n triggers waiting for them among the early triggers
// (an acquire that read n triggers older than its tasks' latest creation,
// from the cache), answered answer triggers a command: the loop goes
// through the early triggers of the tasks an answer names (earlyTriggers),
// where it went through all of them once an answer.
//
//	go test -run '^$' -bench CheckedAnswers -benchtime 3x ./engine/
func BenchmarkCheckedAnswers(b *testing.B) {
	const n = 100_000
	for _, answer := range []int{128, checkAnswer} {
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
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				tl.early = earlyTriggers{}
				for _, f := range fires {
					tl.early.add(f)
				}
				b.StartTimer()
				for batch := range slices.Chunk(fires, answer) {
					tl.handle(&checkedCmd{fires: batch, created: created, rev: 20})
				}
			}
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
	for range b.N {
		for i := range defs {
			tl.handle(&eventsCmd{part: 0, upserts: defs[i : i+1], rev: 20})
		}
	}
	b.StopTimer()
	if tl.early.len() != n {
		b.Fatalf("%d triggers early, want %d", tl.early.len(), n)
	}
}
