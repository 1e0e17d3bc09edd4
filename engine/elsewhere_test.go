package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/task"
)

// A run elsewhere (a marker a former owner wrote at its release) counts as
// the task's run in flight: buffer_one holds its fire until the marker
// goes, replace deletes the marker and fires at once, and a release of the
// partition does not wait for it (it is not this node's: its marker stays
// for the next owner).
func TestLoop_RunElsewhereKeepsFiresApartAndIsNotWaitedFor(t *testing.T) {
	tl := newTestLoop(t, time.Date(2026, 1, 1, 12, 0, 0, 500e6, time.UTC), nil)
	var unmarked []string
	tl.unmark = func(keys []string) { unmarked = append(unmarked, keys...) }
	load := func(part int, id string, p task.ConcurrencyPolicy, marker string) {
		t.Helper()
		prof := noopProfile(task.MisfireFireOnce)
		prof.key, prof.concurrency = "elsewhere/"+string(p), p
		h, err := tl.scheds.Intern("* * * * * *", "UTC", id)
		if err != nil {
			t.Fatal(err)
		}
		tl.handle(&loadCmd{part: part, resume: tl.clock.Now().UnixNano(), first: true, done: make(chan struct{}),
			handed: handedTo{elsewhere: map[string][]string{id: {marker}}},
			defs:   []taskDef{{id: id, hash: xxhash.Sum64String(id), part: part, sched: h, prof: prof}}})
	}
	load(0, "buffered", task.ConcurrencyBufferOne, "m/buffered")
	load(1, "replaced", task.ConcurrencyReplace, "m/replaced")
	tl.clock.Advance(time.Second)
	tl.dispatch()
	if got := tl.dispatched(0); len(got) != 0 {
		t.Errorf("buffer_one fired %v beside its run elsewhere", got)
	}
	if n := tl.stats.runsElsewhere.Load(); n != 1 {
		t.Errorf("%d runs elsewhere counted once replace's was canceled, want buffered's", n)
	}
	if got, want := tl.dispatched(1), []string{"replaced@1767268801000"}; !slices.Equal(got, want) {
		t.Errorf("replace dispatched %v, want %v", got, want)
	}
	if !slices.Equal(unmarked, []string{"m/replaced"}) {
		t.Errorf("replace deleted markers %v, want its run elsewhere's", unmarked)
	}
	// A marker gone that the loop does not hold (another task's, or one
	// replaced) changes nothing.
	tl.handle(&elsewhereEndedCmd{part: 1, id: "replaced", key: "m/replaced"})
	tl.handle(&elsewhereEndedCmd{part: 0, id: "buffered", key: "m/other"})
	if got := tl.dispatched(0); len(got) != 0 {
		t.Errorf("buffer_one fired %v on another marker's end", got)
	}
	tl.handle(&elsewhereEndedCmd{part: 0, id: "buffered", key: "m/buffered"})
	if got, want := tl.dispatched(0), []string{"buffered@1767268801000"}; !slices.Equal(got, want) {
		t.Errorf("buffer_one dispatched %v once its run elsewhere ended, want %v", got, want)
	}

	load(0, "forbid", task.ConcurrencyForbid, "m/forbid")
	if n := tl.stats.runsElsewhere.Load(); n != 1 {
		t.Errorf("%d runs elsewhere counted, want forbid's", n)
	}
	// buffered's own fire, dispatched, is this node's to wait for; forbid's
	// run elsewhere is not.
	if rel := tl.releaseNow(0); rel.running == nil || rel.running.n != 1 || tl.pool.leaving.len() != 1 {
		t.Errorf("the release waits for %+v of %d tasks, want buffered's one attempt", rel.running, tl.pool.leaving.len())
	}
	if n := tl.stats.runsElsewhere.Load(); n != 0 {
		t.Errorf("%d runs elsewhere counted after the release, want none", n)
	}
}
