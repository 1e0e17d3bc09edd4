package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// Hurry during a Close cuts the drain short: an execution still running
// is canceled as at DrainTimeout, and Close returns without waiting it out.
func TestEngine_HurryCutsTheDrain(t *testing.T) {
	c := etcdtest.Start(t)
	started, ended := make(chan struct{}, 1), make(chan error, 1)
	h := func(ctx context.Context, f Fire) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done() // runs until canceled
		select {
		case ended <- context.Cause(ctx):
		default:
		}
		return ctx.Err()
	}
	n := startNode(t, c, "", h, func(cfg *Config) { cfg.Partitions = 4; cfg.DrainTimeout = time.Hour })
	defer n.stop(t)
	putTask(t, n.e.Registry(), handlerTask("slow", "* * * * * *"))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the task never ran")
	}
	closed := make(chan error, 1)
	go func() { closed <- n.e.Close() }()
	n.e.Hurry()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Close still draining 60s after Hurry, with a drain timeout of 1h")
	}
	// The cause says why, for the executors to record: an http attempt's
	// said only "http: context canceled".
	if err := <-ended; !errors.Is(err, errStopped) {
		t.Errorf("the running execution was canceled for %v, want %v", err, errStopped)
	}
	// Its record says so too, though the handler returned ctx.Err() alone:
	// an attempt the stop canceled with attempts left is retried.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(history(t, n, "slow")) > 0 })
	for _, e := range history(t, n, "slow") {
		if e.Status != task.ExecutionCanceled || !strings.Contains(e.Error, errStopped.Error()) {
			t.Errorf("slow's attempt of %s recorded %s (%s), want canceled for %q", e.ScheduledAt.Format(time.TimeOnly), e.Status, e.Error, errStopped)
		}
	}
}
