package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// TestEngine_HistoryLimit: a task's history_limit reaches the store
// through the partition load and the worker pool: the node keeps its last
// 2 successes and last 1 failure, counted apart, while a task without one
// keeps the store's default.
func TestEngine_HistoryLimit(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	clock := newTestClock(time.Date(2030, 1, 1, 0, 0, 0, 500_000_000, time.UTC), 20) // 20 s per second
	n := startNode(t, c, "", nil, clockTweak(clock, time.Hour, nil))
	fired := map[string]int{}
	done := make(chan struct{})
	calls := make(chan string, 1024)
	n.e.Handle("h", func(_ context.Context, f Fire) error {
		select {
		case calls <- f.TaskID:
		case <-done:
		}
		if f.ScheduledAt.Unix()%3 == 0 {
			return errors.New("every third second fails")
		}
		return nil
	})
	t.Cleanup(func() { close(done) })
	limited := handlerTask("limited", "* * * * * *")
	limited.HistoryLimit = &task.HistoryLimit{Successes: new(2), Failures: new(1)}
	putTask(t, n.e.Registry(), limited)
	putTask(t, n.e.Registry(), handlerTask("default", "* * * * * *"))

	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		for {
			select {
			case id := <-calls:
				fired[id]++
			default:
				return fired["limited"] >= 15 && fired["default"] >= 15
			}
		}
	})
	count := func(id string) (ok, failed int) {
		for _, e := range history(t, n, id) {
			if e.Status == "ok" {
				ok++
			} else {
				failed++
			}
		}
		return ok, failed
	}
	// A worker records a fire once its handler returned, after the call
	// counted above: wait until the records of 15 fires are in too.
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		lok, lfailed := count("limited")
		dok, dfailed := count("default")
		return lok >= 2 && lfailed >= 1 && dok >= 10 && dfailed >= 5
	})
	if ok, failed := count("limited"); ok != 2 || failed != 1 {
		t.Errorf("limited: %d successes and %d failures kept, want 2 and 1", ok, failed)
	}
	// 15 fires, a third failing: at least 10 successes and 5 failures.
	if ok, failed := count("default"); ok != 10 || failed < 5 || failed > 10 {
		t.Errorf("default: %d successes and %d failures kept, want 10 and 5-10", ok, failed)
	}
}

// TestEngine_HistoryAnswersTheLimitsOfNow: a node restarted with lower
// limits (--history-success-limit 15, then 10) answers at most as many
// records of a task as the limits say now, before the task fires again,
// which one firing rarely, or owned by another node since, may never do
// there: the node's limit for a task without a history_limit of its own
// or deleted, the task's own otherwise, above the node's.
func TestEngine_HistoryAnswersTheLimitsOfNow(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	dir := t.TempDir()
	before := store.DefaultConfig(dir)
	before.HistorySuccessLimit = 15
	st, err := store.Open(before)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, id := range []string{"default", "own", "deleted"} {
		for i := range 15 {
			st.Record(task.Execution{TaskID: id, ScheduledAt: at.Add(time.Duration(i) * time.Minute), Attempt: 1, Node: "node-1", Status: task.ExecutionOK})
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	n := startNode(t, c, dir, nil, nil) // the store's default limit: 10
	own := handlerTask("own", "0 0 0 1 1 *")
	own.HistoryLimit = &task.HistoryLimit{Successes: new(12)}
	putTask(t, n.e.Registry(), own)
	putTask(t, n.e.Registry(), handlerTask("default", "0 0 0 1 1 *"))
	for id, want := range map[string]int{"default": store.DefaultSuccessLimit, "own": 12, "deleted": store.DefaultSuccessLimit} {
		if got := len(history(t, n, id)); got != want {
			t.Errorf("%s: %d records, want %d", id, got, want)
		}
	}

	// etcd out of reach: the limits of now are not known, and the answer
	// holds every record kept rather than none.
	c.Members[0].Stop()
	hs, err := n.e.History(context.Background(), "own", 0) // a request without a deadline of its own
	if err != nil || len(hs) != 15 {
		t.Errorf("own, etcd out of reach: %d records (%v), want the 15 kept", len(hs), err)
	}
}
