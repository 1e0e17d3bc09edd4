package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// backfillProgress reads the task's backfill record.
func backfillProgress(t *testing.T, reg *registry.Registry, id string) *task.Backfill {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := reg.GetBackfill(ctx, id)
	if err != nil || b == nil {
		t.Fatalf("backfill of %s: %v, %v", id, b, err)
	}
	return b
}

// backfillRunning reports whether node n runs a backfill of task id.
func backfillRunning(n *testNode, id string) bool {
	n.e.bf.mu.Lock()
	defer n.e.bf.mu.Unlock()
	_, ok := n.e.bf.runs[id]
	return ok
}

// directRegistry is a registry on the cluster's own client, which no
// proxy cuts.
func directRegistry(t *testing.T, c *etcdtest.Cluster) *registry.Registry {
	t.Helper()
	reg, err := registry.OpenRegistry(context.Background(), c.Client, "", 16)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// A backfill runs every scheduled time of [from, to] once, with the
// fires' usual idempotency keys, while its task's partition changes hands
// in the middle of it: gracefully (the owner leaves) nothing repeats; after
// a crash at most the backfill's lead repeats. Nothing is missed either way,
// and the record ends done with every fire counted.
func TestEngine_BackfillSurvivesAHandOver(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"graceful", "crash"} {
		t.Run(how, func(t *testing.T) {
			c := etcdtest.Start(t)
			log := newFireLog()
			now := time.Now().Truncate(time.Second)
			from, to := now.Add(-240*time.Second), now.Add(-time.Second)
			h := func(ctx context.Context, f Fire) error {
				_ = log.handler(ctx, f)
				if !f.ScheduledAt.After(to) {
					time.Sleep(20 * time.Millisecond) // a backfill fire: slow enough to be cut in the middle
				}
				return nil
			}
			node := func(id string) func(*Config) {
				return func(cfg *Config) {
					cfg.NodeID = id
					// Fewer workers than the backfill's concurrency: some of
					// its fires wait in the queue, and a crash drops them.
					cfg.Workers = 4
					cfg.DrainTimeout = 5 * time.Second
					cfg.MisfireThreshold = time.Minute
				}
			}
			proxy := c.NewProxy(t)
			a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", h, node("node-a"))
			reg := a.e.Registry()
			putTask(t, reg, handlerTask("bf", "* * * * * *"))
			const concurrency = 8
			b, err := reg.Backfill(context.Background(), "bf", from, to, concurrency)
			if err != nil {
				t.Fatal(err)
			}
			if b.Fires != 240 {
				t.Fatalf("the backfill counts %d fires, want 240", b.Fires)
			}
			if _, err := reg.Backfill(context.Background(), "bf", from, to, concurrency); err == nil {
				t.Error("a second backfill was accepted while the first runs")
			}
			etcdtest.WaitFor(t, 20*time.Second, func() bool { return backfillProgress(t, directRegistry(t, c), "bf").Done >= 40 })
			switch how {
			case "graceful":
				startNode(t, c, "", h, node("node-b"))
				a.stop(t)
			case "crash":
				crash(t, a, proxy)
				startNode(t, c, "", h, node("node-b"))
			}
			rb := directRegistry(t, c)
			etcdtest.WaitFor(t, 30*time.Second, func() bool { return backfillProgress(t, rb, "bf").State == task.BackfillDone })
			got := backfillProgress(t, rb, "bf")
			if got.Done != 240 || !got.Through.Equal(to) || got.Node != "node-b" {
				t.Errorf("final record %+v, want 240 fires done through %s by node-b", got, to)
			}
			repeats, repeated := 0, []string{}
			for at := from; !at.After(to); at = at.Add(time.Second) {
				key := fmt.Sprintf("bf@%d", at.UnixMilli())
				log.mu.Lock()
				n := log.seen[key]
				log.mu.Unlock()
				switch {
				case n == 0:
					t.Errorf("%s never ran", key)
				case n > 1:
					repeats += n - 1
					repeated = append(repeated, fmt.Sprintf("%d (#%d) x%d", at.UnixMilli(), int(at.Sub(from)/time.Second), n))
				}
			}
			switch {
			case how == "graceful" && repeats > 0:
				t.Errorf("%d backfill fires repeated across a graceful hand-over: %v", repeats, repeated)
			case how == "crash" && repeats > backfillLead(concurrency):
				t.Errorf("%d backfill fires repeated after a crash, more than the lead %d: %v", repeats, backfillLead(concurrency), repeated)
			}
			t.Logf("%s: %d repeats", how, repeats)
			a.stop(t)
		})
	}
}

// A backfill's concurrency holds across a graceful hand-over: the
// releasing node waits for its fires under way as for runs kept apart
// (Config.ReleaseRunWait) and marks those past the wait with how many
// they are, and the next owner's runner counts them against the
// concurrency until the marker goes (elsewhere.go). Here a backfill of
// concurrency 2 has its first fires held on node-a when node-a leaves
// gracefully: node-b, which continues after them, starts none of its own
// while they run, and the fires never run more than 2 at once across the
// two nodes (without the markers node-b started 2 beside node-a's, 4 at
// once).
func TestEngine_BackfillConcurrencyAcrossAGracefulHandOver(t *testing.T) {
	const concurrency = 2
	ho := startBackfillHandOver(t, concurrency, nil)
	a, b, h, id := ho.a, ho.b, ho.h, ho.id
	var old []blocked
	for range concurrency {
		r := h.next(t)
		if r.Node != "node-a" {
			t.Fatalf("started %s@%s on %s, want node-a's", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
		}
		old = append(old, r)
	}
	closed := closeInBackground(a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, id) && backfillRunning(b, id) })
	ho.noneStarts(t, b, 0, 0, fmt.Sprintf("while node-a's %d fires of the backfill ran, of a concurrency of %d", len(old), concurrency))
	for _, r := range old {
		if !r.running() {
			t.Fatalf("node-a's fire %s ended before it was let go", r.ScheduledAt.Format(time.TimeOnly))
		}
	}
	if n := a.e.Stats().RunsMarked; n != 1 {
		t.Errorf("node-a marked %d runs, want 1 (the task's, of %d fires of its backfill)", n, concurrency)
	}
	ho.finish(t, concurrency, b, closed)
}

// A backfill's concurrency holds too for its fires a graceful release
// hands over unrun (still queued past the release's wait for busy
// workers): the next owner counts them as in flight until each ends
// there, and marks those still going when it releases the partition in
// turn, as its runner's own. Here a backfill of concurrency 3 has its
// first fire held on node-a, whose one worker leaves the next two
// queued, when node-a leaves gracefully: node-b runs the two handed over
// beside node-a's marked one and starts none of its own while they run
// (without the count it started 2 beside them, 4 at once on node-b);
// nor does node-c once node-b leaves too (without the marks it started
// 2 beside the 3, 5 at once).
func TestEngine_BackfillConcurrencyHoldsForItsFiresHandedOverUnrun(t *testing.T) {
	for _, again := range []bool{false, true} {
		t.Run(map[bool]string{false: "taken over", true: "released again"}[again], func(t *testing.T) {
			const concurrency = 3
			ho := startBackfillHandOver(t, concurrency, func(cfg *Config) {
				if cfg.NodeID == "node-a" {
					cfg.Workers = 1
				}
			})
			a, b, h, id := ho.a, ho.b, ho.h, ho.id
			if r := h.next(t); r.Node != "node-a" || !r.ScheduledAt.Equal(limitsAt(-9)) {
				t.Fatalf("started %s@%s on %s, want node-a's first", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
			}
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return a.e.Stats().QueueDepth == concurrency-1 })
			closed := []<-chan error{closeInBackground(a)}
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, id) && backfillRunning(b, id) })
			handed := map[time.Time]bool{limitsAt(-8): true, limitsAt(-7): true}
			for len(handed) > 0 {
				r := h.next(t)
				if r.Node != "node-b" || !handed[r.ScheduledAt] {
					t.Fatalf("started %s@%s on %s, want the fires node-a handed over unrun, on node-b",
						r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
				}
				delete(handed, r.ScheduledAt)
			}
			why := fmt.Sprintf("beside the backfill's 3 fires under way (2 handed over unrun), of a concurrency of %d", concurrency)
			ho.noneStarts(t, b, 2, 0, why)
			last := b
			if again {
				last = ho.start("node-c")
				closed = append(closed, closeInBackground(b))
				etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(last, id) && backfillRunning(last, id) })
				ho.noneStarts(t, last, 0, 0, why)
				if n := b.e.Stats().RunsMarked; n != 1 {
					t.Errorf("node-b marked %d runs, want 1 (the task's, of the 2 fires handed over to it)", n)
				}
			}
			ho.finish(t, concurrency, last, closed...)
		})
	}
}

// The next owner starts a backfill's runner only once it took over the
// fires handed over, which the runner counts from its start: not for a
// record its watch delivers late, while the acquire loads the partition.
// Here node-b's loop is held as it acquires node-a's partition, and the
// backfill's record comes then: it started a runner, whose fires could
// go before the fires handed over, and not count them.
func TestEngine_BackfillRunnerStartsOnceTheAcquireTookTheFiresOver(t *testing.T) {
	const concurrency = 1
	ho := startBackfillHandOver(t, concurrency, nil)
	a, b, id := ho.a, ho.b, ho.id
	if r := ho.h.next(t); r.Node != "node-a" {
		t.Fatalf("started %s@%s on %s, want node-a's", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	let := holdLoop(t, b)
	closed := closeInBackground(a)
	p := ring.Partition(id, limitsPolicyParts)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return b.e.Owns(p) })
	resp, err := b.e.Registry().PartitionBackfills(context.Background(), p)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the backfill record: %v, %v", resp, err)
	}
	kv := resp.Kvs[0]
	b.e.startBackfill(string(kv.Key), kv.Value, kv.ModRevision, false)
	if backfillRunning(b, id) {
		t.Error("the watch started a runner of the backfill while node-b acquired its partition")
	}
	let()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return backfillRunning(b, id) })
	ho.finish(t, concurrency, b, closed)
}

// A replace fire of the task on the next owner cancels the run its
// former owner marked at its release, but for its backfill's fires, which
// run on outside the policy as on the owner: it marks the marker replaced
// rather than deleting it, and the backfill's runner goes on counting
// them until they end. Here node-a runs the first two fires of a
// backfill of concurrency 2 of a replace task, and its fire of 12:00:01,
// all held, when it leaves gracefully; node-b's fire of 12:00:02 cancels
// node-a's of 12:00:01, the backfill's two run on, and node-b's runner
// starts none of its own beside them (without, the replace deleted the
// marker and node-b started 2 beside them, 4 at once).
func TestEngine_BackfillConcurrencyHoldsPastAReplaceFire(t *testing.T) {
	const concurrency = 2
	ho := startBackfillHandOver(t, concurrency, nil, func(tk *task.Task) { tk.Concurrency = task.ConcurrencyReplace })
	a, b, h, id := ho.a, ho.b, ho.h, ho.id
	started := func(node string, at ...time.Time) blocked {
		t.Helper()
		r := h.next(t)
		if r.Node != node || !slices.ContainsFunc(at, r.ScheduledAt.Equal) {
			t.Fatalf("started %s@%s on %s, want one of %v on %s", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node, at, node)
		}
		return r
	}
	first := []time.Time{limitsAt(-9), limitsAt(-8)}
	old := []blocked{started("node-a", first...), started("node-a", first...)}
	ho.clock.Advance(time.Second)
	replaced := started("node-a", limitsAt(1))
	closed := closeInBackground(a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, id) && backfillRunning(b, id) })
	ho.noneStarts(t, b, 0, 0, fmt.Sprintf("while node-a's run held %d fires of the backfill, of a concurrency of %d", len(old), concurrency))
	waitNext(t, b, id, limitsAt(2))
	since := ho.busy(b)
	ho.clock.Advance(time.Second)
	started("node-b", limitsAt(2))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !replaced.running() })
	ho.noneStarts(t, b, 1, since, "beside its fire of 12:00:02, once it replaced node-a's run and its 2 fires of the backfill ran on")
	for _, r := range old {
		if !r.running() {
			t.Fatalf("node-a's fire %s of the backfill ended before it was let go", r.ScheduledAt.Format(time.TimeOnly))
		}
	}
	ho.finish(t, concurrency, b, closed)
}

// A backfill's fires count as its task's runs for the task's own fires
// (docs/api.md, concurrency), on the owner and past a graceful release on
// the next owner alike: the marker of a run that holds only fires of the
// backfill is a run of the task there, so that the hand-over changes
// nothing. Here node-a holds the first fire of a backfill of a forbid
// task and skips its schedule's fire of 12:00:01 beside it; node-a
// leaves, the fire runs on past the release, and node-b skips its fire
// of 12:00:02 beside it too (a marker counted only against the
// backfill's concurrency would have let it run).
func TestEngine_BackfillFireRunningElsewhereSkipsAForbidFireAsOnItsOwner(t *testing.T) {
	ho := startBackfillHandOver(t, 1, nil, func(tk *task.Task) { tk.Concurrency = task.ConcurrencyForbid })
	a, b, h, id := ho.a, ho.b, ho.h, ho.id
	if r := h.next(t); r.Node != "node-a" || !r.ScheduledAt.Equal(limitsAt(-9)) {
		t.Fatalf("started %s@%s on %s, want node-a's first fire of the backfill", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	skippedBeside := func(n *testNode, at time.Time) {
		t.Helper()
		waitNext(t, n, id, at)
		before := taskState(t, n, id).Skipped
		ho.clock.Advance(time.Second)
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			select {
			case r := <-h.started:
				t.Fatalf("started %s@%s on %s beside node-a's fire of the backfill", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
			default:
			}
			return taskState(t, n, id).Skipped == before+1
		})
	}
	skippedBeside(a, limitsAt(1))
	closed := closeInBackground(a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, id) && backfillRunning(b, id) })
	skippedBeside(b, limitsAt(2))
	if n := a.e.Stats().RunsMarked; n != 1 {
		t.Errorf("node-a marked %d runs, want 1 (its fire of the backfill)", n)
	}
	ho.finish(t, 1, b, closed)
}

// A retry handed on through etcd of a backfill's fire whose attempt
// outlived the release and failed counts against the backfill's
// concurrency on the next owner from its arrival until it ends, and the
// fire's marker goes only once etcd has the retry, so that the next owner
// counts one or the other throughout. Here node-a's first fire of a
// backfill of concurrency 1 of a task with 2 attempts is held when node-a
// leaves gracefully, and fails once let go: its retry, due an hour later
// at the earliest on the frozen clock, waits on node-b, whose runner
// starts none of its own until it ran (without the count, node-b ran its
// 9 fires beside the waiting retry).
func TestEngine_BackfillConcurrencyHoldsForARetryHandedOnThroughEtcd(t *testing.T) {
	const concurrency = 1
	ho := startBackfillHandOver(t, concurrency, nil, func(tk *task.Task) {
		tk.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(2 * time.Hour)}
	})
	a, b, h, id := ho.a, ho.b, ho.h, ho.id
	if r := h.next(t); r.Node != "node-a" || !r.ScheduledAt.Equal(limitsAt(-9)) {
		t.Fatalf("started %s@%s on %s, want node-a's first", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	closed := closeInBackground(a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, id) && backfillRunning(b, id) })
	ho.noneStarts(t, b, 0, 0, "while node-a's fire of the backfill ran, of a concurrency of 1")
	ho.failFirst.Store(true)
	h.open()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return b.e.Stats().RetryBacklog == 1 && b.e.Stats().RunsElsewhere == 0 })
	ho.noneStarts(t, b, 0, ho.busy(b), "while the retry of node-a's fire of the backfill waited there, of a concurrency of 1")
	for len(h.started) > 0 {
		if r := <-h.started; r.Node == "node-b" {
			t.Fatalf("node-b started %s@%s beside the retry of node-a's fire", r.TaskID, r.ScheduledAt.Format(time.TimeOnly))
		}
	}
	ho.clock.Advance(3 * time.Hour)
	for {
		r := h.next(t)
		if r.ScheduledAt.After(limitsAt(0)) {
			continue // the schedule's, which the clock's advance fired
		}
		if r.Node != "node-b" || !r.ScheduledAt.Equal(limitsAt(-9)) || r.Attempt != 2 {
			t.Fatalf("started %s@%s attempt %d on %s, want the retry of node-a's first fire on node-b", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Attempt, r.Node)
		}
		break
	}
	ho.finish(t, concurrency, b, closed)
}

// An acquire undone after it took over a backfill's fires handed over
// unrun leaves none of them counted: those it ran are cut, those queued
// dropped, and none ends; the checkpoint put back hands them to the next
// acquire, which counts them from its own take-over alone. Here node-a,
// with one worker, runs the first fire of a backfill of concurrency 3 of
// a forbid task (held) and leaves the next two queued when it leaves
// gracefully; node-b, with one worker too, takes the two over, starts
// the first, and its read of the partition's triggers then fails. Its
// next acquire takes the two over again, and its runner counts those
// two: counted with the undone acquire's, the two that never end stayed
// counted for good, and the runner ran one fire at a time to the end.
func TestEngine_BackfillUndoneAcquireLeavesItsFiresUncounted(t *testing.T) {
	const concurrency = 3
	ho := startBackfillHandOver(t, concurrency, func(cfg *Config) { cfg.Workers = 1 }, func(tk *task.Task) { tk.Concurrency = task.ConcurrencyForbid })
	a, b, h, id := ho.a, ho.b, ho.h, ho.id
	if r := h.next(t); r.Node != "node-a" || !r.ScheduledAt.Equal(limitsAt(-9)) {
		t.Fatalf("started %s@%s on %s, want node-a's first", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return a.e.Stats().QueueDepth == concurrency-1 })
	triggers := fmt.Sprintf("/triggers/%05d/", ring.Partition(id, limitsPolicyParts))
	failing := make(chan struct{})
	ho.faults["node-b"].failsGetOnceAfter(func(key string) bool { return strings.Contains(key, triggers) }, failing)
	closed := closeInBackground(a)
	undone := h.next(t)
	if undone.Node != "node-b" || !undone.ScheduledAt.Equal(limitsAt(-8)) {
		t.Fatalf("started %s@%s on %s, want node-a's second, handed over to node-b", undone.TaskID, undone.ScheduledAt.Format(time.TimeOnly), undone.Node)
	}
	close(failing)
	again := h.next(t)
	if again.Node != "node-b" || !again.ScheduledAt.Equal(limitsAt(-8)) || again.Fence == undone.Fence {
		t.Fatalf("started %s@%s on %s at fence %d, want node-a's second again, on node-b after fence %d",
			again.TaskID, again.ScheduledAt.Format(time.TimeOnly), again.Node, again.Fence, undone.Fence)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !undone.running() })
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return backfillRunning(b, id) })
	b.e.bf.mu.Lock()
	counted := b.e.bf.runs[id].handedLeft()
	b.e.bf.mu.Unlock()
	if counted != concurrency-1 {
		t.Errorf("node-b's runner counts %d fires handed over, want the %d its acquire took over", counted, concurrency-1)
	}
	ho.finish(t, concurrency, b, closed)
}

// backfillHandOver is a backfill of 10 fires of a task of node-a's, whose
// fires h holds, that node-b takes over when node-a leaves.
type backfillHandOver struct {
	a, b   *testNode
	start  func(id string) *testNode // another node like them
	faults map[string]*faultKV       // in front of each node's own client, by node id
	clock  *testClock
	h      *holder
	id     string
	most   atomic.Int64 // the backfill's fires that ran at once, on every node
	// failFirst, once set, fails the first attempt of the backfill's first
	// fire, 11:59:51, when h lets it go.
	failFirst atomic.Bool
}

// startBackfillHandOver starts node-a and node-b (tweak configures both
// more) and a backfill of the given concurrency of 11:59:51 to 12:00:00
// of a task of node-a's that fires every second (edit changes it more).
func startBackfillHandOver(t *testing.T, concurrency int, tweak func(*Config), edit ...func(*task.Task)) *backfillHandOver {
	t.Helper()
	c, clock := limitsStart(t)
	ho := &backfillHandOver{h: newHolder(t), faults: map[string]*faultKV{}, clock: clock}
	var going atomic.Int64 // the backfill's fires running, on every node
	count := func(ctx context.Context, f Fire) error {
		if f.ScheduledAt.After(limitsAt(0)) {
			return ho.h.handler(ctx, f) // the task's schedule's
		}
		n := going.Add(1)
		defer going.Add(-1)
		for m := ho.most.Load(); n > m; m = ho.most.Load() {
			if ho.most.CompareAndSwap(m, n) {
				break
			}
		}
		err := ho.h.handler(ctx, f)
		if err == nil && f.Attempt == 1 && f.ScheduledAt.Equal(limitsAt(-9)) && ho.failFirst.Load() {
			return errors.New("the backfill's first fire fails")
		}
		return err
	}
	ho.start = func(id string) *testNode {
		cli := c.NewClient(t)
		ho.faults[id] = injectFaults(cli)
		n := startNodeOn(t, cli, "", count, limitsNode(clock, time.Hour, id, func(cfg *Config) {
			cfg.Partitions = limitsPolicyParts // two nodes share them
			cfg.DrainTimeout = time.Minute     // node-a's held runs outlast the hand-over
			if tweak != nil {
				tweak(cfg)
			}
		}))
		t.Cleanup(ho.h.open) // again: cleanups run last first
		return n
	}
	ho.a, ho.b = ho.start("node-a"), ho.start("node-b")
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return ho.b.e.Stats().PartitionsOwned > 0 && ho.a.e.Stats().PartitionsOwned+ho.b.e.Stats().PartitionsOwned == limitsPolicyParts
	})
	for i := 0; ho.id == ""; i++ {
		if c := fmt.Sprintf("bf-%d", i); ho.a.e.owned[ring.Partition(c, limitsPolicyParts)].Load() {
			ho.id = c
		}
	}
	ho.h.ids[ho.id] = true
	reg := ho.a.e.Registry()
	tk := handlerTask(ho.id, "* * * * * *")
	for _, f := range edit {
		f(tk)
	}
	putTask(t, reg, tk)
	waitNext(t, ho.a, ho.id, limitsAt(1)) // the frozen clock fires none of its schedule
	if _, err := reg.Backfill(context.Background(), ho.id, limitsAt(-9), limitsAt(0), concurrency); err != nil {
		t.Fatal(err)
	}
	return ho
}

// noneStarts fails t, why, if node n's runner of the backfill dispatched a
// fire: once the loop answered the runner busy (past the since answers
// before), n's loop must hold no fire of the task under way but the
// handed ones it took over. The loop counts a fire as it gives it to the
// runner, so every fire the runner had before the answer is counted by
// then: the check waits for the answer, not for a time a slow machine may
// not reach.
func (ho *backfillHandOver) noneStarts(t *testing.T, n *testNode, handed int, since uint64, why string) {
	t.Helper()
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		asked := ho.busy(n) > since // before the count, which then holds what the runner took before
		var running int
		inLoop(t, n, func(l *loop) bool {
			i, r, ok := l.tab.lookup(ho.id)
			if ok {
				running = l.runningHere(i, r)
			}
			return ok
		})
		if running != handed {
			t.Fatalf("%s had %d fires of the task under way %s, want %d", n.e.NodeID(), running, why, handed)
		}
		return asked
	})
}

// busy is how many times node n's loop answered its runner of the
// backfill busy (backfillRun.busy).
func (ho *backfillHandOver) busy(n *testNode) uint64 {
	n.e.bf.mu.Lock()
	defer n.e.bf.mu.Unlock()
	if b := n.e.bf.runs[ho.id]; b != nil {
		return b.busy.Load()
	}
	return 0
}

// finish lets the held fires go, waits for the closes of the nodes that
// left and the backfill's end on last, and checks that no more than
// concurrency of its fires ran at once.
func (ho *backfillHandOver) finish(t *testing.T, concurrency int, last *testNode, closed ...<-chan error) {
	t.Helper()
	ho.h.open()
	for _, c := range closed {
		if err := <-c; err != nil {
			t.Errorf("close: %v", err)
		}
	}
	reg := last.e.Registry()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return backfillProgress(t, reg, ho.id).State == task.BackfillDone })
	if got := backfillProgress(t, reg, ho.id); got.Done != 10 || got.Node != last.e.NodeID() {
		t.Errorf("final record %+v, want 10 fires done by %s", got, last.e.NodeID())
	}
	if m := ho.most.Load(); m > int64(concurrency) {
		t.Errorf("%d fires of the backfill ran at once across the hand-over, of a concurrency of %d", m, concurrency)
	}
}

// A backfill runs the task's scheduled times, which its window bounds: a
// range wider than not_before and not_after runs only the times between
// them, and its record counts those.
func TestEngine_BackfillStaysInTheTaskWindow(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	n := startNode(t, c, "", log.handler, nil)
	reg := n.e.Registry()
	to := time.Now().Truncate(time.Second).Add(-time.Second)
	tk := handlerTask("bf", "* * * * * *")
	tk.NotBefore, tk.NotAfter = to.Add(-6*time.Second), to.Add(-3*time.Second)
	putTask(t, reg, tk)
	b, err := reg.Backfill(context.Background(), "bf", to.Add(-9*time.Second), to, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.Fires != 4 {
		t.Errorf("the backfill counts %d fires, want the 4 of the window", b.Fires)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return backfillProgress(t, reg, "bf").State == task.BackfillDone })
	var want []time.Time
	for at := tk.NotBefore; !at.After(tk.NotAfter); at = at.Add(time.Second) {
		want = append(want, at)
	}
	got := log.forTask("bf")
	slices.SortFunc(got, time.Time.Compare)
	if !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("the backfill fired %v, want only the window's %v", secs(got), secs(want))
	}
	if rec := backfillProgress(t, reg, "bf"); rec.Done != 4 || !rec.Through.Equal(tk.NotAfter) {
		t.Errorf("final record %+v, want 4 fires done through %s", rec, tk.NotAfter)
	}
}

// A runner's own progress records reach its node's watch late: one that
// arrives after the backfill finished must not start a second runner from
// that older progress, which would run its last fires again.
func TestEngine_LateRecordOfAFinishedBackfillStartsNothing(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	n := startNode(t, c, "", log.handler, nil)
	reg := n.e.Registry()
	putTask(t, reg, handlerTask("bf", "* * * * * *"))
	to := time.Now().Truncate(time.Second).Add(-time.Second)
	if _, err := reg.Backfill(context.Background(), "bf", to.Add(-9*time.Second), to, 1); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return backfillProgress(t, reg, "bf").State == task.BackfillDone })
	// Its runner leaves runs once it returned, after it recorded the end.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !backfillRunning(n, "bf") })

	p := reg.Partition("bf")
	resp, err := reg.PartitionBackfills(context.Background(), p)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the backfill record: %v, %v", resp, err)
	}
	kv := resp.Kvs[0]
	old, err := c.Client.Get(context.Background(), string(kv.Key), clientv3.WithRev(kv.ModRevision-1))
	if err != nil || len(old.Kvs) != 1 {
		t.Fatalf("the record before the last: %v, %v", old, err)
	}
	if rec, err := registry.DecodeBackfill(old.Kvs[0].Value); err != nil || rec.State != task.BackfillRunning {
		t.Fatalf("the record before the last is %+v, %v; want a running one", rec, err)
	}
	n.e.startBackfill(string(kv.Key), old.Kvs[0].Value, old.Kvs[0].ModRevision, false)
	if backfillRunning(n, "bf") {
		t.Error("a late record of a finished backfill started another runner")
	}

	// What guarded against it goes with the record, which the task's
	// delete takes.
	if err := reg.Delete(context.Background(), "bf"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		n.e.bf.mu.Lock()
		defer n.e.bf.mu.Unlock()
		_, kept := n.e.bf.newest["bf"]
		return !kept
	})
}

// Backfill fires still queued when their partition is released are handed
// over unrun, flagged as backfill fires, and the next owner runs them
// whatever their age: a backfill's fires are older than any catch-up
// window, and its record says they were dispatched.
func TestLoop_QueuedBackfillFiresAreHandedOverAndRun(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := at.Add(-48 * time.Hour)
	prof := noopProfile(task.MisfireFireOnce)
	a := newTestLoop(t, at, nil)
	a.add(t, 0, at, prof, "0 0 0 1 1 *", "bf")
	for i := range 3 {
		c := &backfillCmd{part: 0, id: "bf", at: old.Add(time.Duration(i) * time.Hour).UnixNano(), reply: make(chan backfillAnswer, 1)}
		a.handle(c)
		if got := <-c.reply; got != backfillTook {
			t.Fatalf("backfill fire %d: answer %d", i, got)
		}
	}
	rel := a.releaseNow(0)
	a.handOverQueued(rel.hand, unrunAll) // the workers took nothing in time
	pending := rel.hand[0].pending
	if len(pending) != 3 || !pending[0].Backfill {
		t.Fatalf("handed over %+v, want the 3 backfill fires flagged backfill", pending)
	}

	b := newTestLoop(t, at, nil)
	b.add(t, 0, at, prof, "0 0 0 1 1 *", "bf")
	b.handle(&takeOverCmd{part: 0, fires: pending})
	want := []string{fmt.Sprintf("bf@%d", old.UnixMilli()), fmt.Sprintf("bf@%d", old.Add(time.Hour).UnixMilli()),
		fmt.Sprintf("bf@%d", old.Add(2*time.Hour).UnixMilli())}
	if got := b.dispatched(0); !slices.Equal(got, want) {
		t.Errorf("the next owner dispatched %v, want %v", got, want)
	}
}

// The fires of a backfill handed over unrun count against its
// concurrency on the node that took them over (its runner's fires are
// refused, busy) until each ends there, whichever way: a fire whose first
// attempt failed is under way until its retry ends; dropped with their
// task's definition (an edit the node cannot read, which keeps the
// backfill), a queued fire and a retry end; so does a retry skipped, of a
// paused task whose backfill was canceled since. A count left behind
// would hold the runner for good.
func TestLoop_HandedBackfillFiresCountUntilTheyEnd(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := at.Add(-48 * time.Hour)
	for _, c := range []struct {
		name   string
		paused bool // paused and canceled; else dropped
	}{{name: "dropped"}, {name: "paused and canceled", paused: true}} {
		t.Run(c.name, func(t *testing.T) {
			tl := newTestLoop(t, at, nil)
			h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "bf")
			if err != nil {
				t.Fatal(err)
			}
			tl.handle(&loadCmd{part: 0, resume: at.UnixNano(), first: true, done: make(chan struct{}),
				defs: []taskDef{{id: "bf", hash: xxhash.Sum64String("bf"), part: 0, sched: h, prof: retryingProfile(), paused: c.paused}}})
			handed := &backfillRun{id: "bf", part: 0}
			runner := &backfillRun{id: "bf", part: 0, ended: make(chan int64, backfillLead(2)+1)}
			runner.handed.Store(handed)
			tl.handle(&takeOverCmd{part: 0, bfs: map[string]*backfillRun{"bf": handed}, fires: []pendingFire{
				{ID: "bf", At: old, Backfill: true},
				{ID: "bf", At: old.Add(time.Hour), Backfill: true, Attempt: 2, Due: at.Add(10 * time.Second)},
			}})
			ask := &backfillCmd{part: 0, id: "bf", at: old.Add(2 * time.Hour).UnixNano(), bf: runner, concurrency: 2, reply: make(chan backfillAnswer, 1)}
			tl.handle(ask)
			if got := <-ask.reply; got != backfillBusy {
				t.Fatalf("the runner's fire beside the 2 fires handed over, of a concurrency of 2: answer %d, want %d (busy)", got, backfillBusy)
			}
			if c.paused {
				tl.failFirstQueued() // its retry waits 10 s
				if n := runner.handedLeft(); n != 2 {
					t.Fatalf("%d fires handed over count once the first's attempt failed, want 2: its retry is to come", n)
				}
				handed.stopped.Store(true) // canceled
			} else {
				tl.handle(&eventsCmd{part: 0, drops: []string{"bf"}})
			}
			tl.clock.Advance(time.Minute)
			tl.dispatchAll()
			if got := tl.dispatched(0); len(got) != 0 {
				t.Errorf("dispatched %v, want the fires handed over ended unrun", got)
			}
			if n := runner.handedLeft(); n != 0 {
				t.Errorf("%d fires handed over count once they all ended, want none", n)
			}
		})
	}
}

// A retry of a backfill's fire handed on through etcd (its attempt
// outlived its partition's release, and failed there) counts against the
// backfill's concurrency on the next owner from its arrival until it
// ends, as one a checkpoint hands over; delivered twice (the trigger
// watch's, an acquire's read), it counts once. It counted for nothing:
// the runner started its own beside it.
func TestLoop_BackfillRetryHandedOnThroughEtcdCountsUntilItEnds(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := at.Add(-48 * time.Hour)
	tl := newTestLoop(t, at, nil)
	h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "bf")
	if err != nil {
		t.Fatal(err)
	}
	tl.handle(&loadCmd{part: 0, resume: at.UnixNano(), first: true, done: make(chan struct{}),
		defs: []taskDef{{id: "bf", hash: xxhash.Sum64String("bf"), part: 0, sched: h, prof: retryingProfile()}}})
	handed := &backfillRun{id: "bf", part: 0}
	runner := &backfillRun{id: "bf", part: 0, ended: make(chan int64, backfillLead(1)+1)}
	runner.handed.Store(handed)
	for range 2 {
		c := &triggersCmd{reply: make(chan struct{}, 1), fires: []triggerFire{{part: 0, id: "bf", at: at.Add(time.Millisecond).UnixNano(), rev: 7,
			retry: &registry.Retry{Attempt: 2, Due: at.Add(10 * time.Second), At: old, Backfill: true}, bf: handed}}}
		tl.handle(c)
		<-c.reply
	}
	if n := runner.handedLeft(); n != 1 {
		t.Fatalf("the runner counts %d fires handed over, want the retry's", n)
	}
	ask := &backfillCmd{part: 0, id: "bf", at: old.Add(time.Hour).UnixNano(), bf: runner, concurrency: 1, reply: make(chan backfillAnswer, 1)}
	tl.handle(ask)
	if got := <-ask.reply; got != backfillBusy {
		t.Fatalf("the runner's fire beside the retry, of a concurrency of 1: answer %d, want %d (busy)", got, backfillBusy)
	}
	tl.clock.Advance(time.Minute)
	tl.dispatchAll()
	if got, want := tl.dispatched(0), []string{fmt.Sprintf("bf@%d", old.UnixMilli())}; !slices.Equal(got, want) {
		t.Fatalf("dispatched %v, want the retry %v", got, want)
	}
	j := tl.takeQueued()
	j.extra.backfill().end(j.sched) // as its worker tells at its last attempt's end
	if n := runner.handedLeft(); n != 0 {
		t.Errorf("the runner counts %d fires handed over once the retry ended, want none", n)
	}
}

// A runner that started before any fire of its backfill was handed over
// to its node counts those that come later (a retry handed on through
// etcd) as it counts those an acquire took over before its start: it
// read only the latter, and ran its own beside the retry.
func TestEngine_BackfillRunnerCountsFiresHandedOverAfterItStarted(t *testing.T) {
	var e Engine
	runner := &backfillRun{id: "bf", part: 3}
	e.bf.runs = map[string]*backfillRun{"bf": runner}
	handed := e.handedBackfill(3, "bf", nil)["bf"]
	if got := runner.handed.Load(); got != handed {
		t.Errorf("the runner counts the fires of %p, want those handed over since it started (%p)", got, handed)
	}
}

// An acquire cut short (the ring moved its partition on) reads no
// backfills, and says so below warning: its next owner starts them, and a
// join would otherwise warn for every partition it passed on.
func TestEngine_BackfillReadOfACanceledAcquireIsNoWarning(t *testing.T) {
	c := etcdtest.Start(t)
	var buf logbuf.Buffer
	n := startNode(t, c, "", nil, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n.e.startBackfills(ctx, 0)
	if strings.Contains(buf.String(), "backfills failed") {
		t.Errorf("a canceled acquire's backfill read warned:\n%s", buf.String())
	}
}

// startHeldBackfill starts a node with a backfill of task bf's ten yearly
// times from 2016, one at a time, and returns once its first fire started:
// the fires wait until release is closed.
func startHeldBackfill(t *testing.T, c *etcdtest.Cluster) (n *testNode, log *fireLog, release chan struct{}) {
	t.Helper()
	log = newFireLog()
	started, release := make(chan struct{}, 16), make(chan struct{})
	n = startNode(t, c, "", func(ctx context.Context, f Fire) error {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done(): // the test failed, and the node stops
		}
		return log.handler(ctx, f)
	}, nil)
	reg := n.e.Registry()
	putTask(t, reg, handlerTask("bf", "0 0 0 1 1 *")) // yearly: no fire of its own meanwhile
	if _, err := reg.Backfill(context.Background(), "bf", heldFrom, heldTo, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the backfill's first fire did not start")
	}
	return n, log, release
}

// The range of startHeldBackfill's backfill: ten yearly times.
var heldFrom, heldTo = time.Date(2016, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 12, 31, 0, 0, 0, 0, time.UTC)

// A canceled backfill stops at once: no further fire of it starts, the
// one running when it was canceled runs to its end, and the record stays
// canceled with the progress recorded before. A second cancel, or one of a
// task that never had a backfill, finds none running.
func TestEngine_CanceledBackfillStopsAtOnce(t *testing.T) {
	c := etcdtest.Start(t)
	n, log, release := startHeldBackfill(t, c)
	reg := n.e.Registry()
	b, err := reg.CancelBackfill(context.Background(), "bf")
	if err != nil || b.State != task.BackfillCanceled || b.Done != 0 || b.Fires != 10 {
		t.Fatalf("CancelBackfill = %+v, %v; want canceled with 0 of 10 fires done", b, err)
	}
	// The runner stops while its fire still runs.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !backfillRunning(n, "bf") })
	close(release)
	stopAndDrain(t, n)
	if got := log.forTask("bf"); len(got) != 1 || !got[0].Equal(heldFrom) {
		t.Errorf("the canceled backfill fired %v, want only its first fire, %s", secs(got), heldFrom.Format(time.RFC3339))
	}
	if rec := backfillProgress(t, reg, "bf"); rec.State != task.BackfillCanceled {
		t.Errorf("the record after the runner stopped: %+v, want it canceled", rec)
	}
	var none *registry.NoBackfillRunningError
	if _, err := reg.CancelBackfill(context.Background(), "bf"); !errors.As(err, &none) || none.Latest == nil || none.Latest.State != task.BackfillCanceled {
		t.Errorf("a second cancel: %v, want ErrNoBackfillRunning with the canceled record", err)
	}
	putTask(t, reg, handlerTask("never", "0 0 0 1 1 *"))
	if _, err := reg.CancelBackfill(context.Background(), "never"); !errors.As(err, &none) || none.Latest != nil {
		t.Errorf("a cancel of a task without a backfill: %v, want ErrNoBackfillRunning without a record", err)
	}
}

// A backfill canceled between its partition's acquire reading the
// partition's records and starting their runners stays canceled: the
// watch delivers the cancel before there is a runner to stop, and a
// runner started after it from the older, running record would run fires
// of the canceled backfill (all of one shorter than twice its
// concurrency) until its first progress write met the cancel's revision.
func TestEngine_BackfillCanceledWhileItsPartitionIsAcquiredStaysCanceled(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	const parts = 1
	reg, err := registry.OpenRegistry(context.Background(), c.Client, DefaultPrefix, parts)
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("bf", "0 0 0 1 1 *")) // yearly: only the backfills fire them
	putTask(t, reg, handlerTask("probe", "0 0 0 1 1 *"))
	from, to := time.Date(2016, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 12, 31, 0, 0, 0, 0, time.UTC)
	if _, err := reg.Backfill(context.Background(), "bf", from, to, 1); err != nil {
		t.Fatal(err)
	}
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	held, release := make(chan struct{}), make(chan struct{})
	hook := func(key string) {
		if strings.HasSuffix(key, "/backfills/00000/") { // the acquire's read, answered
			faults.afterGet.Store(nil)
			close(held)
			<-release
		}
	}
	faults.afterGet.Store(&hook)
	n := startNodeOn(t, cli, "", log.handler, func(cfg *Config) { cfg.Partitions = parts }, noWait)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("the acquire never read the partition's backfills")
	}
	if _, err := reg.CancelBackfill(context.Background(), "bf"); err != nil {
		close(release)
		t.Fatal(err)
	}
	// A backfill written after the cancel: once it fires, the watch has
	// delivered the cancel.
	if _, err := reg.Backfill(context.Background(), "probe", from, from.Add(time.Hour), 1); err != nil {
		close(release)
		t.Fatal(err)
	}
	if !eventually(30*time.Second, func() bool { return len(log.forTask("probe")) == 1 }) {
		close(release)
		t.Fatal("the probe's backfill never fired")
	}
	close(release)
	etcdtest.WaitFor(t, 20*time.Second, n.e.Ready)
	if eventually(3*time.Second, func() bool { return len(log.forTask("bf")) > 0 }) {
		t.Errorf("the backfill canceled while its partition was acquired fired %v", secs(log.forTask("bf")))
	}
	stopAndDrain(t, n)
	if rec := backfillProgress(t, reg, "bf"); rec.State != task.BackfillCanceled || rec.Done != 0 {
		t.Errorf("the record: %+v, want it canceled with no fire done", rec)
	}
}

// A backfill fire handed over unrun in a graceful hand-over is still its
// backfill's on the next owner: a retry of it runs while the task is
// paused (a backfill runs, retries included, until it is canceled) and
// outside the task's concurrency policy, as a retry of a fire the runner
// dispatched does; once the backfill is canceled, its retries of a paused
// task are skipped. The next owner took it over without its backfill, as
// a plain fire's: its retry was skipped as "the task is paused" while the
// backfill ran, and under forbid as "a newer fire of the task is running".
func TestLoop_HandedOverBackfillFireRetriesAsItsBackfills(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := at.Add(-48 * time.Hour)
	for _, c := range []struct {
		name            string
		paused, running bool // the task is paused; a scheduled fire of it runs (forbid)
		cancel          bool // the backfill is canceled before the retry comes due
		wantRetry       bool
	}{
		{name: "paused", paused: true, wantRetry: true},
		{name: "forbid", running: true, wantRetry: true},
		{name: "paused and canceled", paused: true, cancel: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			prof := noopProfile(task.MisfireFireOnce)
			prof.key, prof.maxAttempts = "noop/retry3", 3
			prof.backoff, prof.maxBackoff = 100*time.Millisecond, 100*time.Millisecond
			prof.concurrency = task.ConcurrencyForbid
			tl := newTestLoop(t, at, nil)
			h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "bf")
			if err != nil {
				t.Fatal(err)
			}
			tl.handle(&loadCmd{part: 0, resume: at.UnixNano(), first: true, done: make(chan struct{}),
				defs: []taskDef{{id: "bf", hash: xxhash.Sum64String("bf"), part: 0, sched: h, prof: prof, paused: c.paused}}})
			bfs := map[string]*backfillRun{"bf": {id: "bf", part: 0}}
			tl.handle(&takeOverCmd{part: 0, fires: []pendingFire{{ID: "bf", At: old, Backfill: true}}, bfs: bfs})
			if got := tl.dispatched(0); len(got) != 1 {
				t.Fatalf("the next owner dispatched %v, want the backfill's fire", got)
			}
			tl.failFirstQueued() // its first attempt fails
			_, r, _ := tl.tab.lookup("bf")
			if c.running {
				r.running++ // a scheduled fire of the task runs meanwhile
			}
			if c.cancel {
				bfs["bf"].stopped.Store(true)
			}
			skipped := r.skipped
			tl.clock.Advance(time.Second)
			tl.dispatchAll()
			retried := slices.Contains(tl.dispatched(0), fmt.Sprintf("bf@%d", old.UnixMilli()))
			if retried != c.wantRetry || (r.skipped > skipped) == c.wantRetry {
				t.Errorf("the retry of the handed-over backfill fire: dispatched %v, skipped %d; want dispatched %v",
					retried, r.skipped-skipped, c.wantRetry)
			}
		})
	}
}

// A retry of a canceled backfill's fire is handed over as a plain retry:
// on the old owner it would have been skipped while its task is paused, as
// any retry, and so it is on the next owner, even when that one runs the
// handed fires' backfill as running (a new backfill replaced the canceled
// one before the acquire, or the acquire could not read the records). It
// was handed over flagged backfill, and the next owner ran it while the
// task was paused.
func TestLoop_HandedOverRetryOfACanceledBackfillOfAPausedTaskIsSkipped(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := at.Add(-48 * time.Hour)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.maxAttempts = "noop/retry3", 3
	prof.backoff, prof.maxBackoff = 10*time.Second, 10*time.Second
	load := func(tl *testLoop) {
		h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "bf")
		if err != nil {
			t.Fatal(err)
		}
		tl.handle(&loadCmd{part: 0, resume: at.UnixNano(), first: true, done: make(chan struct{}),
			defs: []taskDef{{id: "bf", hash: xxhash.Sum64String("bf"), part: 0, sched: h, prof: prof, paused: true}}})
	}
	// bfsOf builds the backfills of the fires flagged backfill, as an
	// acquire does when the task's backfill record runs.
	bfsOf := func(fires []pendingFire) map[string]*backfillRun {
		bfs := map[string]*backfillRun{}
		for _, f := range fires {
			if f.Backfill {
				bfs[f.ID] = &backfillRun{id: f.ID, part: 0}
			}
		}
		return bfs
	}
	a := newTestLoop(t, at, nil)
	load(a)
	handed := []pendingFire{{ID: "bf", At: old, Backfill: true}}
	bfs := bfsOf(handed)
	a.handle(&takeOverCmd{part: 0, fires: handed, bfs: bfs})
	if got := a.dispatched(0); len(got) != 1 {
		t.Fatalf("dispatched %v, want the backfill's fire", got)
	}
	// Its first attempt fails: the retry waits; then the backfill is
	// canceled.
	a.failFirstQueued()
	if n := a.retrying.Load(); n != 1 {
		t.Fatalf("%d retries wait, want 1", n)
	}
	bfs["bf"].stopped.Store(true)
	rel := a.releaseNow(0)
	pending := rel.hand[0].pending
	if len(pending) != 1 || pending[0].Attempt != 2 {
		t.Fatalf("the release hands over %+v, want the retry", pending)
	}

	b := newTestLoop(t, at, nil)
	load(b)
	b.handle(&takeOverCmd{part: 0, fires: pending, bfs: bfsOf(pending)})
	_, r, _ := b.tab.lookup("bf")
	b.clock.Advance(time.Minute)
	b.dispatchAll()
	if got := b.dispatched(0); len(got) != 0 || r.skipped != 1 {
		t.Errorf("the next owner dispatched %v and skipped %d; want the retry of the canceled backfill's fire of the paused task skipped",
			got, r.skipped)
	}
}

// The backfill of fires handed over is stopped by its cancel, seen by the
// watch or read at the acquire (a canceled record), and not by a record
// that runs.
func TestEngine_HandedOverBackfillStopsWithItsCancel(t *testing.T) {
	rec := func(state string) []byte {
		return []byte(fmt.Sprintf(`{"from":"2026-01-01T00:00:00Z","to":"2026-01-01T01:00:00Z","concurrency":1,"fires":2,"done":0,"state":%q,"created_at":"2026-01-01T02:00:00Z"}`, state))
	}
	c := etcdtest.Start(t)
	e := &Engine{reg: directRegistry(t, c)}
	p := e.reg.Partition("bf")
	key := fmt.Sprintf("/shardcron/backfills/%05d/bf", p)
	if _, id, ok := e.reg.ParseBackfill(key); !ok || id != "bf" {
		t.Fatalf("key %s is not a backfill key", key)
	}
	// The watch's cancel.
	b := e.handedBackfill(p, "bf", nil)["bf"]
	e.backfillChanged(key, rec(task.BackfillDone), 5, false)
	if b.stopped.Load() {
		t.Fatal("a record that is not canceled stopped the fires handed over")
	}
	e.backfillChanged(key, rec(task.BackfillCanceled), 6, false)
	if !b.stopped.Load() {
		t.Error("the watch's cancel did not stop the fires handed over")
	}
	// The acquire's read of a record canceled before it.
	e.owned = make([]atomic.Bool, 16)
	e.owned[p].Store(true)
	b = e.handedBackfill(p, "bf", nil)["bf"]
	e.startBackfill(key, rec(task.BackfillCanceled), 7, true)
	if !b.stopped.Load() {
		t.Error("a canceled record read at the acquire did not stop the fires handed over")
	}
}

// A progress write that etcd applies but whose answer is lost (a timeout,
// a leader change) does not stop the backfill: its next write finds the
// record at the lost write's revision, recognises it as its own, and goes
// on, every fire once.
func TestEngine_BackfillGoesOnAfterAProgressWriteWhoseAnswerWasLost(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	n := startNodeOn(t, cli, "", log.handler, nil)
	reg := n.e.Registry()
	putTask(t, reg, handlerTask("bf", "0 0 0 1 1 *")) // yearly: no fire of its own meanwhile
	faults.answersLostOnce(func(key, value string) bool {
		return strings.Contains(key, "/backfills/") && strings.Contains(value, `"state":"running"`) && strings.Contains(value, `"node":`)
	})
	from, to := time.Date(2016, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 12, 31, 0, 0, 0, 0, time.UTC)
	if _, err := reg.Backfill(context.Background(), "bf", from, to, 1); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return backfillProgress(t, reg, "bf").State == task.BackfillDone })
	if faults.lostOnce.Load() != nil {
		t.Fatal("no progress write was committed unanswered: the test sets up nothing")
	}
	stopAndDrain(t, n)
	if got := log.forTask("bf"); len(got) != 10 {
		t.Errorf("the backfill fired %v, want its 10 times once each", secs(got))
	}
}

// A runner whose task is gone without the watch telling it (a delete a
// compacted watch skipped; here, the task's key deleted alone) stops once
// etcd says the task is gone, rather than ask the loop for it ten times a
// second until its partition's release.
func TestEngine_BackfillOfATaskGoneUnseenStops(t *testing.T) {
	c := etcdtest.Start(t)
	n, log, release := startHeldBackfill(t, c)
	reg := n.e.Registry()
	key := fmt.Sprintf("%s/tasks/%05d/bf", DefaultPrefix, reg.Partition("bf"))
	if resp, err := c.Client.Delete(context.Background(), key); err != nil || resp.Deleted != 1 {
		t.Fatalf("deleting %s: %v, %v", key, resp, err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		_, held := n.e.TaskState(context.Background(), "bf")
		return !held
	})
	close(release)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !backfillRunning(n, "bf") })
	stopAndDrain(t, n)
	if got := log.forTask("bf"); len(got) != 1 {
		t.Errorf("the backfill of the deleted task fired %v, want only its first fire", secs(got))
	}
}

// backfillFire hands the loop the fire at at of backfill bf, and wants it
// taken.
func (tl *testLoop) backfillFire(t *testing.T, bf *backfillRun, at time.Time) {
	t.Helper()
	c := &backfillCmd{part: bf.part, id: bf.id, at: at.UnixNano(), bf: bf, reply: make(chan backfillAnswer, 1)}
	tl.handle(c)
	if got := <-c.reply; got != backfillTook {
		t.Fatalf("backfill fire of %s at %v: answer %d, want %d (taken)", bf.id, at, got, backfillTook)
	}
}

// A task changed to what the node cannot read keeps its backfill record,
// and the runner waits for every fire it dispatched to end: those of the
// definition before that the drop takes (one waiting for a worker, a retry
// waiting for its backoff) end with it. Else the runner waited for them
// until its partition's release, the task readable again or not.
func TestLoop_BackfillFiresADropTakesEnd(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := at.Add(-48 * time.Hour)
	tl := newTestLoop(t, at, nil)
	tl.add(t, 0, at, retryingProfile(), "0 0 0 1 1 *", "bad")
	bf := &backfillRun{id: "bad", part: 0, ended: make(chan int64, backfillLead(2)+1)}
	tl.backfillFire(t, bf, old)
	tl.failFirstQueued() // its retry waits 10 s
	tl.backfillFire(t, bf, old.Add(time.Hour))
	tl.handle(&eventsCmd{part: 0, drops: []string{"bad"}})
	tl.clock.Advance(time.Minute)
	tl.dispatchAll()
	var ended []int64
	for len(bf.ended) > 0 {
		ended = append(ended, <-bf.ended)
	}
	slices.Sort(ended)
	if want := []int64{old.UnixNano(), old.Add(time.Hour).UnixNano()}; !slices.Equal(ended, want) {
		t.Errorf("the backfill was told of the ends of %v, want %v: the retry's fire and the one queued", ended, want)
	}
}

// A backfill fire whose attempt fails after its task dropped out of the
// loop has no retry to come: its runner must be told it ended, or it
// waits for it for ever, one of its fires in flight.
func TestLoop_BackfillAttemptFailingAfterADropEnds(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	old := at.Add(-48 * time.Hour)
	tl := newTestLoop(t, at, nil)
	tl.add(t, 0, at, retryingProfile(), "0 0 0 1 1 *", "bad")
	bf := &backfillRun{id: "bad", part: 0, ended: make(chan int64, backfillLead(2)+1)}
	tl.backfillFire(t, bf, old)
	tl.pool.mu.Lock()
	j := *tl.pool.at(0) // a worker takes it
	tl.pool.mu.Unlock()
	tl.pool.reset()
	tl.handle(&eventsCmd{part: 0, drops: []string{"bad"}})
	var done completionBatch
	done.add(&j, statusFailed, "boom", false) // attempt 1 of 3
	tl.complete(&done)
	select {
	case s := <-bf.ended:
		if s != old.UnixNano() {
			t.Errorf("the backfill was told of the end of %v, want %v", time.Unix(0, s).UTC(), old)
		}
	default:
		t.Error("the backfill was not told that its fire ended: its runner would wait for it for ever")
	}
	if len(bf.ended) > 0 {
		t.Errorf("the backfill was told of %d more ends, want none", len(bf.ended))
	}
}

// A backfill's fires are outside its task's concurrency policy both ways:
// a scheduled fire of a replace task cancels the task's own fires running
// or waiting for a worker, not the backfill's, which promised to run each
// of its times once (and counts every fire that ends as done). The
// schedule's fire each second canceled every backfill fire that ran
// longer, or waited behind the others.
func TestEngine_ReplaceFireSparesTheBackfillsFires(t *testing.T) {
	c := etcdtest.Start(t)
	to := time.Now().Truncate(time.Second).Add(-time.Hour)
	from := to.Add(-3 * time.Second) // 4 fires
	var mu sync.Mutex
	outcome := map[int64]string{}
	h := func(ctx context.Context, f Fire) error {
		if f.ScheduledAt.After(to) {
			return nil // the schedule's own fires
		}
		res := "ok"
		select {
		case <-time.After(1500 * time.Millisecond):
		case <-ctx.Done():
			res = "canceled: " + context.Cause(ctx).Error()
		}
		mu.Lock()
		outcome[f.ScheduledAt.Unix()] = res
		mu.Unlock()
		return ctx.Err()
	}
	n := startNode(t, c, "", h, func(cfg *Config) { cfg.Workers = 2 }) // two backfill fires wait for a worker
	reg := n.e.Registry()
	tk := handlerTask("bf", "* * * * * *")
	tk.Concurrency = task.ConcurrencyReplace
	putTask(t, reg, tk)
	if _, err := reg.Backfill(context.Background(), "bf", from, to, 4); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return backfillProgress(t, reg, "bf").State == task.BackfillDone })
	mu.Lock()
	defer mu.Unlock()
	for at := from; !at.After(to); at = at.Add(time.Second) {
		if got := outcome[at.Unix()]; got != "ok" {
			t.Errorf("the backfill's fire at %s: %q, want it run to its end", at.Format(time.TimeOnly), got)
		}
	}
}

// A backfill runs the times of its task's schedule when its owner starts
// or resumes it: a schedule changed mid-backfill changes the times from
// the next owner on, and the record's fires with them, so that done
// counts up to fires and no further. The record kept the fires counted at
// the request, and read 20 done of its 10 fires.
func TestEngine_BackfillOfAScheduleChangedMidwayCountsTheTimesItRuns(t *testing.T) {
	c := etcdtest.Start(t)
	n, log, release := startHeldBackfill(t, c)
	reg := n.e.Registry()
	tk := handlerTask("bf", "0 0 0 1 1,7 *") // twice a year: 20 times in the range
	putTask(t, reg, tk)
	b := startNode(t, c, "", log.handler, func(cfg *Config) { cfg.NodeID = "node-b" })
	closed := closeInBackground(n)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(b, "bf") })
	close(release)
	if err := <-closed; err != nil {
		t.Errorf("close the first node: %v", err)
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return backfillProgress(t, reg, "bf").State == task.BackfillDone })
	rec := backfillProgress(t, reg, "bf")
	got := log.forTask("bf")
	if rec.Done != 20 || rec.Fires != 20 || len(got) != 20 {
		t.Errorf("the record of the done backfill: %d of its %d fires done; it ran %d; want 20 of 20, run 20: the changed schedule's times in the range",
			rec.Done, rec.Fires, len(got))
	}
}

// A node that takes a partition back (here after it fenced itself, cut off
// from etcd) resumes the partition's backfills from their records, its
// own progress writes among them: the guard against its runners' own
// records reaching the watch late took the record its runner wrote last
// for one of those, and started nothing. The backfill stayed running,
// with no runner, until its partition moved to another node.
func TestEngine_BackfillResumesWhenItsNodeTakesItsPartitionBack(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	proxy := c.NewProxy(t)
	log := newFireLog()
	h := func(ctx context.Context, f Fire) error {
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
		}
		return log.handler(ctx, f)
	}
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", h, func(cfg *Config) { cfg.LeaseTTL = 2 * time.Second })
	reg := directRegistry(t, c)
	putTask(t, reg, handlerTask("bf", "0 0 0 1 1 *")) // yearly: only the backfill fires it
	if _, err := reg.Backfill(context.Background(), "bf", heldFrom, heldTo, 1); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return backfillProgress(t, reg, "bf").Done >= 2 })
	sess := a.e.sess.Load()
	proxy.Cut()
	etcdtest.WaitFor(t, 10*time.Second, sess.Fenced)
	// The drop stops the runner, once its progress write cut off from
	// etcd gives up.
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return !backfillRunning(a, "bf") })
	proxy.Restore()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.sess.Load() != sess && a.e.Ready() })
	if !eventually(20*time.Second, func() bool { return backfillProgress(t, reg, "bf").State == task.BackfillDone }) {
		t.Fatalf("the backfill did not go on once its node took its partition back: %+v, a runner: %v",
			backfillProgress(t, reg, "bf"), backfillRunning(a, "bf"))
	}
	for at := heldFrom; !at.After(heldTo); at = at.AddDate(1, 0, 0) {
		log.mu.Lock()
		n := log.seen[fmt.Sprintf("bf@%d", at.UnixMilli())]
		log.mu.Unlock()
		if n == 0 {
			t.Errorf("the backfill's fire at %s never ran", at.Format(time.DateOnly))
		}
	}
}

// A backfill's progress write at a graceful release that etcd refuses
// once (a leader change) is tried again: left at the through etcd last
// acknowledged, the next owner ran again the fires the old owner still
// ran. Here node-a's backfill fires are held, so that none ends and the
// release's write is the runner's only one, and the one refused.
func TestEngine_BackfillsReleaseWriteRefusedOnceIsTriedAgain(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	now := time.Now().Truncate(time.Second)
	from, to := now.Add(-40*time.Second), now.Add(-time.Second)
	held := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(held) }) }
	t.Cleanup(open)
	h := func(ctx context.Context, f Fire) error {
		_ = log.handler(ctx, f)
		if !f.ScheduledAt.After(to) {
			<-held // a backfill fire
		}
		return nil
	}
	node := func(id string) func(*Config) {
		return func(cfg *Config) {
			cfg.NodeID, cfg.DrainTimeout, cfg.MisfireThreshold = id, 20*time.Second, time.Minute
		}
	}
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	a := startNodeOn(t, cli, "", h, node("node-a"))
	reg := a.e.Registry()
	putTask(t, reg, handlerTask("bf", "* * * * * *"))
	const concurrency = 8
	if _, err := reg.Backfill(context.Background(), "bf", from, to, concurrency); err != nil {
		t.Fatal(err)
	}
	started := func() int {
		n := 0
		for _, at := range log.forTask("bf") {
			if !at.After(to) {
				n++
			}
		}
		return n
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return started() == concurrency })
	faults.failsOnce(func(key, _ string) bool { return strings.Contains(key, "/backfills/") }, errInjected)
	closed := closeInBackground(a)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return faults.once.Load() == nil })
	startNode(t, c, "", h, node("node-b"))
	open()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	rb := directRegistry(t, c)
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return backfillProgress(t, rb, "bf").State == task.BackfillDone })
	var repeated []string
	for at := from; !at.After(to); at = at.Add(time.Second) {
		log.mu.Lock()
		n := log.seen[fmt.Sprintf("bf@%d", at.UnixMilli())]
		log.mu.Unlock()
		if n != 1 {
			repeated = append(repeated, fmt.Sprintf("#%d x%d", int(at.Sub(from)/time.Second), n))
		}
	}
	if len(repeated) > 0 {
		t.Errorf("backfill fires not run once across a graceful hand-over whose progress write etcd refused once: %v", repeated)
	}
}
