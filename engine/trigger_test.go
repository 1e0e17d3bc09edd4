package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// trigger hands the loop a trigger of task id at at, as the trigger
// watch does.
func (tl *testLoop) trigger(part int, id string, at time.Time) {
	c := &triggersCmd{fires: []triggerFire{{part: part, id: id, at: at.UnixNano()}}, reply: make(chan struct{}, 1)}
	tl.handle(c)
	<-c.reply
}

// pendingTriggers counts the trigger keys in etcd (-1: etcd did not
// answer).
func pendingTriggers(c *etcdtest.Cluster) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Client.Get(ctx, DefaultPrefix+"/triggers/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return -1
	}
	return r.Count
}

// A node that fences itself drops its queued fires unrun, for the next
// owner to fire. A trigger's key is its only record: here node-a's only
// worker is held, a trigger of "once" waits in its queue, and node-a is cut
// off. node-b takes the partition over after node-a's lease ends and must
// fire it. The key used to be deleted once the loop had queued the fire:
// nobody ever fired it.
func TestEngine_TriggerQueuedAtTheFenceIsFiredByTheNextOwner(t *testing.T) {
	c, clock := limitsStart(t)
	log := &callLog{}
	h := newHolder(t, "slow")
	handler := log.handler(h.handler)
	proxy := c.NewProxy(t)
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", handler, limitsNode(clock, time.Hour, "node-a", func(cfg *Config) {
		cfg.Workers, cfg.DrainTimeout = 1, time.Second
	}))
	putTask(t, a.e.Registry(), handlerTask("slow", "0 0 0 1 1 *")) // yearly: only triggers fire them
	putTask(t, a.e.Registry(), handlerTask("once", "0 0 0 1 1 *"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "slow") && owns(a, "once") })

	if _, err := a.e.Registry().Trigger(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	h.next(t) // node-a's only worker is busy
	if _, err := a.e.Registry().Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return a.e.pool.depth() == 1 }) // queued behind the held worker

	crash(t, a, proxy) // cut off: node-a fences and drops its queue
	t.Cleanup(h.open)
	b := startNode(t, c, "", handler, limitsNode(clock, time.Hour, "node-b"))
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(b, "once") })
	h.open()

	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("once")) > 0 })
	time.Sleep(300 * time.Millisecond) // a repeat, if any
	if calls := log.of("once"); len(calls) != 1 || calls[0].Node != "node-b" {
		t.Errorf("the trigger of once ran %d times (%v); want once, on node-b", len(calls), calls)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })
	b.stop(t)
	a.stop(t)
}

// A graceful release hands its unrun triggers over with their overrides:
// one queued behind a running fire's worker, and one buffered behind a
// running fire (buffer_one). Each runs once on the next owner, with its
// body or payload.
func TestEngine_TriggersHandedOverUnrunRunOnceWithTheirOverrides(t *testing.T) {
	c, clock := limitsStart(t)
	log := &callLog{}
	h := newHolder(t, "slow")
	handler := log.handler(h.handler)
	a := startNode(t, c, "", handler, limitsNode(clock, time.Hour, "node-a", func(cfg *Config) {
		cfg.Workers, cfg.DrainTimeout = 1, time.Minute
	}))
	slow := handlerTask("slow", "0 0 0 1 1 *") // yearly: only triggers fire them
	slow.Concurrency = task.ConcurrencyBufferOne
	putTask(t, a.e.Registry(), slow)
	putTask(t, a.e.Registry(), handlerTask("queued", "0 0 0 1 1 *"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "slow") && owns(a, "queued") })
	reg := a.e.Registry()
	ctx := context.Background()
	if _, err := reg.Trigger(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	h.next(t) // node-a's only worker is busy
	payload := func(s string) *task.Override { return &task.Override{Payload: []byte(`"` + s + `"`)} }
	if _, err := reg.TriggerWith(ctx, "slow", payload("buffered")); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.TriggerWith(ctx, "queued", payload("queued")); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return a.e.pool.depth() == 1 && inLoop(t, a, func(l *loop) bool { return len(l.pending) == 1 })
	})

	closed := make(chan error, 1)
	ea := a.e
	go func() { closed <- ea.Close() }() // the release hands both over; Close waits for the held run
	b := startNode(t, c, "", handler, limitsNode(clock, time.Hour, "node-b"))
	t.Cleanup(h.open)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return len(log.of("queued")) > 0 && len(log.of("slow")) > 1 })
	h.open()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // a repeat, if any
	var got []string
	for _, id := range []string{"slow", "queued"} {
		for _, c := range log.of(id) {
			got = append(got, fmt.Sprintf("%s:%s:%s", id, c.Node, c.Payload))
		}
	}
	slices.Sort(got)
	want := []string{`queued:node-b:"queued"`, "slow:node-a:", `slow:node-b:"buffered"`}
	if !slices.Equal(got, want) {
		t.Errorf("runs %q, want %q", got, want)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })
	b.stop(t)
}

// A release waits for the deletes of the triggers that started here
// before it commits: the next owner fires every key it finds. Here etcd
// refuses node-a's trigger deletes for 3 s after its trigger ran, while
// node-b joins and node-a leaves.
func TestEngine_ReleaseWaitsForTheDeletesOfStartedTriggers(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	cliA := c.NewClient(t)
	faults := injectFaults(cliA)
	a := startNodeOn(t, cliA, "", log.handler, func(c *Config) { c.Partitions = 4; c.Logger = quietLogger() })
	putTask(t, a.e.Registry(), handlerTask("once", "0 0 1 1 *"))
	faults.deletes(triggerKeys)
	if _, err := a.e.Registry().Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("once")) == 1 })
	time.AfterFunc(3*time.Second, func() { faults.deletes(nil) })
	b := startNode(t, c, "", log.handler, func(c *Config) { c.Partitions = 4; c.NodeID = "node-b" })
	a.stop(t)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })
	time.Sleep(500 * time.Millisecond) // a late repeat, if any
	b.stop(t)
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("the trigger fired again after a hand-over: %v", d)
	}
}

// A trigger that ends without running deletes its key too: skipped by
// forbid, or its task deleted while it waited for a worker or behind a
// running fire. Left behind, a key fires at its partition's next acquire.
func TestEngine_TriggersEndedUnrunDeleteTheirKeys(t *testing.T) {
	c := etcdtest.Start(t)
	h := newHolder(t, "forbid", "buffer")
	n := startNode(t, c, "", h.handler, func(cfg *Config) { cfg.Workers = 2 })
	t.Cleanup(h.open)
	reg := n.e.Registry()
	ctx := context.Background()
	for id, p := range map[string]task.ConcurrencyPolicy{
		"forbid": task.ConcurrencyForbid, "buffer": task.ConcurrencyBufferOne, "queued": task.ConcurrencyAllow,
	} {
		tk := handlerTask(id, "0 0 1 1 *") // yearly: only triggers fire them
		tk.Concurrency = p
		putTask(t, reg, tk)
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(n, id) })
	}
	trigger := func(id string) {
		t.Helper()
		if _, err := reg.Trigger(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	trigger("forbid")
	trigger("buffer")
	h.next(t)
	h.next(t) // both workers are busy

	trigger("forbid") // skipped
	trigger("buffer") // buffered
	trigger("queued") // queued for a worker
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return n.e.pool.depth() == 1 && inLoop(t, n, func(l *loop) bool { return len(l.pending) == 1 })
	})
	for _, id := range []string{"buffer", "queued"} {
		if err := reg.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })
}

// The loop forgets the triggers of a partition it releases: queued,
// buffered or early, their keys stay for the next owner, and should this
// node own the partition again, it fires them from those keys. It used to
// remember them as fired for triggerWait, and took them for repeats.
func TestLoop_ReleasedTriggersFireWhenThePartitionComesBack(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	trigger := func(id string) { tl.trigger(0, id, base) }
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "queued") // yearly: only triggers fire it
	trigger("queued")
	trigger("early") // its task is not loaded
	tl.handOverQueued(tl.releaseNow(0).hand)
	if got := tl.dispatched(0); len(got) != 0 {
		t.Fatalf("dispatched %v before the release", got)
	}

	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "queued", "early")
	trigger("queued")
	trigger("early")
	want := []string{fmt.Sprintf("early@%d", base.UnixMilli()), fmt.Sprintf("queued@%d", base.UnixMilli())}
	got := tl.dispatched(0)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("owned again, the loop dispatched %v, want %v", got, want)
	}
}

// flush returns once the keys queued before it are deleted, not before.
func TestTriggerEnds_FlushWaitsForTheKeysQueuedBefore(t *testing.T) {
	q := newTriggerEnds()
	q.add(triggerKey{0, "a", 1})
	q.add(triggerKey{0, "b", 1})
	flushed := make(chan error, 1)
	go func() { flushed <- q.flush(context.Background()) }()
	q.done(1)
	select {
	case <-flushed:
		t.Fatal("flush returned with a key queued before it left")
	case <-time.After(50 * time.Millisecond):
	}
	q.add(triggerKey{0, "c", 1}) // after the flush began: not waited for
	q.done(1)
	select {
	case err := <-flushed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("flush did not return once the keys queued before it were deleted")
	}
	if got := q.next(10); len(got) != 1 || got[0].id != "c" {
		t.Errorf("queued %v, want c", got)
	}
}

// An early trigger whose task never came gives up after triggerWait, and
// its key goes: left behind, it would wait again at every acquire.
func TestLoop_EarlyTriggerThatGivesUpEndsItsKey(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, noopProfile(task.MisfireFireOnce), "0 0 0 1 1 *", "other")
	tl.trigger(0, "gone", base)
	if got := tl.pool.ends.next(10); len(got) != 0 {
		t.Fatalf("keys ended before the trigger gave up: %v", got)
	}
	tl.clock.Advance(triggerWait + time.Second)
	tl.retryTriggers()
	if got := tl.pool.ends.next(10); len(got) != 1 || got[0] != (triggerKey{0, "gone", base.UnixNano()}) {
		t.Errorf("keys ended %v, want the early trigger's", got)
	}
}
