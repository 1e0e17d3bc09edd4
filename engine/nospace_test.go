package engine

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/task"
)

// TestEngine_FiresOnThroughNoSpace: while etcd's NOSPACE alarm refuses the
// node's watermark, nobody can take a partition over, so the node fires on
// past its bounded lead instead of stopping every task it owns; once the
// alarm is cleared it records its watermark again. No fire is missed or
// repeated across the alarm.
func TestEngine_FiresOnThroughNoSpace(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	fires := newFireLog()
	n := startNode(t, c, "", fires.handler, nil)
	defer n.stop(t)
	putTask(t, n.e.Registry(), handlerTask("every", "* * * * * *"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(fires.forTask("every")) >= 1 })

	c.RaiseNoSpace(t)
	raised := time.Now()
	// Three seconds is three times the lead: a node held to its lead by
	// the unrecorded watermark would have stopped well before.
	firedAfter := func(at time.Time) bool {
		return slices.ContainsFunc(fires.forTask("every"), func(s time.Time) bool { return s.After(at) })
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return firedAfter(raised.Add(3 * time.Second)) })
	if !n.e.acked.noSpace.Load() {
		t.Error("the refused watermark write was not taken for NOSPACE")
	}

	c.ClearNoSpace(t)
	cleared := time.Now()
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return !n.e.acked.noSpace.Load() && n.e.acked.at.Load() > cleared.UnixNano()
	})
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return firedAfter(cleared.Add(time.Second)) })

	if d := fires.duplicates(); len(d) > 0 {
		t.Errorf("fired twice: %v", d)
	}
	got := fires.forTask("every")
	for i := 1; i < len(got); i++ {
		if gap := got[i].Sub(got[i-1]); gap != time.Second {
			t.Errorf("fire %d at %v follows %v: a gap of %v, want 1s", i, got[i], got[i-1], gap)
		}
	}
}

// The lead is lifted only while the latest refused watermark write was
// refused for NOSPACE: a node cut off from etcd during the alarm pauses at
// the lead again, as any node whose writes fail, instead of firing on
// without a bound until it fences itself.
func TestEngine_CutOffDuringNoSpacePausesAtTheLead(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	proxy := c.NewProxy(t)
	fires := newFireLog()
	n := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", fires.handler, nil)
	defer n.stop(t)
	putTask(t, n.e.Registry(), handlerTask("every", "* * * * * *"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(fires.forTask("every")) >= 1 })

	c.RaiseNoSpace(t)
	defer c.ClearNoSpace(t)
	etcdtest.WaitFor(t, 10*time.Second, n.e.acked.noSpace.Load)
	proxy.Cut()
	defer proxy.Restore()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !n.e.acked.noSpace.Load() })
}

// TestLoop_DispatchBehindAWheelThatRanPastTheLeadGoesOn: while the lead is
// lifted (NOSPACE) the wheel may run more than Lead past the dispatch
// point, which a fire armed into the past (a partition taken from a resume
// point behind the wheel's clock) holds back while every batch is cut.
// Once the alarm clears, acked is that dispatch point and acked+Lead lies
// behind the wheel's clock: dispatch must still release what is armed at
// or before the clock, or the dispatch point, and the watermark with it,
// never moves again and the node stops firing for good (what the NOSPACE
// chaos scenarios caught).
func TestLoop_DispatchBehindAWheelThatRanPastTheLeadGoesOn(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, func(c *Config) { c.Lead = time.Second })
	tl.acked.at.Store(base.UnixNano())
	tl.acked.noSpace.Store(true)
	prof := noopProfile(task.MisfireFireAll)
	tl.add(t, 0, base, prof, "* * * * * *", ids("own", 15)...)
	tl.clock.Advance(4 * time.Second)
	for tl.wheel.Now() < base.Add(2*time.Second).UnixNano() {
		tl.dispatch()
	}
	tl.add(t, 1, base, prof, "* * * * * *", ids("taken", 15)...)
	// Every batch is cut (15 fires a second, 10 a batch) until the wheel
	// is 4 s on, and the fire armed at +1s holds the dispatch point.
	for tl.wheel.Now() < base.Add(4*time.Second).UnixNano() {
		if !tl.dispatch() {
			t.Fatal("a batch was not cut: the test no longer holds the dispatch point back")
		}
	}
	if gap := tl.wheel.Now() - tl.through; gap <= int64(tl.cfg.Lead) {
		t.Fatalf("the dispatch point trails the wheel by %v, not more than the lead: the test sets up nothing", time.Duration(gap))
	}

	// The alarm clears: etcd records the dispatch point, every interval.
	tl.acked.noSpace.Store(false)
	for range 20 {
		tl.acked.at.Store(tl.through)
		for tl.dispatch() {
		}
	}
	if got := tl.dispatched(1); len(got) != 15*4 {
		t.Errorf("the taken partition dispatched %d fires, want 60 (15 tasks at +1s..+4s): %v", len(got), got)
	}
	if got := tl.dispatched(0); len(got) != 15*4 {
		t.Errorf("the own partition dispatched %d fires, want 60 (15 tasks at +1s..+4s)", len(got))
	}
	if w, want := time.Unix(0, tl.through), base.Add(4*time.Second); w.Before(want) {
		t.Errorf("the dispatch point is stuck at %v, behind the wheel's clock %v", w, want)
	}
}

// A session fenced while NOSPACE refused its last write leaves the lead
// lifted to nobody: the node's next session runs within the lead until a
// write of its own is refused. (The cut keeps the node from joining again.)
func TestEngine_FencedDuringNoSpaceLiftsTheLeadNoMore(t *testing.T) {
	c := etcdtest.Start(t)
	proxy := c.NewProxy(t)
	n := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", nil, nil)
	defer n.stop(t)

	c.RaiseNoSpace(t)
	defer c.ClearNoSpace(t)
	etcdtest.WaitFor(t, 10*time.Second, n.e.acked.noSpace.Load)
	proxy.Cut()
	defer proxy.Restore()
	n.e.sess.Load().Lost()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !n.e.acked.noSpace.Load() })
}

// A node that leaves while etcd's NOSPACE alarm refuses its releases says
// so in a line a round, not a line for each partition and each try.
func TestEngine_RefusedReleasesLoggedOnceARound(t *testing.T) {
	c := etcdtest.Start(t)
	var buf logbuf.Buffer
	n := startNode(t, c, "", nil, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	parts := n.e.cfg.Partitions
	c.RaiseNoSpace(t)
	defer c.ClearNoSpace(t)
	n.stop(t)
	lines := strings.Count(buf.String(), `msg="writing release checkpoints failed"`)
	// The release, then its one retry as the session ends.
	if lines < 1 || lines > 2 {
		t.Errorf("%d lines for the refused releases, want 1 or 2:\n%s", lines, buf.String())
	}
	if !strings.Contains(buf.String(), fmt.Sprintf("partitions=0-%d count=%d err=", parts-1, parts)) {
		t.Errorf("no line counts the %d refused partitions:\n%s", parts, buf.String())
	}
}
