package engine

import (
	"testing"
	"time"

	"github.com/shardcron/shardcron/task"
)

// A node that fenced itself rejoins with its wheel's clock where the fence
// stopped it, minutes behind after an etcd outage, and with the watermark
// its old session recorded then. The lead let that clock run Lead past
// each acknowledgement, one watermark interval at a time, so the node took
// a tenth of the outage to reach now (Lead 1 s per 100 ms write): the
// partitions it took back fired nothing meanwhile while it reported ready
// (18 s after a 3 min outage, in a 3-node drill). No timer lies in the
// span, so running the clock over it releases nothing: the node must fire
// on time, at once, and still release no fire past acked + Lead.
func TestLoop_IdleWheelBehindAFenceCatchesUpAtOnce(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, func(c *Config) { c.Lead = time.Second })
	tl.acked.at.Store(base.UnixNano()) // the old session's last watermark
	outage := 3 * time.Minute
	tl.clock.Advance(outage + 600*time.Millisecond)

	// A partition handed over by another node, which fired it until now.
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, tl.clock.Now().Add(-500*time.Millisecond), prof, "* * * * * *", ids("p", 5)...)
	due := base.Add(outage + time.Second) // the first fire after the hand-over

	// Nothing is due yet; the clock may run up to the first fire, no further.
	for tl.dispatch() {
	}
	if got := tl.dispatched(0); len(got) != 0 {
		t.Fatalf("dispatched %v before its time", got)
	}
	if got := time.Unix(0, tl.wheel.Now()); !got.Before(due) {
		t.Fatalf("the wheel ran to %v, past the first fire at %v", got, due)
	}

	// The fire is due 100 ms ago; the old watermark is still the last one
	// acknowledged: the fire waits for an acknowledgement of the idle span.
	tl.clock.Advance(500 * time.Millisecond)
	for tl.dispatch() {
	}
	if got := tl.dispatched(0); len(got) != 0 {
		t.Fatalf("dispatched %v more than the lead past the acknowledged watermark", got)
	}
	// Two watermark writes: the span, then the fire.
	for range 2 {
		tl.acked.at.Store(tl.through)
		for tl.dispatch() {
		}
	}
	if got := tl.dispatched(0); len(got) != 5 {
		t.Fatalf("after two watermark writes dispatched %d fires, want the 5 due at %v (wheel at %v)",
			len(got), due, time.Unix(0, tl.wheel.Now()).UTC())
	}
}
