package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/task"
)

// A delete and a put again under the same id that a reload after a
// compaction reads reach the loop as one put, of a task created after
// the changes the loop armed: the record it holds is of the task before,
// deleted since, whose retries are not the new task's. Taken for an edit,
// the record kept its generation, and the retry waiting for its backoff,
// or that of the attempt under way, ran the new task.
func TestLoop_PutAgainDeliveredWithItsDeleteTakesNoRetryOfTheTaskBefore(t *testing.T) {
	for _, running := range []bool{false, true} {
		t.Run(fmt.Sprintf("attempt_under_way=%t", running), func(t *testing.T) {
			base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
			tl := newTestLoop(t, base, nil)
			h, err := tl.scheds.Intern("1 0 12 1 1 *", "UTC", "x") // base+1s, then a year on
			if err != nil {
				t.Fatal(err)
			}
			prof := noopProfile(task.MisfireFireOnce)
			prof.maxAttempts, prof.backoff, prof.maxBackoff = 2, time.Minute, time.Minute
			def := taskDef{id: "x", hash: xxhash.Sum64String("x"), sched: h, prof: prof, createRev: 5}
			tl.handle(&loadCmd{part: 0, resume: base.UnixNano(), rev: 10, created: 5, defs: []taskDef{def}, first: true, done: make(chan struct{})})
			tl.clock.Advance(time.Second)
			tl.dispatchAll()
			attempt := tl.takeQueued()
			if !running {
				tl.end(attempt, statusFailed) // its retry waits for its backoff
			}
			again := def
			again.createRev = 20 // deleted at 19, put again at 20
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{again}, rev: 20, created: 20})
			if running {
				tl.end(attempt, statusFailed)
			}
			tl.clock.Advance(2 * time.Minute)
			tl.dispatchAll()
			if got := tl.dispatched(0); len(got) != 0 {
				t.Errorf("dispatched %v, want nothing: the retry is of the task before x was put again", got)
			}
		})
	}
}
