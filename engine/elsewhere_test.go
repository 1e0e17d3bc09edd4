package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/ring"
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

// A run past its release that ends while its node still closes (draining
// another run) has its marker deleted then, not with the node's lease at
// the end of Close: the next owner's fire buffered behind it starts when
// it ends. node-a runs buffered's and slow's fires of 12:00:01 (held) as
// it leaves; node-b buffers buffered's fire of 12:00:02 behind the marked
// run, and starts it once that run ends, while slow's run still holds
// node-a's Close.
func TestEngine_MarkerGoesWhenItsRunEndsWhileItsNodeStillCloses(t *testing.T) {
	c, clock := limitsStart(t)
	hx, hy := newHolder(t), newHolder(t)
	handler := func(ctx context.Context, f Fire) error {
		if hx.ids[f.TaskID] {
			return hx.handler(ctx, f)
		}
		return hy.handler(ctx, f)
	}
	start := func(id string) *testNode {
		n := startNodeOn(t, c.NewClient(t), "", handler, limitsNode(clock, time.Hour, id, func(cfg *Config) {
			cfg.Partitions = limitsPolicyParts
			cfg.DrainTimeout = time.Minute // slow's held run outlasts the test's waits
		}))
		t.Cleanup(hx.open) // again: cleanups run last first
		t.Cleanup(hy.open)
		return n
	}
	a, b := start("node-a"), start("node-b")
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return a.e.Stats().PartitionsOwned+b.e.Stats().PartitionsOwned == limitsPolicyParts
	})
	// ofA is a task id of node-a's partitions.
	ofA := func(name string) string {
		for i := 0; ; i++ {
			if id := fmt.Sprintf("%s-%d", name, i); a.e.owned[ring.Partition(id, limitsPolicyParts)].Load() {
				return id
			}
		}
	}
	buffered, slow := ofA("buffered"), ofA("slow")
	hx.ids[buffered], hy.ids[slow] = true, true
	for id, p := range map[string]task.ConcurrencyPolicy{buffered: task.ConcurrencyBufferOne, slow: task.ConcurrencyAllow} {
		tk := handlerTask(id, "* * * * * *")
		tk.Concurrency = p
		putTask(t, a.e.Registry(), tk)
		waitNext(t, a, id, limitsAt(1))
	}
	clock.Advance(time.Second)
	hx.next(t)
	hy.next(t)
	closed := closeInBackground(a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, buffered) })
	waitNext(t, b, buffered, limitsAt(2))
	clock.Advance(time.Second)
	select {
	case r := <-hx.started:
		t.Fatalf("started %s@%s on %s beside node-a's run of 12:00:01", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	case <-time.After(700 * time.Millisecond):
	}
	hx.open() // node-a's run of buffered ends; slow's still holds its Close
	if r := hx.next(t); r.Node != "node-b" || !r.ScheduledAt.Equal(limitsAt(2)) {
		t.Errorf("started %s@%s on %s, want buffered's fire of 12:00:02 on node-b", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	hy.open()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
}
