package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

// TestEngine_FiresOnThroughNoSpace: while etcd's NOSPACE alarm refuses the
// node's watermark, nobody can take a partition over, so the node fires on
// past its bounded lead instead of stopping every task it owns; once the
// alarm is cleared it records its watermark again. No fire is missed or
// repeated across the alarm.
func TestEngine_FiresOnThroughNoSpace(t *testing.T) {
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
