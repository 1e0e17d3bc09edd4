package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// TestEngine_Capture runs a failing and a succeeding fire of tasks with
// capture on failure, capture always and no capture, and checks which
// execution records carry the output, bounded by max_bytes.
func TestEngine_Capture(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 500e6, time.UTC)
	at := func(s int) time.Time { return time.Date(2026, 1, 1, 12, 0, s, 0, time.UTC) }
	clock := newTestClock(t0, 0)
	h := func(_ context.Context, f Fire) error {
		if f.Output != nil {
			fmt.Fprintf(f.Output, "output of %s at %d: 0123456789", f.TaskID, f.ScheduledAt.Unix()%60)
		}
		if f.ScheduledAt.Equal(at(10)) {
			return errors.New("boom")
		}
		return nil
	}
	n := startNode(t, c, "", h, clockTweak(clock, time.Hour, nil))
	reg := n.e.Registry()
	onFailure := handlerTask("cap/failure", "@every 10s")
	onFailure.Capture = &task.Capture{MaxBytes: 24}
	always := handlerTask("cap/always", "@every 10s")
	always.Capture = &task.Capture{MaxBytes: 4096, On: task.CaptureAlways}
	ids := []string{"cap/failure", "cap/always", "cap/none"}
	putTask(t, reg, onFailure)
	putTask(t, reg, always)
	putTask(t, reg, handlerTask("cap/none", "@every 10s"))
	for _, id := range ids {
		waitNext(t, n, id, at(10))
	}
	clock.Advance(10 * time.Second) // :10 fails
	clock.Advance(10 * time.Second) // :20 succeeds
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		for _, id := range ids {
			if len(history(t, n, id)) < 2 {
				return false
			}
		}
		return true
	})
	want := map[string][2]string{ // outputs of the fires at :10 (failed) and :20 (ok)
		"cap/failure": {"output of cap/failure at", ""},
		"cap/always":  {"output of cap/always at 10: 0123456789", "output of cap/always at 20: 0123456789"},
		"cap/none":    {"", ""},
	}
	for _, id := range ids {
		hs := history(t, n, id)
		for k, e := range hs[:2] {
			if e.Output != want[id][k] {
				t.Errorf("%s, fire %d (%s): output %q, want %q", id, k, e.Status, e.Output, want[id][k])
			}
		}
	}
	// The failure log of GET /v1/failures carries it too.
	for _, f := range n.e.RecentFailures(10) {
		if f.TaskID == "cap/failure" && f.Output != want["cap/failure"][0] {
			t.Errorf("recent failure of cap/failure: output %q", f.Output)
		}
	}
}
