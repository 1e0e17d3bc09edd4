package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// trigger hands the loop a trigger of task id at at, as the trigger
// watch does.
func (tl *testLoop) trigger(part int, id string, at time.Time) {
	tl.putTrigger(part, id, at, at.UnixMilli())
}

// putTrigger hands the loop the trigger key of id at at, written at
// revision rev, as the trigger watch does.
func (tl *testLoop) putTrigger(part int, id string, at time.Time, rev int64) {
	c := &triggersCmd{fires: []triggerFire{{part: part, id: id, at: at.UnixNano(), rev: rev}}, reply: make(chan struct{}, 1)}
	tl.handle(c)
	<-c.reply
}

// recreate hands the loop the delete and put again of task id (schedule
// spec, UTC) in partition 0 as one change of the partition's watch, at
// revision rev.
func (tl *testLoop) recreate(t *testing.T, id, spec string, prof *profile, rev int64) {
	t.Helper()
	h, err := tl.scheds.Intern(spec, "UTC", id)
	if err != nil {
		t.Fatal(err)
	}
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{{id: id, hash: xxhash.Sum64String(id), sched: h, prof: prof}}, rev: rev, created: rev})
}

// putAgainOfItsTask hands the loop the trigger key of id at at, put
// again at revision rev after its trigger fired, and answers the read of
// its task's creation (checkedAgain): the task that trigger fired,
// created no later than its key.
func (tl *testLoop) putAgainOfItsTask(part int, id string, at time.Time, rev int64) {
	tl.putTrigger(part, id, at, rev)
	asked := tl.checks.take(10)
	created := make(map[string]int64, len(asked))
	for _, f := range asked {
		created[f.id] = f.prev
	}
	if len(asked) > 0 {
		tl.handle(&checkedCmd{fires: asked, created: created, rev: rev})
	}
}

// putRetry hands the loop the trigger key of id at at, written at
// revision rev by a former owner handing retry on, as the trigger watch
// does.
func (tl *testLoop) putRetry(part int, id string, at time.Time, rev int64, retry registry.Retry) {
	c := &triggersCmd{fires: []triggerFire{{part: part, id: id, at: at.UnixNano(), rev: rev, retry: &retry}}, reply: make(chan struct{}, 1)}
	tl.handle(c)
	<-c.reply
}

// retryingProfile is a noop task's that has 3 attempts, 10 s apart.
func retryingProfile() *profile {
	p := noopProfile(task.MisfireFireOnce)
	p.key, p.maxAttempts = "noop/retry3", 3
	p.backoff, p.maxBackoff = 10*time.Second, 10*time.Second
	return p
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
	t.Parallel()
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
// running fire (buffer_one), which still waits for that fire on the next
// owner. Each runs once on the next owner, with its body or payload.
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

	closed := closeInBackground(a) // the release hands both over; Close waits for the held run
	b := startNode(t, c, "", handler, limitsNode(clock, time.Hour, "node-b"))
	t.Cleanup(h.open)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return len(log.of("queued")) > 0 })
	// slow's buffered trigger waits for node-a's run, which its marker
	// shows node-b (elsewhere.go).
	time.Sleep(300 * time.Millisecond)
	if n := len(log.of("slow")); n != 1 {
		t.Errorf("slow ran %d times while node-a's run was held, want that run alone", n)
	}
	h.open()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("slow")) > 1 })
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
	t.Parallel()
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
	tl.handOverQueued(tl.releaseNow(0).hand, unrunAll)
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

// A release takes its partitions' keys off the queue to delete them
// itself, and waits for the deleter's batch in flight, which may hold some.
func TestTriggerEnds_ReleaseTakesItsKeysAndWaitsForTheBatchInFlight(t *testing.T) {
	q := newTriggerEnds()
	q.add(triggerEnd{triggerKey{1, "a", 1}, 5}, triggerEnd{triggerKey{0, "b", 1}, 6}, triggerEnd{triggerKey{1, "c", 1}, 7}, triggerEnd{triggerKey{2, "d", 1}, 8})
	if b := q.take(1); len(b) != 1 || b[0].id != "a" {
		t.Fatalf("the deleter's batch %v, want a", b)
	}
	if got := q.takeParts([]int{1, 2}); len(got) != 2 || got[0].id != "c" || got[1].id != "d" {
		t.Errorf("the release's keys %v, want c and d", got)
	}
	waited := make(chan error, 1)
	go func() { waited <- q.waitBatch(context.Background()) }()
	select {
	case <-waited:
		t.Fatal("waitBatch returned with the deleter's batch in flight")
	case <-time.After(50 * time.Millisecond):
	}
	q.finish()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitBatch did not return once the batch was done with")
	}
	if got := q.take(10); len(got) != 1 || got[0].id != "b" {
		t.Errorf("left %v, want b", got)
	}
}

// An early trigger whose task never came gives up after triggerWait, and
// its key goes: left behind, it would wait again at every acquire.
func TestLoop_EarlyTriggerThatGivesUpEndsItsKey(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, noopProfile(task.MisfireFireOnce), "0 0 0 1 1 *", "other")
	tl.trigger(0, "gone", base)
	tl.sweepTriggers()
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 0 {
		t.Fatalf("keys ended before the trigger gave up: %v", got)
	}
	tl.clock.Advance(triggerWait + time.Second)
	tl.sweepTriggers()
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 1 || got[0] != (triggerKey{0, "gone", base.UnixNano()}) {
		t.Errorf("keys ended %v, want the early trigger's", got)
	}
}

// eventually polls cond until it holds or d passes, and reports whether it
// held; unlike etcdtest.WaitFor it does not end the test, so that a test
// can go on to show what a failure leads to.
func eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A trigger key written again at the time of a trigger that already fired
// and whose key is gone (two chains with one target and the same
// scheduled second, a chain repeated after a crash, or two API nodes that
// trigger one task in one millisecond: "the owner takes the second for the
// first") is that fire: its key goes too. The loop used to drop it as a
// repeat and leave its key, which the partition's next owner fired: a
// second fire with the same idempotency key, however long after. Written
// after the partition's release, the next owner fired it (the release
// now hands the triggers that fired over: handTriggers).
func TestEngine_TriggerKeyPutAgainAfterItsFireIsNotLeftForTheNextOwner(t *testing.T) {
	for _, released := range []bool{false, true} {
		t.Run(fmt.Sprintf("written after the release=%v", released), func(t *testing.T) {
			c := etcdtest.Start(t)
			log := newFireLog()
			a := startNode(t, c, "", log.handler, func(cfg *Config) { cfg.NodeID = "node-a"; cfg.Partitions = 4 })
			reg := a.e.Registry()
			putTask(t, reg, handlerTask("target", "0 0 0 1 1 *")) // yearly: only triggers fire it
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "target") })
			at := time.Now().Truncate(time.Second).UTC() // the scheduled time of the fire a chain ends
			ctx := context.Background()
			if err := reg.TriggerAt(ctx, "target", at); err != nil {
				t.Fatal(err)
			}
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("target")) == 1 })
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })

			var b *testNode
			release := func() {
				b = startNode(t, c, "", log.handler, func(cfg *Config) { cfg.NodeID = "node-b"; cfg.Partitions = 4 })
				a.stop(t) // node-b takes every partition over
				etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(b, "target") })
			}
			if released {
				release()
			}
			// The second chain's trigger, within triggerWait of the first.
			if err := reg.TriggerAt(ctx, "target", at); err != nil {
				t.Fatal(err)
			}
			if !eventually(5*time.Second, func() bool { return pendingTriggers(c) == 0 }) {
				t.Errorf("the second trigger of target@%d was taken for the first, and its key left in etcd", at.UnixMilli())
			}
			if !released {
				release()
			}
			time.Sleep(time.Second) // a repeat, if any
			if got := log.forTask("target"); len(got) != 1 {
				t.Errorf("target@%d fired %d times, want once (one key: the owner fires it once)", at.UnixMilli(), len(got))
			}
			b.stop(t)
		})
	}
}

// slowTriggerDeletes holds each transaction that deletes trigger keys for
// d before it commits: etcd busy (a bulk trigger's writes, a slow disk),
// so that the node's trigger deleter is some seconds behind its workers.
type slowTriggerDeletes struct {
	clientv3.KV
	d time.Duration
}

func (s *slowTriggerDeletes) Txn(ctx context.Context) clientv3.Txn {
	return &slowTriggerTxn{Txn: s.KV.Txn(ctx), ctx: ctx, d: s.d}
}

type slowTriggerTxn struct {
	clientv3.Txn
	ctx  context.Context
	d    time.Duration
	slow bool
}

func (t *slowTriggerTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *slowTriggerTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *slowTriggerTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if op.IsDelete() && strings.Contains(string(op.KeyBytes()), "/triggers/") {
			t.slow = true
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *slowTriggerTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.slow && !sleepCtx(t.ctx, t.d) {
		return nil, t.ctx.Err()
	}
	return t.Txn.Commit()
}

// A release deletes the keys of its partitions' triggers that started here
// before it commits, however long the node's queue of deletes: a bulk
// trigger leaves one, workers taking noop fires by the million a second.
// It used to wait for the whole queue, 5 s at most, then commit anyway,
// and the next owner fired those triggers again. Here node-a's deleter is
// behind (5000 keys queued, etcd taking 200 ms a transaction of deletes)
// when its trigger of "once" runs and node-a leaves.
func TestEngine_ReleaseBehindATriggerDeleteBacklogDoesNotRefireStartedTriggers(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	cliA := c.NewClient(t)
	cliA.KV = &slowTriggerDeletes{KV: cliA.KV, d: 200 * time.Millisecond}
	a := startNodeOn(t, cliA, "", log.handler, func(cfg *Config) { cfg.NodeID = "node-a"; cfg.Partitions = 4 })
	putTask(t, a.e.Registry(), handlerTask("once", "0 0 0 1 1 *")) // yearly: only the trigger fires it
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "once") })

	// The keys of a bulk trigger's fires that started on node-a, queued
	// for deletion (they need not exist: a delete of a missing key
	// succeeds).
	for i := range 5000 {
		a.e.pool.ends.add(triggerEnd{triggerKey{part: i % 4, id: fmt.Sprintf("bulk-%05d", i), at: int64(time.Millisecond)}, 0})
	}
	if _, err := a.e.Registry().Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("once")) == 1 })

	b := startNode(t, c, "", log.handler, func(cfg *Config) { cfg.NodeID = "node-b"; cfg.Partitions = 4 })
	a.stop(t) // releases every partition to node-b
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(b, "once") })
	time.Sleep(time.Second) // a repeat, if any
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("a trigger that started on node-a fired again on node-b after a graceful release: %v", d)
	}
	b.stop(t)
}

// A node that fenced itself and takes its partitions back, nobody having
// fired them since, repeats nothing (doc.go). A trigger that started just
// before the cut-off, its key's delete not yet in etcd, is read again by
// the rejoined node's acquire: the loop remembers it as fired, and forgets
// at a release only the triggers that did not start. It used to forget
// them all, and fired it a second time.
func TestEngine_FencedNodeTakingItsPartitionsBackDoesNotRefireItsStartedTriggers(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	proxy := c.NewProxy(t)
	cliA := c.NewClient(t, proxy.Endpoint())
	faults := injectFaults(cliA)
	a := startNodeOn(t, cliA, "", log.handler, func(cfg *Config) {
		cfg.NodeID, cfg.Partitions, cfg.LeaseTTL = "node-a", 4, 2*time.Second
	})
	putTask(t, a.e.Registry(), handlerTask("once", "0 0 0 1 1 *")) // yearly: only the trigger fires it
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "once") })

	// The delete does not reach etcd before the cut-off, and the deleter's
	// next try comes after the rejoined node's acquire.
	faults.deletes(triggerKeys)
	if _, err := a.e.Registry().Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("once")) == 1 })
	sess := a.e.sess.Load()
	proxy.Cut()
	etcdtest.WaitFor(t, 10*time.Second, sess.Fenced)
	proxy.Restore()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.sess.Load() != sess && a.e.Ready() })
	time.Sleep(time.Second) // a repeat, if any
	faults.deletes(nil)
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("node-a fired its own trigger again after taking its partitions back: %v", d)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })
	a.stop(t)
}

// A trigger of a task kept apart that a worker took just before its node
// fenced itself, and did not start (the fence cut its run before its
// executor was called), fires on the partition's next owner: here node-a
// itself, which takes its partitions back once etcd answers again. Its
// key's delete was queued at the take, as for a fire that started: the
// deleter deleted it once etcd answered, and the hand-over the fenced
// session kept listed the trigger as fired, which ended the key unrun had
// the delete come after the acquire's read. Nobody fired it.
func TestEngine_TriggerTakenAndNotStartedAtAFenceFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	proxy := c.NewProxy(t)
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", log.handler, func(cfg *Config) {
		cfg.NodeID, cfg.Partitions, cfg.LeaseTTL, cfg.Workers = "node-a", 4, 2*time.Second, 1
	})
	once := handlerTask("once", "0 0 0 1 1 *") // yearly: only the trigger fires it
	once.Concurrency = task.ConcurrencyForbid  // its runs are cut at a fence
	putTask(t, a.e.Registry(), once)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "once") })

	// The fence comes between the take's check and the job's start: the
	// worker's check finds the node not fenced, and by the time it takes
	// the trigger's job, the session has ended and its runs were cut.
	sess, p := a.e.sess.Load(), a.e.pool
	var fence sync.Once
	p.mu.Lock() // take reads fenced under it
	fenced := p.fenced
	p.fenced = func() bool {
		passed := false
		if p.queued() > 0 && p.at(0).kind == kindTrigger {
			fence.Do(func() {
				cuts := p.cuts.Load()
				proxy.Cut()
				for !sess.Fenced() || p.cuts.Load() == cuts {
					time.Sleep(10 * time.Millisecond)
				}
				passed = true
			})
		}
		return !passed && fenced()
	}
	p.mu.Unlock()
	// Not through node-a's client, whose answer the cut-off may take.
	reg, err := registry.OpenRegistry(context.Background(), c.Client, DefaultPrefix, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return sess.Fenced() && a.e.Stats().Executions["canceled"] == 1 })
	proxy.Restore()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.sess.Load() != sess && a.e.Ready() })
	cutTriggerFiresOnce(t, c, a, log, "taken and cut by the fence before it started")
}

// So does one that an acquire undone after its load cuts: the key stays,
// and the loop forgets the trigger, whose key the partition's next
// acquire reads at the same put. Here node-a loads its one partition, a
// trigger of once (forbid) comes while the acquire's read of the
// partition's triggers waits, its worker takes the job and is held before
// it starts, and that read fails: the acquire is undone, and node-a
// acquires the partition again. The take queued the key's delete; kept,
// the key was passed over as the fire of the trigger remembered.
func TestEngine_TriggerTakenAndNotStartedAtAnUndoneAcquireFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg, log, clock := putOnceApart(t, c, 1, task.ConcurrencyForbid)
	cli := c.NewClient(t)
	read := make(chan struct{})
	injectFaults(cli).failsGetOnceAfter(func(key string) bool { return strings.Contains(key, "/triggers/") }, read)
	a := startNodeOn(t, cli, "", log.handler, func(cfg *Config) {
		cfg.NodeID, cfg.Partitions, cfg.Workers, cfg.Clock = "node-a", 1, 1, clock
	}, noWait)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return inLoop(t, a, func(l *loop) bool { return l.parts[0].owned }) })
	let := holdTriggered(t, clock, func() error {
		_, err := reg.Trigger(context.Background(), "once")
		return err
	})
	close(read) // the acquire's read of the partition's triggers fails: it is undone
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return a.e.pool.cuts.Load() > 0 })
	let() // past the cut: the job does not start
	etcdtest.WaitFor(t, 20*time.Second, a.e.Ready)
	cutTriggerFiresOnce(t, c, a, log, "taken and cut by the undone acquire before it started")
}

// So does one whose key was put again while the worker held the job (a
// former owner's late delete of the pending key, then a chain's trigger
// at its time): the key at that put is the fire's, and stays with it.
// Here the fence's cut ends the held job unrun, and its completion
// reaches the loop before the drop's seal (the test holds the drop at its
// stop of the backfills): the loop took it for the fire's end, queued the
// delete of the key put again, and the seal, forgetting the trigger,
// listed nothing. node-a, taking its partitions back, found no key:
// nobody fired it. A completion that reached the loop after the seal
// found the trigger forgotten, and the key stayed.
func TestEngine_TriggerPutAgainWhileTakenAndCutAtAFenceFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg, log, clock := putOnceApart(t, c, 4, task.ConcurrencyForbid)
	proxy := c.NewProxy(t)
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", log.handler, func(cfg *Config) {
		cfg.NodeID, cfg.Partitions, cfg.LeaseTTL, cfg.Workers, cfg.Clock = "node-a", 4, 2*time.Second, 1, clock
	})
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "once") })
	at := time.Now().Truncate(time.Second).UTC() // the scheduled time of the fire the chains end
	k := triggerKey{part: reg.Partition("once"), id: "once", at: at.UnixNano()}
	let := holdTriggered(t, clock, func() error { return reg.TriggerAt(context.Background(), "once", at) })
	// While the worker holds the job, the key goes, as a former owner's
	// late delete of the same put takes it (its fire of that put started
	// there, and its node fenced before the delete reached etcd), and a
	// second chain's trigger puts it again: pending, the key would have
	// taken that trigger as its own (registry.TriggerAt).
	pending, err := reg.PendingTriggers(context.Background())
	if err != nil || len(pending.Kvs) != 1 {
		t.Fatalf("pending triggers: %v, %v; want the one", pending, err)
	}
	if _, err := c.Client.Delete(context.Background(), string(pending.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	if err := reg.TriggerAt(context.Background(), "once", at); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return inLoop(t, a, func(l *loop) bool { return l.triggered[k].again })
	})

	sess, p := a.e.sess.Load(), a.e.pool
	a.e.bf.mu.Lock() // the drop waits at its stop of the backfills, before its release
	unlock := sync.OnceFunc(a.e.bf.mu.Unlock)
	t.Cleanup(unlock)
	cuts := p.cuts.Load()
	proxy.Cut()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return sess.Fenced() && p.cuts.Load() != cuts })
	let() // past the cut: the job does not start
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return inLoop(t, a, func(l *loop) bool {
			_, r, ok := l.tab.lookup("once")
			return ok && r.running == 0 // its completion is in
		})
	})
	unlock()
	proxy.Restore()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.sess.Load() != sess && a.e.Ready() })
	cutTriggerFiresOnce(t, c, a, log, "put again while its job was held, cut by the fence before it started,")
}

// So does one held unstarted through a graceful release that etcd took,
// then cut by a fence: the release does not list it as fired, and the
// partition's next owner fires its key. Listed, the next owner took the
// key for that fire and ended it unrun: nobody fired it. Here node-a's
// worker is held through the release of once's partition to node-b,
// which joins (its wait for runs, 10 ms, runs out), and node-a, cut off
// from etcd once node-b took the partition, fences, which cuts the job.
// once is buffer_one: the marker of the held job, which goes with
// node-a's lease, holds node-b's fire until then (forbid skips it there:
// docs/design.md, What is not guaranteed).
func TestEngine_TriggerHeldThroughAReleaseAndCutAtAFenceFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg, log, clock := putOnceApart(t, c, joinParts, task.ConcurrencyBufferOne)
	if p := reg.Partition("once"); joinAssignment(t).Owner(p) != "node-b" {
		t.Fatalf("once's partition %d stays with node-a when node-b joins", p)
	}
	proxy := c.NewProxy(t)
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", log.handler, func(cfg *Config) {
		cfg.NodeID, cfg.Partitions, cfg.LeaseTTL, cfg.Workers, cfg.Clock = "node-a", joinParts, 2*time.Second, 1, clock
		cfg.ReleaseRunWait = 10 * time.Millisecond
	})
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "once") })
	let := holdTriggered(t, clock, func() error {
		_, err := reg.Trigger(context.Background(), "once")
		return err
	})
	b := startNode(t, c, "", log.handler, func(cfg *Config) { cfg.NodeID, cfg.Partitions = "node-b", joinParts })
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(b, "once") })
	sess := a.e.sess.Load()
	proxy.Cut()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return sess.Fenced() && a.e.pool.cuts.Load() > 0 })
	let() // past the cut: the job does not start
	proxy.Restore()
	cutTriggerFiresOnce(t, c, a, log, "held through a release etcd took and cut by a fence before it started")
	b.stop(t)
}

// putOnceApart puts task once, which only triggers fire and whose runs a
// cut cancels (policy, which keeps its fires apart), through a registry
// of parts partitions, and returns that registry, a log of fires for the
// node's handler, and a clock for the node that holds a worker before it
// starts its job.
func putOnceApart(t *testing.T, c *etcdtest.Cluster, parts int, policy task.ConcurrencyPolicy) (*registry.Registry, *fireLog, *workerClock) {
	t.Helper()
	reg, err := registry.OpenRegistry(context.Background(), c.Client, DefaultPrefix, parts)
	if err != nil {
		t.Fatal(err)
	}
	once := handlerTask("once", "0 0 0 1 1 *") // yearly: only the triggers fire it
	once.Concurrency = policy
	putTask(t, reg, once)
	return reg, newFireLog(), &workerClock{Clock: realClock{}, held: make(chan struct{}), let: make(chan struct{})}
}

// cutTriggerFiresOnce checks that the trigger of once that a cut canceled
// before it started (what says how) fires once on a, its cut run the one
// canceled, and that its key goes; then stops a.
func cutTriggerFiresOnce(t *testing.T, c *etcdtest.Cluster, a *testNode, log *fireLog, what string) {
	t.Helper()
	if !eventually(10*time.Second, func() bool { return len(log.forTask("once")) > 0 }) {
		t.Fatalf("the trigger %s never fired (%d trigger keys pending)", what, pendingTriggers(c))
	}
	time.Sleep(300 * time.Millisecond) // a repeat, if any
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("the trigger fired more than once: %v", d)
	}
	if n := a.e.Stats().Executions["canceled"]; n != 1 {
		t.Errorf("%d executions canceled, want the cut one", n)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })
	a.stop(t)
}

// holdTriggered has clock hold the worker that takes the next job, calls
// trigger, and waits until a worker is held. It returns the func that lets
// the worker go, which the cleanup calls too, before the node's stop
// (registered before this) waits for the worker.
func holdTriggered(t *testing.T, clock *workerClock, trigger func() error) (let func()) {
	t.Helper()
	let = sync.OnceFunc(func() { close(clock.let) })
	t.Cleanup(let)
	clock.hold.Store(true)
	if err := trigger(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-clock.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no worker took the trigger's job within 10 s")
	}
	return let
}

// workerClock is a clock that, once hold is set, holds the first worker
// that reads it, as workers do when they took a job and before they start
// it (pool.work), until let is closed.
type workerClock struct {
	Clock
	hold atomic.Bool
	held chan struct{} // closed when a worker is held
	let  chan struct{}
}

func (c *workerClock) Now() time.Time {
	if c.hold.Load() {
		buf := make([]byte, 8<<10)
		if bytes.Contains(buf[:runtime.Stack(buf, false)], []byte(".(*pool).work(")) && c.hold.CompareAndSwap(true, false) {
			close(c.held)
			<-c.let
		}
	}
	return c.Clock.Now()
}

// gatedProgress holds the catch-up watches' progress requests while held
// is set: a partition's catch-up then takes as long (etcd busy, many
// partitions catching up at once at a restart), and the acquire waits in
// changesSince, between its checkpoint transaction and the load.
type gatedProgress struct {
	clientv3.Watcher
	held atomic.Bool
}

func (g *gatedProgress) RequestProgress(ctx context.Context) error {
	for g.held.Load() {
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
	return g.Watcher.RequestProgress(ctx)
}

// An acquire marks its partition owned (Engine.Owns) after its checkpoint
// transaction, but the loop owns it only from the load, after the
// catch-up: a trigger the watch delivers in between is left for the
// owner's load to find. The acquire reads the pending triggers once the
// loop owns the partition. It used to read them in its checkpoint
// transaction, before such a trigger was written: nobody fired it until
// the partition's next acquire.
func TestEngine_TriggerWrittenWhileItsPartitionCatchesUpFires(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	const parts = 4
	reg, err := registry.OpenRegistry(context.Background(), c.Client, DefaultPrefix, parts)
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("once", "0 0 0 1 1 *")) // yearly: only the trigger fires it
	p := ring.Partition("once", parts)

	cli := c.NewClient(t)
	gate := &gatedProgress{Watcher: cli.Watcher}
	gate.held.Store(true)
	cli.Watcher = gate
	n := startNodeOn(t, cli, "", log.handler, func(cfg *Config) { cfg.Partitions = parts }, noWait)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return n.e.Owns(p) }) // its checkpoint is written; the catch-up waits
	if _, err := reg.Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the trigger watch delivers it
	gate.held.Store(false)
	etcdtest.WaitFor(t, 20*time.Second, n.e.Ready)
	if !eventually(5*time.Second, func() bool { return len(log.forTask("once")) > 0 }) {
		t.Errorf("the trigger written while partition %d caught up never fired (%d trigger keys pending)", p, pendingTriggers(c))
	}
	n.stop(t)
}

// An early trigger (its task not in the loop: the task deleted before the
// trigger came) gives up after triggerWait and its key goes, on a quiet
// node too: the loop sweeps once a second. It used to sweep only at a
// later trigger, load or task change, and on a quiet node the key stayed
// for good. Here a trigger of a task that is gone comes to a node with
// nothing else happening.
func TestEngine_EarlyTriggerGivesUpWithNothingElseHappening(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	const parts = 4
	n := startNode(t, c, "", newFireLog().handler, func(cfg *Config) { cfg.Partitions = parts })
	// The trigger of a task deleted right after it was written, its delete
	// seen first by the partition's watch.
	key := fmt.Sprintf("%s/triggers/%05d/%d/%s", DefaultPrefix, ring.Partition("gone", parts), time.Now().UnixMilli(), "gone")
	if _, err := c.Client.Put(context.Background(), key, ""); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return inLoop(t, n, func(l *loop) bool { return l.early.len() == 1 })
	})
	if !eventually(triggerWait+5*time.Second, func() bool { return pendingTriggers(c) == 0 }) {
		t.Errorf("the early trigger of a task that never came still has its key %s past triggerWait", key)
	}
	n.stop(t)
}

// laggingTriggerWatch delivers the trigger watch's events lag late: the
// watch behind a busy loop (it waits for the loop's answer to each
// response) or behind etcd's slow-watcher catch-up during a bulk trigger.
type laggingTriggerWatch struct {
	clientv3.Watcher
	lag time.Duration
}

func (w *laggingTriggerWatch) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	if !strings.HasSuffix(key, "/triggers/") {
		return in
	}
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			if len(resp.Events) > 0 && !sleepCtx(ctx, w.lag) {
				return
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// The watch and an acquire's read of pending triggers can both deliver one
// trigger, and the loop fires it once, however late the watch's event: it
// passes over the events at or before the acquire's read. It used to tell
// them only by time (a fired trigger remembered for triggerWait), and an
// event later than that fired it again. Here the acquire reads the trigger
// and fires it, the loop forgets it 11.5 s on, and the trigger watch's
// event comes 13 s late.
func TestEngine_TriggerTheAcquireReadIsNotFiredAgainByALateWatchEvent(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	reg, err := registry.OpenRegistry(context.Background(), c.Client, DefaultPrefix, 1)
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("once", "0 0 0 1 1 *")) // yearly: only the trigger fires it

	cli := c.NewClient(t)
	cli.Watcher = &laggingTriggerWatch{Watcher: cli.Watcher, lag: triggerWait + 3*time.Second}
	faults := injectFaults(cli)
	let := make(chan struct{})
	reached := faults.pauses(func(key, _ string) bool { return strings.Contains(key, "/checkpoints/") }, let)
	n := startNodeOn(t, cli, "", log.handler, func(cfg *Config) { cfg.Partitions = 1 }, noWait)
	select {
	case <-reached: // the acquire's checkpoint transaction waits
	case <-time.After(20 * time.Second):
		t.Fatal("the acquire did not reach its checkpoint transaction")
	}
	time.Sleep(200 * time.Millisecond) // the trigger watch is set up
	if _, err := reg.Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	close(let)
	etcdtest.WaitFor(t, 20*time.Second, n.e.Ready)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("once")) == 1 })
	time.Sleep(triggerWait + 1500*time.Millisecond)
	putTask(t, reg, handlerTask("other", "0 0 0 1 1 *")) // the loop has forgotten the trigger (sweepTriggers, once a second)
	time.Sleep(3 * time.Second)                          // the watch's late event
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("a trigger the acquire read fired again when the watch's event of it came late: %v", d)
	}
	n.stop(t)
}

// A key put again while its trigger's fire waits is that fire: its key
// goes when the fire ends, not at once, so that it stays should the fire
// be handed over unrun (a fence, a release). Put again after the fire
// ended, it goes at once.
func TestLoop_TriggerKeyPutAgainGoesWhenItsFireEnds(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil) // its workers take nothing
	tl.add(t, 0, base, noopProfile(task.MisfireFireOnce), "0 0 0 1 1 *", "x")
	k := triggerKey{0, "x", base.UnixNano()}
	tl.putTrigger(0, "x", base, 1)
	tl.putAgainOfItsTask(0, "x", base, 2) // while its fire waits for a worker
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 0 {
		t.Fatalf("the key put again while its fire waited went at once: %v", got)
	}
	if got := tl.dispatched(0); len(got) != 1 {
		t.Fatalf("dispatched %v, want the one fire", got)
	}
	tl.triggerEnded(k)
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 1 || got[0] != k {
		t.Errorf("when the fire ended, keys ended %v, want x's", got)
	}
	tl.putAgainOfItsTask(0, "x", base, 3) // after the fire ended
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 1 || got[0] != k {
		t.Errorf("put again after its fire ended, keys ended %v, want x's", got)
	}
	if got := tl.dispatched(0); len(got) != 1 {
		t.Errorf("dispatched %v, want the one fire", got)
	}
}

// A key put again while its fire waits or runs longer than triggerWait is
// still that fire: the sweep keeps a trigger whose task has a fire in
// flight, and forgets it once that fire ended.
func TestLoop_TriggerKeyPutAgainDuringALongFireIsThatFire(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil) // its workers take nothing: the fire waits
	tl.add(t, 0, base, noopProfile(task.MisfireFireOnce), "0 0 0 1 1 *", "x")
	k := triggerKey{0, "x", base.UnixNano()}
	tl.putTrigger(0, "x", base, 1)
	tl.clock.Advance(triggerWait + time.Second)
	tl.sweepTriggers()
	tl.putAgainOfItsTask(0, "x", base, 2)
	if got := tl.dispatched(0); len(got) != 1 {
		t.Fatalf("dispatched %v, want the one fire: the key put again %v after its trigger was taken for a new one", got, triggerWait)
	}
	tl.triggerEnded(k)
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 1 || got[0] != k {
		t.Errorf("when the fire ended, keys ended %v, want x's", got)
	}
	tl.clock.Advance(triggerWait + time.Second)
	tl.sweepTriggers()
	if _, ok := tl.triggered[k]; ok {
		t.Error("the trigger is still remembered past triggerWait after its fire ended")
	}
}

// A key put again while its trigger's fire runs goes when that fire is
// over, also when its task was deleted meanwhile: the end of a fire of a
// task gone ended no key, the sweep forgot the trigger, and the key stayed
// in etcd until the partition's next acquire, which fired it (a task put
// again under the id meanwhile ran).
func TestLoop_TriggerKeyPutAgainGoesWhenItsTaskIsDeletedDuringTheFire(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil) // its workers take nothing
	tl.add(t, 0, base, noopProfile(task.MisfireFireOnce), "0 0 0 1 1 *", "x")
	k := triggerKey{0, "x", base.UnixNano()}
	tl.putTrigger(0, "x", base, 1)
	j := tl.takeQueued() // a worker took the fire, and ended its key
	tl.putAgainOfItsTask(0, "x", base, 2)
	tl.handle(&eventsCmd{part: 0, deletes: []string{"x"}})
	tl.end(j, statusOK)
	if got := tl.sweepPastWait(); !slices.Equal(got, []triggerKey{k}) {
		t.Errorf("the fire of a task deleted while it ran is over: keys ended %v, want x's, put again while it ran", got)
	}
}

// keysOf is the keys of the puts ends.
func keysOf(ends []triggerEnd) []triggerKey {
	ks := make([]triggerKey, len(ends))
	for i, e := range ends {
		ks[i] = e.triggerKey
	}
	return ks
}

// sweepPastWait sweeps the triggers once they are past triggerWait, and
// returns the keys that ended.
func (tl *testLoop) sweepPastWait() []triggerKey {
	tl.clock.Advance(triggerWait + time.Second)
	tl.sweepTriggers()
	return keysOf(tl.pool.ends.take(10))
}

// A key put again after its trigger's fire was skipped by its concurrency
// policy is that fire's, and goes: it waited for the end of a fire that
// never ran, and stayed in etcd once the sweep forgot the trigger.
func TestLoop_TriggerKeyPutAgainAfterItsFireWasSkippedGoes(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil) // its workers take nothing
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.concurrency = "noop/forbid", task.ConcurrencyForbid
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "x")
	tl.putTrigger(0, "x", base, 1)
	j := tl.takeQueued() // it runs
	at := base.Add(time.Millisecond)
	k := triggerKey{0, "x", at.UnixNano()}
	tl.putTrigger(0, "x", at, 2) // skipped: its key goes
	if got := keysOf(tl.pool.ends.take(10)); !slices.Equal(got, []triggerKey{k}) {
		t.Fatalf("the skipped trigger ended keys %v, want %v", got, k)
	}
	tl.putAgainOfItsTask(0, "x", at, 3)
	tl.end(j, statusOK)
	if got := tl.sweepPastWait(); !slices.Equal(got, []triggerKey{k}) {
		t.Errorf("keys ended %v, want x@+1ms's, put again after its fire was skipped", got)
	}
}

// A trigger of a task kept apart whose job has not started at its
// partition's seal is not listed in the hand-over as fired: a worker holds
// it, which a fence may cut after the release commits, or a fence cut it
// already, which comes before the seal when the session ends during the
// release (etcd left it stuck, and the fenced drop keeps that hand-over).
// Its key, which stays (pool.unstarted), is the next owner's to fire,
// this node's too when it takes the partition back. Listed, that owner
// took the key for the fire and ended it unrun: nobody fired it. One whose
// job started before the seal is listed. The seal comes here as after a
// run wait that ran out, the worker held through it.
func TestLoop_SealListsNoTriggerWhoseJobHasNotStartedAsFired(t *testing.T) {
	for _, cutFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("cut before the seal %v", cutFirst), func(t *testing.T) {
			base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			tl := newTestLoop(t, base, func(cfg *Config) { cfg.Workers = 2 })
			prof := noopProfile(task.MisfireFireOnce)
			prof.key, prof.noop, prof.concurrency = "forbid", false, task.ConcurrencyForbid // a worker holds its job until it starts
			tl.add(t, 0, base, prof, "0 0 0 1 1 *", "held", "ran")
			p := tl.pool
			take := func(w int) { // as pool.take does, the worker's only job
				p.mu.Lock()
				defer p.mu.Unlock()
				j := *p.at(0)
				p.pop()
				p.hold(w, &j, p.cuts.Load())
			}
			tl.putTrigger(0, "ran", base, 1)
			take(0)
			p.leaveHand(0) // it starts
			tl.putTrigger(0, "held", base, 2)
			take(1)
			rel := tl.releaseNow(0)
			if cutFirst {
				p.cutRunning()
			}
			c := &sealCmd{rel: rel, late: true, reply: make(chan struct{}, 1)}
			tl.handle(c)
			<-c.reply
			var fired []string
			for _, f := range rel.hand[0].fired {
				fired = append(fired, f.ID)
			}
			if !slices.Equal(fired, []string{"ran"}) {
				t.Errorf("the seal listed %v as fired, want [ran]: held's job has not started", fired)
			}
		})
	}
}

// A trigger or a backfill written while the node's watches are down
// starts once they are back, also on a node that had seen none yet. etcd
// cancels a watch that requires a leader once its member has had none for
// a few election timeouts (the quorum lost, the member cut off from its
// peers), and the trigger and backfill watches then start again after the
// last revision they saw. Before any event or progress notification (etcd
// sends one every 10 minutes) they had seen none, and they started again
// from etcd's revision of then: what was written while they were down
// stayed pending, unfired, until its partition's next acquire. Here the
// node's client reaches member 0 only; members 1 and 2 stop (member 0
// loses its leader and cancels the node's watches), member 0 stops,
// members 1 and 2 start again and take a trigger and a backfill, then
// member 0 starts again.
func TestEngine_TriggerAndBackfillWrittenWhileTheirWatchesAreDownStart(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, etcdtest.Options{Members: 3})
	m0, m1, m2 := c.Members[0], c.Members[1], c.Members[2]
	log := newFireLog()
	const parts = 4
	reg, err := registry.OpenRegistry(context.Background(), c.NewClient(t, m1.Endpoint(), m2.Endpoint()), DefaultPrefix, parts)
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("once", "0 0 0 1 1 *"))   // yearly: only the trigger fires it
	putTask(t, reg, handlerTask("yearly", "0 0 0 1 1 *")) // only the backfill fires it
	// A long lease: the node must live through the outage on its session,
	// not rejoin (a rejoin's acquires read the pending triggers and
	// backfills).
	n := startNodeOn(t, c.NewClient(t, m0.Endpoint()), "", log.handler, func(cfg *Config) {
		cfg.Partitions = parts
		cfg.LeaseTTL = watchesDownTTL
	})
	var at time.Time
	from, to := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2022, 1, 1, 0, 0, 0, 0, time.UTC)
	watchesDown(t, c, n, func(ctx context.Context) {
		if at, err = reg.Trigger(ctx, "once"); err != nil {
			t.Fatal(err)
		}
		if _, err := reg.Backfill(ctx, "yearly", from, to, 1); err != nil {
			t.Fatal(err)
		}
	})

	if !eventually(10*time.Second, func() bool { return slices.Contains(log.forTask("once"), at) }) {
		t.Errorf("the trigger of %v written while the trigger watch was down never fired (%d trigger keys pending)", at, pendingTriggers(c))
	}
	if !eventually(10*time.Second, func() bool { return len(log.forTask("yearly")) == 3 }) {
		t.Errorf("the backfill written while the backfill watch was down fired %v, want the 3 first days of %d-%d",
			log.forTask("yearly"), from.Year(), to.Year())
	}
	// A trigger written now fires: the watch is back.
	at2, err := reg.Trigger(t.Context(), "once")
	if err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { return slices.Contains(log.forTask("once"), at2) }) {
		t.Errorf("a trigger written once the watch was back never fired either")
	}
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("fires repeated: %v", d)
	}
	n.stop(t)
}

// A backfill written while the backfill watch was down starts too when
// etcd compacted past the watch's revision meanwhile: the watch reads the
// records, as the trigger watch reads the pending triggers, rather than
// go on from the present and leave the backfill unstarted until its
// partition's next acquire.
func TestEngine_BackfillWrittenWhileItsWatchIsDownAndCompactedStarts(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, etcdtest.Options{Members: 3})
	log := newFireLog()
	const parts = 4
	cli := c.NewClient(t, c.Members[1].Endpoint(), c.Members[2].Endpoint())
	reg, err := registry.OpenRegistry(context.Background(), cli, DefaultPrefix, parts)
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("yearly", "0 0 0 1 1 *")) // only the backfill fires it
	n := startNodeOn(t, c.NewClient(t, c.Members[0].Endpoint()), "", log.handler, func(cfg *Config) {
		cfg.Partitions = parts
		cfg.LeaseTTL = watchesDownTTL
	})
	from, to := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2022, 1, 1, 0, 0, 0, 0, time.UTC)
	watchesDown(t, c, n, func(ctx context.Context) {
		if _, err := reg.Backfill(ctx, "yearly", from, to, 1); err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Get(ctx, "compact")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
	})
	if !eventually(10*time.Second, func() bool { return len(log.forTask("yearly")) == 3 }) {
		t.Errorf("the backfill written while the backfill watch was down, and compacted past, fired %v, want the 3 first days of %d-%d",
			log.forTask("yearly"), from.Year(), to.Year())
	}
	n.stop(t)
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("fires repeated: %v", d)
	}
}

// A retry handed on through etcd is a put of its fire's trigger key; when
// that fire was a trigger fired on the node that gets its partition back,
// the loop still remembers the key (for triggerWait) and took the retry
// for that trigger put again: it ran no retry, and the key stayed, for
// the partition's next acquire. Here node "loop" fires flaky's trigger,
// releases the partition while attempt 1 runs, attempt 1 fails after the
// seal, and the partition comes back with the retry's key.
func TestLoop_RetryOfATriggerHandedBackToItsNodeRuns(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	retrying := retryingProfile()
	tl.add(t, 0, base, retrying, "0 0 0 1 1 *", "flaky") // yearly: only the trigger fires it
	tl.putTrigger(0, "flaky", base, 1)
	tl.pool.mu.Lock()
	j := *tl.pool.at(0)
	tl.pool.mu.Unlock()
	tl.pool.reset() // a worker took attempt 1
	rel := tl.releaseNow(0)
	c := &sealCmd{rel: rel, late: true, reply: make(chan struct{}, 1)} // the wait ran out
	tl.handle(c)
	<-c.reply
	tl.clock.Advance(time.Second)
	var done completionBatch
	done.add(&j, statusFailed, "boom", false)
	tl.complete(&done)
	fs := tl.pool.chains.take()
	if len(fs) != 1 || fs[0].retry == nil {
		t.Fatalf("handed on %+v, want flaky's retry", fs)
	}

	tl.add(t, 0, base, retrying, "0 0 0 1 1 *", "flaky") // the partition comes back
	// Its key is one this node saw before, the fire's trigger's: a retry
	// takes the first free key after its fire's time, which an earlier
	// retry of the fire may have had.
	retry := *fs[0].retry
	retry.At = base // as registry.TriggerRetry writes it
	tl.putRetry(0, "flaky", base, 2, retry)
	if n := tl.retrying.Load(); n != 1 {
		t.Fatalf("%d retries wait, want flaky's attempt 2", n)
	}
	// The chain writer puts again after an error that may have hidden a
	// put: the same retry, which waits once.
	tl.putRetry(0, "flaky", base, 3, retry)
	if n := tl.retrying.Load(); n != 1 {
		t.Fatalf("%d retries wait after the retry's key was put again, want 1", n)
	}
	tl.clock.Advance(fs[0].retry.Due.Sub(tl.clock.Now()) + time.Second)
	tl.dispatchAll()
	tl.pool.mu.Lock()
	defer tl.pool.mu.Unlock()
	if tl.pool.queued() != 1 || tl.pool.at(0).attempt != 2 || tl.pool.at(0).sched != base.UnixNano() {
		t.Errorf("queued %d jobs, want flaky@%v attempt 2", tl.pool.queued(), base)
	}
}

// A retry handed on through etcd is attempt 2 or more of its fire at
// Retry.At: its key's time is a later one (registry.TriggerRetry), which
// the loop deletes. The retry ran as a fire at its key's time.
func TestLoop_RetryHandedOnThroughEtcdIsOfItsFiresTime(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, retryingProfile(), "0 0 0 1 1 *", "flaky")
	sched := base.Add(-time.Minute)
	key := sched.Add(time.Millisecond)
	tl.putRetry(0, "flaky", key, 1, registry.Retry{Attempt: 2, Due: base.Add(5 * time.Second), At: sched})
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 1 || got[0] != (triggerKey{0, "flaky", key.UnixNano()}) {
		t.Errorf("keys ended %v, want the retry's", got)
	}
	tl.clock.Advance(6 * time.Second)
	tl.dispatchAll()
	tl.pool.mu.Lock()
	defer tl.pool.mu.Unlock()
	if n := tl.pool.queued(); n != 1 {
		t.Fatalf("queued %d jobs, want flaky's attempt 2", n)
	}
	if j := tl.pool.at(0); j.attempt != 2 || j.sched != sched.UnixNano() {
		t.Errorf("queued attempt %d of flaky@%v, want attempt 2 of flaky@%v", j.attempt, time.Unix(0, j.sched).UTC(), sched)
	}
}

// A retry waiting on a node that releases its partition goes in the
// checkpoint; its key, handed on through etcd, was deleted when the node
// took it. Should that delete fail until the release (it warns, and
// commits), the next owner finds the retry twice, and ran it twice. One
// retry of a fire's attempt waits once, whichever comes first.
func TestLoop_RetryBothInTheCheckpointAndInItsKeyWaitsOnce(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sched := base.Add(-time.Minute)
	retry := registry.Retry{Attempt: 2, Due: base.Add(5 * time.Second), At: sched}
	checkpoint := &takeOverCmd{part: 0, fires: []pendingFire{{ID: "flaky", At: sched, Attempt: 2, Due: retry.Due}}}
	for _, keyFirst := range []bool{false, true} {
		tl := newTestLoop(t, base, nil)
		tl.add(t, 0, base, retryingProfile(), "0 0 0 1 1 *", "flaky")
		if !keyFirst {
			tl.handle(checkpoint)
		}
		tl.putRetry(0, "flaky", sched.Add(time.Millisecond), 1, retry)
		if keyFirst {
			tl.handle(checkpoint)
		}
		if n := tl.retrying.Load(); n != 1 {
			t.Errorf("key first %v: %d retries wait, want 1", keyFirst, n)
		}
		if got := keysOf(tl.pool.ends.take(10)); len(got) != 1 {
			t.Errorf("key first %v: keys ended %v, want the retry's", keyFirst, got)
		}
	}
}

// The same retry in a crashed owner's watermark (or a release's
// checkpoint) and in its key, whose delete had not reached etcd: the
// acquire runs the fires handed over first, then reads the keys. A retry
// already due (its backoff ran out while the lease expired) is released
// between the two, and no longer waits when its key comes: it ran once
// more, attempt 2 twice with one idempotency key.
func TestLoop_RetryDueBothInTheWatermarkAndInItsKeyRunsOnce(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sched := base.Add(-time.Minute)
	retry := registry.Retry{Attempt: 2, Due: base.Add(-5 * time.Second), At: sched}
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, retryingProfile(), "0 0 0 1 1 *", "flaky")
	tl.handle(&takeOverCmd{part: 0, fires: []pendingFire{{ID: "flaky", At: sched, Attempt: 2, Due: retry.Due}}})
	tl.dispatchAll()
	tl.putRetry(0, "flaky", sched.Add(time.Millisecond), 1, retry)
	tl.dispatchAll()
	var attempts []uint16
	tl.pool.mu.Lock()
	for i := range tl.pool.queued() {
		if j := tl.pool.at(i); j.id == "flaky" {
			attempts = append(attempts, j.attempt)
		}
	}
	tl.pool.mu.Unlock()
	if !slices.Equal(attempts, []uint16{2}) {
		t.Errorf("queued attempts %v of flaky@%v, want attempt 2 once", attempts, sched)
	}
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 1 {
		t.Errorf("keys ended %v, want the retry's", got)
	}
}

// A change the node cannot read takes the task out as a read of its
// partition leaves it out (a compaction's reload, with replace): the fires
// of the definition before that wait for a worker do not run, and the
// trigger buffered behind one ends, its key deleted, as for a task
// deleted. Neither waits for the next owner, nor for a readable change.
func TestLoop_UnreadableChangeDropsTheFiresWaitingOfItsTask(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.concurrency = "noop/buffer_one", task.ConcurrencyBufferOne
	tl := newTestLoop(t, at, nil)
	tl.add(t, 0, at, prof, "0 0 0 1 1 *", "bad", "keep")
	tl.trigger(0, "bad", at)
	tl.trigger(0, "bad", at.Add(time.Millisecond)) // buffered: the first waits for a worker
	tl.trigger(0, "keep", at)
	tl.dispatchAll()
	ms := at.UnixMilli()
	if got, want := tl.dispatched(0), []string{fmt.Sprintf("bad@%d", ms), fmt.Sprintf("keep@%d", ms)}; !slices.Equal(got, want) {
		t.Fatalf("dispatched %v, want %v", got, want)
	}
	tl.handle(&eventsCmd{part: 0, drops: []string{"bad"}, rev: ms + 2}) // after its triggers
	if got, want := tl.dispatched(0), []string{fmt.Sprintf("keep@%d", ms)}; !slices.Equal(got, want) {
		t.Errorf("after the unreadable change, %v wait for a worker, want %v", got, want)
	}
	var ended []string
	for _, k := range keysOf(tl.pool.ends.take(10)) {
		ended = append(ended, fmt.Sprintf("%s@%d", k.id, k.at/int64(time.Millisecond)))
	}
	if want := []string{fmt.Sprintf("bad@%d", ms), fmt.Sprintf("bad@%d", ms+1)}; !slices.Equal(sorted(ended), want) {
		t.Errorf("trigger keys ended %v, want %v: the queued trigger's and the buffered one's", ended, want)
	}
}

// A key put again while its trigger's fire runs (a second chain of one
// target and second: "that fire") goes when the fire ends; when the
// partition is released first, the release must delete it too, since the
// fire started here: the next owner fires every key it finds. Here the
// fire of target@at is held on node-a, the key is put again, and node-a
// leaves while the fire still runs (a task that neither retries nor keeps
// its fires apart: the release does not wait for it). The key used to stay
// for node-b, which fired target@at a second time.
func TestEngine_TriggerKeyPutAgainWhileItsFireRunsIsNotLeftAtARelease(t *testing.T) {
	c := etcdtest.Start(t)
	log := &callLog{}
	h := newHolder(t, "target")
	handler := log.handler(h.handler)
	a := startNode(t, c, "", handler, func(cfg *Config) {
		cfg.NodeID, cfg.Partitions, cfg.DrainTimeout = "node-a", 4, time.Minute
	})
	t.Cleanup(h.open)
	reg := a.e.Registry()
	putTask(t, reg, handlerTask("target", "0 0 0 1 1 *")) // yearly: only triggers fire it
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "target") })
	at := time.Now().Truncate(time.Second).UTC() // the scheduled time of the fires the chains end
	ctx := context.Background()
	if err := reg.TriggerAt(ctx, "target", at); err != nil {
		t.Fatal(err)
	}
	h.next(t) // it runs on node-a, held
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })
	// The second chain's trigger, while the fire runs.
	if err := reg.TriggerAt(ctx, "target", at); err != nil {
		t.Fatal(err)
	}
	k := triggerKey{part: reg.Partition("target"), id: "target", at: at.UnixNano()}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return inLoop(t, a, func(l *loop) bool { return l.triggered[k].again })
	})

	b := startNode(t, c, "", handler, func(cfg *Config) { cfg.NodeID, cfg.Partitions = "node-b", 4 })
	closed := closeInBackground(a) // releases every partition to node-b; the held fire runs on
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(b, "target") })
	time.Sleep(time.Second) // a repeat, if any
	var got []string
	for _, cl := range log.of("target") {
		got = append(got, cl.Node)
	}
	if len(got) != 1 {
		t.Errorf("target@%d ran on %v, want once, on node-a (one key: the owner fires it once)", at.UnixMilli(), got)
	}
	h.open()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return pendingTriggers(c) == 0 })
	b.stop(t)
}

// At a release's seal, a key put again while its fire waited or ran goes
// when that fire started here, and stays when the fire is handed over
// unrun: the next owner fires it, once.
func TestLoop_TriggerKeyPutAgainGoesAtTheSealUnlessItsFireIsHandedOver(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil) // its workers take nothing
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "ran") // yearly: only triggers fire them
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "queued")
	tl.putTrigger(0, "ran", base, 1)
	tl.pool.reset() // a worker took ran's fire
	keysOf(tl.pool.ends.take(10))
	tl.putTrigger(0, "queued", base, 2)
	tl.putTrigger(0, "ran", base, 3) // put again while its fire runs
	tl.putTrigger(0, "queued", base, 4)
	if got := keysOf(tl.pool.ends.take(10)); len(got) != 0 {
		t.Fatalf("keys ended %v before the fires did", got)
	}
	rel := tl.releaseNow(0)
	c := &sealCmd{rel: rel, queued: unrunAll, late: true, reply: make(chan struct{}, 1)} // queued's job was not taken in time
	tl.handle(c)
	<-c.reply
	if got, want := keysOf(tl.pool.ends.take(10)), []triggerKey{{0, "ran", base.UnixNano()}}; !slices.Equal(got, want) {
		t.Errorf("at the seal, keys ended %v, want %v: ran's fire started here, queued's is handed over unrun", got, want)
	}
	// The checkpoint names the fire that started here, at the put its
	// key's delete ends, and not the one handed over unrun: the next owner
	// would take queued's key for a fire that ran (handedTriggers).
	if got, want := rel.hand[0].fired, []firedTrigger{{ID: "ran", At: base, Rev: 3, WaitMS: triggerWait.Milliseconds(), UntilMS: base.Add(triggerWait).UnixMilli(), until: base.Add(triggerWait).UnixNano()}}; !slices.Equal(got, want) {
		t.Errorf("the release hands over the triggers %v as fired, want %v", got, want)
	}
}

// A release lists the triggers remembered within triggerWait, with what
// is left of it, and past maxFired the latest puts: listed whatever their
// age, and remembered afresh at each acquire, they were handed on for as
// long as the partition kept changing hands.
func TestLoop_ReleaseListsTheTriggersWithinTheirWaitAndTheLatest(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	now := base.UnixNano()
	for rev := int64(1); rev <= maxFired+1; rev++ {
		tl.triggered[triggerKey{0, "t", now + rev*int64(time.Millisecond)}] = seenTrigger{until: now + int64(time.Second), rev: rev, ended: true}
	}
	tl.triggered[triggerKey{0, "old", now}] = seenTrigger{until: now, rev: maxFired + 2, ended: true} // past its wait, not swept yet
	tl.triggered[triggerKey{1, "kept", now}] = seenTrigger{until: now + int64(time.Second), rev: 1, ended: true}
	for _, rev := range []int64{5, 9, 7} {
		tl.triggered[triggerKey{2, "few", now + rev}] = seenTrigger{until: now + int64(time.Second), rev: rev, ended: true}
	}
	hand := map[int]*handOver{0: {}, 2: {}}
	tl.handTriggers(hand)
	fired := hand[0].fired
	if len(fired) != maxFired || slices.ContainsFunc(fired, func(f firedTrigger) bool { return f.Rev < 2 || f.ID != "t" || f.WaitMS != 1000 }) {
		t.Errorf("listed %d triggers (want %d, of task t, revisions 2 on, 1000 ms left each): %v", len(fired), maxFired, fired[:min(len(fired), 3)])
	}
	// The latest first, under the bound too: a checkpoint too long sheds
	// its tail (tailHolding), which took them in the map's order.
	var revs []int64
	for _, f := range hand[2].fired {
		revs = append(revs, f.Rev)
	}
	if !slices.Equal(revs, []int64{9, 7, 5}) {
		t.Errorf("listed the revisions %v, want the latest first: [9 7 5]", revs)
	}

	// The next owner remembers each for what was left: then a key put
	// again is another trigger, which fires.
	next := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	h, err := next.scheds.Intern("0 0 0 1 1 *", "UTC", "t")
	if err != nil {
		t.Fatal(err)
	}
	handed := handedTo{fired: fired}
	next.handle(&loadCmd{part: 0, resume: now, defs: []taskDef{{id: "t", hash: xxhash.Sum64String("t"), sched: h, prof: prof}},
		handed: handed, first: true, done: make(chan struct{})})
	next.clock.Advance(time.Second)
	next.sweepTriggers()
	if n := len(next.triggered); n != 0 {
		t.Errorf("%d triggers remembered past what was left of their wait", n)
	}
}

// releasedAfterATrigger is a loop whose task t (with prof) in partition 0
// was triggered at base, its fire started, and the partition released
// and sealed after.
func releasedAfterATrigger(t *testing.T, base time.Time, prof *profile, after time.Duration) (*testLoop, release) {
	t.Helper()
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "t")
	tl.trigger(0, "t", base)
	tl.dispatchAll()
	tl.takeQueued() // it starts
	tl.clock.Advance(after)
	rel := tl.releaseNow(0)
	c := &sealCmd{rel: rel, reply: make(chan struct{}, 1)}
	tl.handle(c)
	<-c.reply
	return tl, rel
}

// A release lists a trigger that fired with what is left of its wait
// when it writes the checkpoint, not when it was sealed: the release
// waits for its markers and its trigger keys' deletes (5 s each at most),
// retries while etcd refuses it (up to the lease TTL), and a fenced node
// writes its hand-over when it takes the partition back, however long
// after. Left as at the seal, the next owner remembered the trigger past
// its 10 s, and took the key put again then, another fire, for it: the
// fire was missed.
func TestLoop_ReleaseListsWhatIsLeftOfATriggersWaitWhenItIsWritten(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prof := noopProfile(task.MisfireFireOnce)
	tl, rel := releasedAfterATrigger(t, base, prof, 2*time.Second)
	tl.clock.Advance(6 * time.Second) // the checkpoint is written 8 s after the trigger
	e := &Engine{cfg: tl.cfg, log: quietLogger()}
	var cp checkpoint
	if err := json.Unmarshal(e.encodeReleased([]int{0}, rel.hand)[0], &cp); err != nil {
		t.Fatal(err)
	}

	next := newTestLoop(t, tl.clock.Now(), nil)
	next.add(t, 0, tl.clock.Now(), prof, "0 0 0 1 1 *", "t")
	next.handedTriggers(0, cp.Fired)    // as its load does
	next.clock.Advance(3 * time.Second) // 11 s after the trigger
	next.sweepTriggers()
	next.putTrigger(0, "t", base, base.UnixMilli()+100) // a chain's, of a source fire at that time
	if got, want := next.dispatched(0), []string{fmt.Sprintf("t@%d", base.UnixMilli())}; !slices.Equal(got, want) {
		t.Errorf("the key put again 11 s after its trigger: dispatched %v, want %v (listed %+v)", got, want, cp.Fired)
	}
}

// An acquire's hold checkpoint keeps the triggers its predecessor listed
// as fired, for a successor should it crash before naming its session;
// that successor acquires once the crashed node's lease has ended, a TTL
// later at least. Remembering each for the wait listed, from its own
// acquire, it took a key put again well past the trigger's 10 s, another
// fire, for that fire, and ended it unrun.
func TestLoop_TriggerFiredIsRememberedThroughAHoldNoLongerThanItsWait(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prof := noopProfile(task.MisfireFireOnce)
	tl, rel := releasedAfterATrigger(t, base, prof, time.Second)
	e := &Engine{cfg: tl.cfg, log: quietLogger()}
	released := e.encodeReleased([]int{0}, rel.hand)[0]
	// The next owner's hold, then its crash.
	hold, err := json.Marshal(holdCheckpoint("node-b", rel.hand[0].mark, handingCheckpoint(released), nil, nil, 0))
	if err != nil {
		t.Fatal(err)
	}

	after := tl.clock.Now().Add(tl.cfg.LeaseTTL)
	next := newTestLoop(t, after, nil)
	next.add(t, 0, after, prof, "0 0 0 1 1 *", "t")
	next.handedTriggers(0, handingCheckpoint(hold).Fired) // as its load does
	next.clock.Advance(4 * time.Second)                   // 15 s after the trigger
	next.sweepTriggers()
	next.putTrigger(0, "t", base, base.UnixMilli()+100) // a chain's, of a source fire at that time
	if got, want := next.dispatched(0), []string{fmt.Sprintf("t@%d", base.UnixMilli())}; !slices.Equal(got, want) {
		t.Errorf("the key put again 15 s after its trigger: dispatched %v, want %v", got, want)
	}
}

// A trigger the partition's previous owner fired (handTriggers) is that
// fire here: its key put again ends unrun, as does its put that fired,
// should its delete not have reached etcd before the release.
func TestLoop_TriggerHandedOverAsFiredEndsUnrun(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)                         // its workers take nothing
	h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "ran") // yearly: only triggers fire it
	if err != nil {
		t.Fatal(err)
	}
	defs := []taskDef{{id: "ran", hash: xxhash.Sum64String("ran"), sched: h, prof: noopProfile(task.MisfireFireOnce)}}
	handed := handedTo{fired: []firedTrigger{{ID: "ran", At: base, Rev: 5, WaitMS: 5000}}}
	tl.handle(&loadCmd{part: 0, resume: base.UnixNano(), defs: defs, handed: handed, first: true, done: make(chan struct{})})
	k := triggerKey{0, "ran", base.UnixNano()}

	tl.putTrigger(0, "ran", base, 5) // the put that fired, its delete lost
	if got, want := tl.pool.ends.take(10), []triggerEnd{{k, 5}}; !slices.Equal(got, want) {
		t.Errorf("the put that fired on the previous owner: ended %v, want %v", got, want)
	}
	tl.putAgainOfItsTask(0, "ran", base, 9) // the second chain's
	if got, want := tl.pool.ends.take(10), []triggerEnd{{k, 9}}; !slices.Equal(got, want) {
		t.Errorf("the key put again: ended %v, want %v", got, want)
	}
	if got := tl.dispatched(0); len(got) != 0 {
		t.Errorf("dispatched %v, want nothing: the trigger fired on the previous owner", got)
	}
	tl.trigger(0, "ran", base.Add(time.Millisecond)) // another fire
	if got, want := tl.dispatched(0), []string{fmt.Sprintf("ran@%d", base.UnixMilli()+1)}; !slices.Equal(got, want) {
		t.Errorf("dispatched %v, want %v", got, want)
	}
}

// lateWatch creates the watches of keys ending in suffix only once
// created is closed: a watch whose creation took longer than the node's
// first acquire.
type lateWatch struct {
	clientv3.Watcher
	suffix  string
	created chan struct{}
}

func (w *lateWatch) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	if strings.HasSuffix(key, w.suffix) {
		select {
		case <-w.created:
		case <-ctx.Done():
		}
	}
	return w.Watcher.Watch(ctx, key, opts...)
}

// A trigger or backfill written after the node's first acquire read its
// partition, and before the node's watch was created, is the watch's: it
// follows from before the acquire. The watches followed from their
// creation, and such a trigger or backfill waited for the partition's next
// acquire, which could be days.
func TestEngine_TriggerWrittenBeforeTheWatchIsCreatedFires(t *testing.T) {
	for _, suffix := range []string{"/triggers/", "/backfills/"} {
		t.Run(strings.Trim(suffix, "/"), func(t *testing.T) {
			t.Parallel()
			c := etcdtest.Start(t)
			log := newFireLog()
			const parts = 4
			reg, err := registry.OpenRegistry(context.Background(), c.Client, DefaultPrefix, parts)
			if err != nil {
				t.Fatal(err)
			}
			putTask(t, reg, handlerTask("once", "0 0 0 1 1 *")) // yearly: only the trigger or backfill fires it (2020-01-01 once)
			cli := c.NewClient(t)
			late := &lateWatch{Watcher: cli.Watcher, suffix: suffix, created: make(chan struct{})}
			cli.Watcher = late
			n := startNodeOn(t, cli, "", log.handler, func(cfg *Config) { cfg.Partitions = parts })
			if suffix == "/triggers/" {
				_, err = reg.Trigger(context.Background(), "once")
			} else {
				from := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
				_, err = reg.Backfill(context.Background(), "once", from, from.Add(time.Hour), 1)
			}
			if err != nil {
				t.Fatal(err)
			}
			close(late.created)
			if !eventually(20*time.Second, func() bool { return len(log.forTask("once")) > 0 }) {
				t.Errorf("written before the watch was created, it never fired")
			}
			n.stop(t)
		})
	}
}

// A trigger names its task's id: written for a task that is then deleted
// and put again under the id, it must not fire the new task. "gone" is
// deleted and put again after its trigger, and triggered again; "edited"
// is put again changed after its trigger (the same task); "kept" is left
// as it was. The node sees the triggers after the delete and the put:
// through its acquire's read (the node starts after them), or through its
// trigger watch (created late, once the node applied them: a witness task
// of gone's partition put after them fired). Each trigger but gone's
// first must fire once, and every key must go: gone fired twice, the new
// task firing the old one's trigger.
func TestEngine_TriggerOfATaskDeletedAndPutAgainDoesNotFireTheNewTask(t *testing.T) {
	for _, path := range []string{"acquire", "watch"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := etcdtest.Start(t)
			const parts = 4
			reg, err := registry.OpenRegistry(ctx, c.Client, DefaultPrefix, parts)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"gone", "edited", "kept"} {
				putTask(t, reg, handlerTask(id, "0 0 0 1 1 *")) // yearly: only the triggers fire them
			}
			log := newFireLog()
			tweak := func(cfg *Config) { cfg.Partitions = parts }
			var n *testNode
			var late *lateWatch
			if path == "watch" {
				cli := c.NewClient(t)
				late = &lateWatch{Watcher: cli.Watcher, suffix: "/triggers/", created: make(chan struct{})}
				cli.Watcher = late
				n = startNodeOn(t, cli, "", log.handler, tweak)
			}
			trigger := func(id string) time.Time {
				t.Helper()
				at, err := reg.Trigger(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				return at
			}
			first := trigger("gone")
			edited, kept := trigger("edited"), trigger("kept")
			if err := reg.Delete(ctx, "gone"); err != nil {
				t.Fatal(err)
			}
			putTask(t, reg, handlerTask("gone", "0 0 0 1 1 *"))
			changed := handlerTask("edited", "0 0 0 1 1 *")
			changed.Labels = map[string]string{"v": "2"}
			putTask(t, reg, changed)
			again := trigger("gone")
			if late != nil {
				witness := "witness"
				for i := 0; reg.Partition(witness) != reg.Partition("gone"); i++ {
					witness = fmt.Sprintf("witness-%d", i)
				}
				putTask(t, reg, handlerTask(witness, "* * * * * *"))
				etcdtest.WaitFor(t, 20*time.Second, func() bool { return len(log.forTask(witness)) > 0 })
				close(late.created)
			} else {
				n = startNode(t, c, "", log.handler, tweak)
			}
			etcdtest.WaitFor(t, 20*time.Second, func() bool { return pendingTriggers(c) == 0 })
			n.stop(t)
			for id, want := range map[string]time.Time{"gone": again, "edited": edited, "kept": kept} {
				if got := log.forTask(id); len(got) != 1 || !got[0].Equal(want) {
					t.Errorf("%s fired at %v, want once at %v (gone's trigger before its delete: %v)", id, got, want, first)
				}
			}
		})
	}
}

// A trigger the loop sees once its partition took a task created after
// the trigger's key was written waits for the read of its task's creation
// (checkTriggers): written before its task was deleted and put again, it
// ends unrun, its key with it; written for the task as it is (created
// before the key), it fires. One written after every creation fires at
// once, unread.
func TestLoop_TriggerOlderThanACreationFiresOnlyTheTaskItWasWrittenFor(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "x", "y")
	// x deleted and put again, as one change of the partition's watch, at
	// revision 20.
	tl.recreate(t, "x", "0 0 0 1 1 *", prof, 20)
	ms := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }
	tl.putTrigger(0, "x", ms(1), 10) // before x was put again
	tl.putTrigger(0, "y", ms(2), 11) // y was created before it
	tl.putTrigger(0, "x", ms(3), 21) // after
	want := []string{fmt.Sprintf("x@%d", ms(3).UnixMilli())}
	if got := tl.dispatched(0); !slices.Equal(got, want) {
		t.Fatalf("dispatched %v before the creations were read, want %v", got, want)
	}
	asked := tl.checks.take(10)
	if len(asked) != 2 {
		t.Fatalf("%d triggers to check, want 2 (x's and y's older than x's creation)", len(asked))
	}
	tl.handle(&checkedCmd{fires: asked, created: map[string]int64{"x": 20, "y": 2}, rev: 22})
	want = append(want, fmt.Sprintf("y@%d", ms(2).UnixMilli()))
	if got := tl.dispatched(0); !slices.Equal(got, want) {
		t.Errorf("dispatched %v, want %v: x's trigger from before its delete fired the new x", got, want)
	}
	if got := keysOf(tl.pool.ends.take(10)); !slices.Equal(got, []triggerKey{{0, "x", ms(1).UnixNano()}}) {
		t.Errorf("keys ended %v, want x's from before its delete", got)
	}
}

// An answer of checkTriggers goes to the triggers it answers, and to no
// other: a trigger of the same task not in it stays checked, a trigger
// waiting for its task stays so, and an answer that names a task twice
// fires each of its triggers once. The loop holds the triggers being
// checked by task, not in one list it went through at each answer.
func TestLoop_CheckedAnswerGoesToTheTriggersItAnswersAlone(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "x", "y")
	// y deleted and put again at revision 20: every trigger older is read.
	tl.recreate(t, "y", "0 0 0 1 1 *", prof, 20)
	ms := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }
	fired := func(id string, n int) string { return fmt.Sprintf("%s@%d", id, ms(n).UnixMilli()) }
	tl.putTrigger(0, "x", ms(1), 10)
	tl.putTrigger(0, "x", ms(2), 11)
	tl.putTrigger(0, "y", ms(3), 12)
	tl.putTrigger(0, "gone", ms(4), 13) // its task never came: it waits
	asked := tl.checks.take(10)
	if len(asked) != 3 || tl.early.len() != 4 {
		t.Fatalf("%d triggers to check, %d early, want 3 and 4", len(asked), tl.early.len())
	}
	created := map[string]int64{"x": 5, "y": 5}
	tl.handle(&checkedCmd{fires: asked[:1], created: created, rev: 21})
	if got, want := tl.dispatched(0), []string{fired("x", 1)}; !slices.Equal(got, want) {
		t.Errorf("dispatched %v after x's first trigger was answered, want %v", got, want)
	}
	if got := tl.early.len(); got != 3 {
		t.Errorf("%d triggers early, want 3: x's second and y's checked, gone's waiting", got)
	}
	tl.handle(&checkedCmd{fires: []triggerFire{asked[1], asked[2], asked[1]}, created: created, rev: 22})
	if got, want := tl.dispatched(0), []string{fired("x", 1), fired("x", 2), fired("y", 3)}; !slices.Equal(got, want) {
		t.Errorf("dispatched %v, want %v", got, want)
	}
	if got := tl.early.len(); got != 1 {
		t.Errorf("%d triggers early, want gone's", got)
	}
	if got := tl.sweepPastWait(); !slices.Equal(got, []triggerKey{{0, "gone", ms(4).UnixNano()}}) {
		t.Errorf("keys ended past triggerWait %v, want gone's", got)
	}
}

// A release drops the checks of its partitions' triggers still queued
// (checkTriggers had not taken them): the next owner reads its triggers
// again, and the checks of the partitions the node keeps, queued behind
// a bulk trigger's of a partition gone, waited for reads of nobody's
// triggers.
func TestLoop_ReleaseDropsItsPartitionsQueuedChecks(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	for p, id := range []string{"x", "y"} {
		h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", id)
		if err != nil {
			t.Fatal(err)
		}
		def := taskDef{id: id, hash: xxhash.Sum64String(id), part: p, sched: h, prof: prof}
		// A task created at revision 20: every trigger older is read.
		tl.handle(&loadCmd{part: p, resume: base.UnixNano(), rev: 30, created: 20, defs: []taskDef{def}, first: true, done: make(chan struct{})})
	}
	at := base.Add(time.Millisecond)
	tl.putTrigger(0, "x", at, 10)
	tl.putTrigger(1, "y", at, 11)
	tl.releaseNow(0)
	if asked := tl.checks.take(10); len(asked) != 1 || asked[0].id != "y" {
		t.Errorf("checks queued after partition 0's release %v, want y's alone", asked)
	}
}

// A load read from etcd says when its tasks were created: a trigger
// written after the latest of those creations, though before the load's
// read, is its task's and fires at once, without a read of its task's
// creation. Every trigger an acquire read was older than the read, and
// each waited for a transaction of creation reads: 10 µs a trigger, in
// sequence, behind a bulk trigger pending at a hand-over.
func TestLoop_TriggerAfterTheLoadsLatestCreationFiresWithoutACheck(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "x")
	if err != nil {
		t.Fatal(err)
	}
	def := taskDef{id: "x", hash: xxhash.Sum64String("x"), sched: h, prof: prof}
	// x created at revision 5, the partition read at 30.
	tl.handle(&loadCmd{part: 0, resume: base.UnixNano(), rev: 30, created: 5, defs: []taskDef{def}, first: true, done: make(chan struct{})})
	at := base.Add(time.Millisecond)
	tl.putTrigger(0, "x", at, 10)
	if got, want := tl.dispatched(0), []string{fmt.Sprintf("x@%d", at.UnixMilli())}; !slices.Equal(got, want) {
		t.Errorf("dispatched %v, want %v at once", got, want)
	}
	if asked := tl.checks.take(10); len(asked) != 0 {
		t.Errorf("%d triggers to check, want none: x was created before its trigger", len(asked))
	}
}

// An acquire from the Badger cache knows when its tasks were created, as
// one from etcd does: the cache keeps each task's creation revision, and
// the acquire's catch-up reads those of the tasks changed since. A
// trigger written after its task's creation, while the node was down,
// fires without a read of that creation: the acquire's latest creation
// (partState.created) is the latest task's, not the acquisition's
// revision, past every trigger the acquire reads, each of which then
// waited for a read (10 µs each, in sequence). A cache written before
// creations were kept does not say, and the acquire's revision stands
// for it, as before.
func TestEngine_TriggerAfterTheCachedLatestCreationFiresWithoutACheck(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name    string
		old     bool // cached by a version that did not keep creations
		changed bool // y created while the node was down, before the trigger
	}{
		{name: "cached"},
		{name: "cached, y created since", changed: true},
		{name: "cached before creations were kept", old: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "/" + t.Name()
			tweak := func(cfg *Config) { cfg.Partitions, cfg.Prefix = 1, prefix }
			log := newFireLog()
			dir := t.TempDir()
			a := startNode(t, c, dir, log.handler, tweak)
			putTask(t, a.e.Registry(), handlerTask("x", "0 0 0 1 1 *")) // yearly: only the trigger fires it
			// The watch caches x before the loop has it.
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				return inLoop(t, a, func(l *loop) bool { _, _, ok := l.tab.lookup("x"); return ok })
			})
			a.stop(t)
			if tc.old {
				st, err := store.Open(store.DefaultConfig(dir))
				if err != nil {
					t.Fatal(err)
				}
				var kvs []store.KV
				rev, err := st.Partition(0, func(id string, v []byte, _ int64) error {
					kvs = append(kvs, store.KV{ID: id, Value: bytes.Clone(v)})
					return nil
				})
				if err == nil {
					err = st.Reset(0, rev, kvs)
				}
				if err := errors.Join(err, st.Close()); err != nil {
					t.Fatal(err)
				}
			}
			reg, err := registry.OpenRegistry(ctx, c.Client, prefix, 1)
			if err != nil {
				t.Fatal(err)
			}
			if tc.changed {
				putTask(t, reg, handlerTask("y", "0 0 0 1 1 *"))
			}
			at, err := reg.Trigger(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			tasks, err := c.Client.Get(ctx, prefix+"/tasks/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			var latest int64 // the latest creation of a task
			for _, kv := range tasks.Kvs {
				latest = max(latest, kv.CreateRevision)
			}
			trig, err := c.Client.Get(ctx, prefix+"/triggers/", clientv3.WithPrefix())
			if err != nil || len(trig.Kvs) != 1 {
				t.Fatalf("x's trigger in etcd: %v, %v", trig, err)
			}

			b := startNode(t, c, dir, log.handler, tweak)
			if loads := b.e.Stats().FullLoads; loads != 0 {
				t.Fatalf("%d full reads of the partition at the restart, want it from the cache", loads)
			}
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("x")) > 0 })
			var created int64
			inLoop(t, b, func(l *loop) bool { created = l.parts[0].created; return true })
			if got := log.forTask("x"); len(got) != 1 || !got[0].Equal(at) {
				t.Errorf("x fired at %v, want once at %v", got, at)
			}
			switch trigRev := trig.Kvs[0].ModRevision; {
			case !tc.old && created != latest:
				t.Errorf("the acquire's latest creation is revision %d, want the latest task's, %d (the trigger's %d): the trigger was read", created, latest, trigRev)
			case tc.old && created <= trigRev:
				t.Errorf("from a cache without creations, the acquire's latest creation is revision %d, want past the trigger's, %d", created, trigRev)
			}
		})
	}
}

// A trigger key put again after its trigger fired here is that fire only
// while its task is the one that fire was of. Put again after the task
// was deleted and put again under its id (a chain's trigger of the new
// task, whose source fire has the time of another chain's that fired the
// task before), it is the new task's trigger, another fire: it ended
// unrun, taken for the fire of the task before. The task's creation is
// read first, also before the partition's watch brings the task put again:
// one created before the key that fired is still that fire's, and one
// created after the key put again makes it a trigger of the task before,
// unrun.
func TestLoop_TriggerKeyPutAgainAfterItsTaskWasPutAgainIsAnotherFire(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := base.Add(time.Millisecond)
	k := triggerKey{0, "x", at.UnixNano()}
	fired := fmt.Sprintf("x@%d", at.UnixMilli())
	for _, tc := range []struct {
		name      string
		changed   string // the task put at revision 20, created then
		late      bool   // the loop is told of the change after the key put again
		putAgain  int64  // the revision of the key put again
		xCreated  int64  // x's creation revision, as checkTriggers reads it
		wantFires []string
		wantEnds  []triggerKey
	}{
		{"x deleted and put again before the key", "x", false, 21, 20, []string{fired}, nil},
		{"x deleted and put again before the key, told late", "x", true, 21, 20, []string{fired}, nil},
		{"another task created before the key", "y", false, 21, 5, nil, []triggerKey{k}},
		{"x deleted and put again after the key", "x", false, 15, 20, nil, []triggerKey{k}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTestLoop(t, base, nil) // its workers take nothing
			prof := noopProfile(task.MisfireFireOnce)
			tl.add(t, 0, base, prof, "0 0 0 1 1 *", "x")
			tl.putTrigger(0, "x", at, 10)
			j := tl.takeQueued() // a worker took the fire: its key went
			tl.end(j, statusOK)
			h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", tc.changed)
			if err != nil {
				t.Fatal(err)
			}
			change := func() {
				if tc.changed == "x" {
					tl.handle(&eventsCmd{part: 0, deletes: []string{"x"}, rev: 19})
				}
				def := taskDef{id: tc.changed, hash: xxhash.Sum64String(tc.changed), sched: h, prof: prof}
				tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def}, rev: 20, created: 20})
			}
			if !tc.late {
				change()
			}
			tl.putTrigger(0, "x", at, tc.putAgain)
			tl.putTrigger(0, "x", at, tc.putAgain) // delivered twice: the watch and an acquire's read
			if asked := tl.checks.take(10); len(asked) > 0 {
				tl.handle(&checkedCmd{fires: asked, created: map[string]int64{"x": tc.xCreated}, rev: 22})
			}
			if tc.late {
				change()
			}
			if got := tl.dispatched(0); !slices.Equal(got, tc.wantFires) {
				t.Errorf("dispatched %v, want %v", got, tc.wantFires)
			}
			if got := keysOf(tl.pool.ends.take(10)); !slices.Equal(got, tc.wantEnds) {
				t.Errorf("keys ended %v, want %v", got, tc.wantEnds)
			}
		})
	}
}

// A trigger key put again twice after its trigger fired here, before the
// read of its task's creation, waits for two checks, which one answer can
// carry both of: each is answered, in the order the key was put. Only the
// later was, and the earlier stayed early, its read under way as far as
// the sweep could tell, for as long as the node held the partition:
// the key of the task put again between the fire and the first put never
// fired, taken for that fire's by the second put's answer.
func TestLoop_TriggerKeyPutAgainTwiceIsAnsweredInOneAnswer(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := base.Add(time.Millisecond)
	k := triggerKey{0, "x", at.UnixNano()}
	fired := fmt.Sprintf("x@%d", at.UnixMilli())
	for _, tc := range []struct {
		name      string
		created   int64 // x deleted and put again at this revision (0: not)
		puts      [2]int64
		xCreated  int64 // x's creation revision, as checkTriggers reads it
		wantFires []string
		wantEnds  []triggerEnd // the puts ended: the key holds the later until it goes
		wantAgain bool         // the later put is the fire's: its key goes when the fire ends
	}{
		{"both that fire's", 0, [2]int64{21, 22}, 5, nil, []triggerEnd{{k, 21}, {k, 22}}, false},
		{"x put again before both", 20, [2]int64{21, 22}, 20, []string{fired}, nil, true},
		{"x put again between them", 22, [2]int64{21, 23}, 22, []string{fired}, []triggerEnd{{k, 21}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTestLoop(t, base, nil) // its workers take nothing
			prof := noopProfile(task.MisfireFireOnce)
			tl.add(t, 0, base, prof, "0 0 0 1 1 *", "x")
			tl.putTrigger(0, "x", at, 10)
			tl.end(tl.takeQueued(), statusOK) // a worker took the fire: its key went
			if tc.created != 0 {
				h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "x")
				if err != nil {
					t.Fatal(err)
				}
				tl.handle(&eventsCmd{part: 0, deletes: []string{"x"}, rev: tc.created - 1})
				def := taskDef{id: "x", hash: xxhash.Sum64String("x"), sched: h, prof: prof}
				tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def}, rev: tc.created, created: tc.created})
			}
			for _, rev := range tc.puts {
				tl.putTrigger(0, "x", at, rev)
			}
			asked := tl.checks.take(10)
			if len(asked) != 2 {
				t.Fatalf("%d triggers to check, want the key's two puts", len(asked))
			}
			tl.handle(&checkedCmd{fires: asked, created: map[string]int64{"x": tc.xCreated}, rev: 30})
			if got := tl.dispatched(0); !slices.Equal(got, tc.wantFires) {
				t.Errorf("dispatched %v, want %v", got, tc.wantFires)
			}
			if got := tl.pool.ends.take(10); !slices.Equal(got, tc.wantEnds) {
				t.Errorf("puts ended %v, want %v", got, tc.wantEnds)
			}
			if n := tl.early.len(); n != 0 {
				t.Errorf("%d triggers early after the answer, want none", n)
			}
			if tc.wantAgain {
				tl.end(tl.takeQueued(), statusOK)
				if got, want := tl.pool.ends.take(10), []triggerEnd{{k, tc.puts[1]}}; !slices.Equal(got, want) {
					t.Errorf("puts ended with the fire %v, want %v", got, want)
				}
			}
		})
	}
}

// A key queued twice is deleted once, at its later put: a key put again
// after its fire (that fire's) ends at each put, and the delete of the
// earlier could only find the later (registry.DeleteTriggers).
func TestLatestPuts_AKeyQueuedTwiceGoesOnceAtItsLaterPut(t *testing.T) {
	x, y := triggerKey{0, "x", 1}, triggerKey{1, "y", 1}
	got := latestPuts([]triggerEnd{{x, 21}, {y, 5}, {x, 23}, {y, 5}, {x, 22}})
	if want := []triggerEnd{{x, 23}, {y, 5}}; !slices.Equal(got, want) {
		t.Errorf("deletes %v, want %v", got, want)
	}
}

// A trigger's job carries the revision of the put of its key that it
// fires, whose delete its start queues (triggerEnd), also when it waited
// behind a running fire (concurrency buffer_one); and a trigger its
// policy skips ends its own put.
func TestLoop_TriggerJobEndsThePutItFires(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil) // its workers take nothing
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.concurrency = "noop/buffer_one", task.ConcurrencyBufferOne
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "x")
	key := func(ms int) triggerKey {
		return triggerKey{0, "x", base.Add(time.Duration(ms) * time.Millisecond).UnixNano()}
	}
	tl.putTrigger(0, "x", base, 5)
	j := tl.takeQueued()
	if got, want := j.triggerEnd(), (triggerEnd{key(0), 5}); got != want {
		t.Errorf("the fire ends the put %v, want %v", got, want)
	}
	tl.putTrigger(0, "x", base.Add(time.Millisecond), 6)   // waits for the fire running
	tl.putTrigger(0, "x", base.Add(2*time.Millisecond), 7) // skipped: a fire waits already
	if got, want := tl.pool.ends.take(10), []triggerEnd{{key(2), 7}}; !slices.Equal(got, want) {
		t.Errorf("the skipped trigger ended %v, want %v", got, want)
	}
	tl.end(j, statusOK)
	j = tl.takeQueued()
	if got, want := j.triggerEnd(), (triggerEnd{key(1), 6}); got != want {
		t.Errorf("the fire that waited ends the put %v, want %v", got, want)
	}
}

// The put of a trigger key that ended here goes, not the key: put again
// since, at revision 23, after its task was deleted and put again at 22,
// it is the new task's trigger, which the node that ended the put at 21
// (its task created after it) would have fired had its partition not
// left first. The next owner finds it and fires it. The delete took the
// key whatever it held, and that trigger was lost. Node-a's delete comes
// late here, after its partition went: a deleter behind, or the release's
// own delete of its started triggers.
func TestEngine_TriggerKeyPutAgainAfterTheEndOfItsPutFiresOnTheNextOwner(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := "/" + t.Name()
	tweak := func(cfg *Config) { cfg.Partitions, cfg.Prefix = 1, prefix }
	log := newFireLog()
	a := startNode(t, c, "", log.handler, tweak)
	reg, err := registry.OpenRegistry(ctx, c.Client, prefix, 1)
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("x", "0 0 0 1 1 *")) // yearly: only the trigger fires it
	ea := a.e
	a.stop(t)
	at, err := reg.Trigger(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	trig, err := c.Client.Get(ctx, prefix+"/triggers/", clientv3.WithPrefix())
	if err != nil || len(trig.Kvs) != 1 {
		t.Fatalf("x's trigger in etcd: %v, %v", trig, err)
	}
	if err := reg.Delete(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("x", "0 0 0 1 1 *"))
	if _, err := c.Client.Put(ctx, string(trig.Kvs[0].Key), ""); err != nil { // the new x's trigger
		t.Fatal(err)
	}
	ended := triggerEnd{triggerKey{0, "x", at.UnixNano()}, trig.Kvs[0].ModRevision}
	if err := ea.deleteTriggerKeys(ctx, []triggerEnd{ended}); err != nil {
		t.Fatal(err)
	}

	b := startNode(t, c, "", log.handler, tweak)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("x")) > 0 })
	if got := log.forTask("x"); len(got) != 1 || !got[0].Equal(at) {
		t.Errorf("x fired at %v, want once at %v", got, at)
	}
	b.stop(t)
}

// A key put again after its trigger's fire started here, released while
// the read of its task's creation is under way, is taken for that fire, as
// one put again with no creation in its partition since: its key goes
// before the release commits. Forgotten with the early triggers, it was
// left for the next owner, which fired it again.
func TestLoop_TriggerKeyPutAgainUnreadAtAReleaseIsThatFire(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil) // its workers take nothing
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "x")
	tl.putTrigger(0, "x", base, 10)
	tl.pool.reset() // a worker took x's fire, which runs
	tl.putTrigger(0, "x", base, 21)
	if asked := tl.checks.take(10); len(asked) != 1 {
		t.Fatalf("%d triggers to check, want x's key put again", len(asked))
	}
	rel := tl.releaseNow(0)
	c := &sealCmd{rel: rel, late: true, reply: make(chan struct{}, 1)}
	tl.handle(c)
	<-c.reply
	if got, want := keysOf(tl.pool.ends.take(10)), []triggerKey{{0, "x", base.UnixNano()}}; !slices.Equal(got, want) {
		t.Errorf("at the seal, keys ended %v, want %v: x's fire started here", got, want)
	}
}

// A trigger of a task put again after a delete, that the trigger watch
// brings before the partition's watch brings the delete, fires the task
// put again: written after the delete, it is that task's trigger. Its fire
// on the task before, which the loop still held, was dropped with the
// delete, its key ended, and the new task never fired from it. One written
// before the delete is the deleted task's, and ends. So when the put hides
// the delete (a reload after a compaction, read at 20): the delete is as of
// the revision before the put's creation; as of the reload's, the trigger
// written after the put ended unrun.
func TestLoop_TriggerAfterADeleteTheLoopHadNotAppliedWaitsForThePut(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := base.Add(time.Millisecond)
	for _, tc := range []struct {
		name      string
		rev       int64 // the trigger's key's
		hidden    bool  // the delete comes with the put, which hides it
		wantFires []string
		wantEnds  []triggerKey
	}{
		{"written after the delete", 13, false, []string{fmt.Sprintf("x@%d", at.UnixMilli())}, nil},
		{"written before the delete", 10, false, nil, []triggerKey{{0, "x", at.UnixNano()}}},
		{"written after the put that hides the delete", 13, true, []string{fmt.Sprintf("x@%d", at.UnixMilli())}, nil},
		{"written before the delete the put hides", 10, true, nil, []triggerKey{{0, "x", at.UnixNano()}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTestLoop(t, base, nil) // its workers take nothing
			prof := noopProfile(task.MisfireFireOnce)
			h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "x")
			if err != nil {
				t.Fatal(err)
			}
			def := taskDef{id: "x", hash: xxhash.Sum64String("x"), sched: h, prof: prof, createRev: 5}
			tl.handle(&loadCmd{part: 0, resume: base.UnixNano(), rev: 9, created: 5, defs: []taskDef{def}, first: true, done: make(chan struct{})})
			tl.putTrigger(0, "x", at, tc.rev)
			// x deleted at 11 and put again at 12.
			again := def
			again.createRev = 12
			if tc.hidden {
				tl.handle(&eventsCmd{part: 0, upserts: []taskDef{again}, replace: true, rev: 20, created: 12})
			} else {
				tl.handle(&eventsCmd{part: 0, deletes: []string{"x"}, rev: 11})
				tl.handle(&eventsCmd{part: 0, upserts: []taskDef{again}, rev: 12, created: 12})
			}
			if asked := tl.checks.take(10); len(asked) > 0 {
				tl.handle(&checkedCmd{fires: asked, created: map[string]int64{"x": 12}, rev: 20})
			}
			if got := tl.dispatched(0); !slices.Equal(got, tc.wantFires) {
				t.Errorf("dispatched %v, want %v", got, tc.wantFires)
			}
			if got := keysOf(tl.pool.ends.take(10)); !slices.Equal(got, tc.wantEnds) {
				t.Errorf("keys ended %v, want %v", got, tc.wantEnds)
			}
		})
	}
}

// earlyTriggers.keepOf hands keep the triggers it holds, in place: what
// keep changes stays, and a pass allocates nothing. It handed keep a copy
// of each, which escaped: an allocation a trigger, at each answer of
// checkTriggers and each second's sweep, 100 000 of them behind a bulk
// trigger pending.
func TestEarlyTriggers_KeepOfChangesTheTriggersInPlace(t *testing.T) {
	var e earlyTriggers
	for i := range 100 {
		e.add(triggerFire{part: 0, id: "x", at: int64(i), rev: 10, checking: true})
	}
	if n := testing.AllocsPerRun(10, func() {
		e.keepOf("x", func(f *triggerFire) bool { f.checked++; return true })
	}); n != 0 {
		t.Errorf("%v allocations a pass over 100 triggers, want none", n)
	}
	e.keepOf("x", func(f *triggerFire) bool { return f.at%2 == 0 })
	if got := e.len(); got != 50 {
		t.Fatalf("%d triggers kept, want 50", got)
	}
	for i, f := range e.byTask["x"] {
		if f.at != int64(2*i) || f.checked != 11 {
			t.Errorf("trigger %d: at %d, checked %d; want at %d, checked 11", i, f.at, f.checked, 2*i)
		}
	}
}

// retrying ends with ctx's error when ctx ends during its backoff, and
// tries no more: it tried once again with a dead context, and returned
// that try's error.
func TestRetrying_EndsWithItsContextDuringTheBackoff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tries := 0
	err := retrying(ctx, func(context.Context) error {
		tries++
		return errors.New("refused")
	}, func(error, time.Duration) { cancel() })
	if tries != 1 || !errors.Is(err, context.Canceled) {
		t.Errorf("%d tries, error %v; want 1 try and the context's error", tries, err)
	}
}

// A trigger of a paused task runs (its first attempt), on its owner. One a
// worker took before its partition's release and that the node's stop then
// met unrun is handed on through etcd as attempt 1 of its fire
// (leavers.unrun), and the next owner skipped it for the pause, as it
// skips a retry: the trigger was run nowhere. The key says that the fire
// is a trigger's (registry.Retry.Trigger): its first attempt runs while
// the task is paused, paused before the key comes or while its job waits
// for a worker, and a first attempt of the schedule's handed on so is
// still skipped.
func TestLoop_TriggersFirstAttemptHandedOnUnrunRunsWhileItsTaskIsPaused(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sched := at.Add(-2 * time.Second)
	for _, tc := range []struct {
		name           string
		trigger, early bool // a trigger's fire; paused before the key comes, else while its job is queued
		want           []string
	}{
		{"trigger, paused before", true, true, []string{fmt.Sprintf("p@%d", sched.UnixMilli())}},
		{"trigger, paused while queued", true, false, []string{fmt.Sprintf("p@%d", sched.UnixMilli())}},
		{"schedule, paused before", false, true, nil},
		{"schedule, paused while queued", false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTestLoop(t, at, nil)
			prof := noopProfile(task.MisfireFireOnce)
			h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "p")
			if err != nil {
				t.Fatal(err)
			}
			def := func(paused bool) taskDef {
				return taskDef{id: "p", hash: xxhash.Sum64String("p"), part: 0, sched: h, prof: prof, paused: paused}
			}
			tl.handle(&loadCmd{part: 0, resume: at.UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def(tc.early)}})
			tl.putRetry(0, "p", sched.Add(time.Millisecond), 5, registry.Retry{Attempt: 1, Due: at, At: sched, Trigger: tc.trigger})
			tl.dispatch()
			if !tc.early {
				tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(true)}})
			}
			if got := tl.dispatched(0); !slices.Equal(got, tc.want) {
				t.Errorf("dispatched %v, want %v", got, tc.want)
			}
		})
	}
}

// A trigger's first attempt handed on through etcd (registry.Retry.Trigger)
// runs while its task is paused. Still waiting for its due time when its
// partition goes again, it goes to the next owner in the released
// checkpoint, or in the watermark should this node crash: listed as a
// plain first attempt there, a pause on the next owner skipped it.
func TestLoop_TriggersFirstAttemptHandedOverAgainRunsWhileItsTaskIsPaused(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sched, due := at.Add(-2*time.Second), at.Add(10*time.Second)
	for _, tc := range []struct {
		name     string
		trigger  bool
		released bool // handed over in the released checkpoint, else in the watermark
		want     []string
	}{
		{"trigger, released", true, true, []string{fmt.Sprintf("p@%d", sched.UnixMilli())}},
		{"trigger, watermark", true, false, []string{fmt.Sprintf("p@%d", sched.UnixMilli())}},
		{"schedule, released", false, true, nil},
		{"schedule, watermark", false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prof := noopProfile(task.MisfireFireOnce)
			def := func(tl *testLoop, paused bool) taskDef {
				h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "p")
				if err != nil {
					t.Fatal(err)
				}
				return taskDef{id: "p", hash: xxhash.Sum64String("p"), part: 0, sched: h, prof: prof, paused: paused}
			}
			first := newTestLoop(t, at, nil)
			first.handle(&loadCmd{part: 0, resume: at.UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def(first, false)}})
			first.putRetry(0, "p", sched.Add(time.Millisecond), 5, registry.Retry{Attempt: 1, Due: due, At: sched, Trigger: tc.trigger})
			first.dispatch()
			var fires []pendingFire
			if tc.released {
				fires = first.releaseNow(0).hand[0].pending
			} else {
				fires = first.waitingRetriesOf(0).Fires
			}
			if len(fires) != 1 {
				t.Fatalf("handed over %+v, want the waiting retry", fires)
			}
			b, err := json.Marshal(fires) // as a checkpoint or a watermark carries them
			if err != nil {
				t.Fatal(err)
			}
			fires = nil
			if err := json.Unmarshal(b, &fires); err != nil {
				t.Fatal(err)
			}

			next := newTestLoop(t, at, nil)
			next.handle(&loadCmd{part: 0, resume: at.UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def(next, true)}})
			next.handle(&takeOverCmd{part: 0, fires: fires})
			next.clock.Advance(due.Sub(at))
			next.dispatch()
			if got := next.dispatched(0); !slices.Equal(got, tc.want) {
				t.Errorf("dispatched %v, want %v", got, tc.want)
			}
		})
	}
}
