package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"
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
