package engine

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The tests of this file pin down what doc.go says the engine does not
// guarantee: each shows the limitation happening, so that the list stays
// true, and fails once the engine does better (then the case leaves the
// list). They run on a clock the test moves and handlers that block until
// released, so that nothing depends on timing.

// limitsParts is the partitions of the limits tests' nodes: the fewest
// that two nodes can share.
const limitsParts = 2

// partOf returns the partition of task id.
func partOf(id string) int { return ring.Partition(id, limitsParts) }

// limitsAt is a second of the limits tests' clock.
func limitsAt(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }

// limitsStart starts a limits test's etcd, and its clock frozen at
// 12:00:00.5.
func limitsStart(t *testing.T) (*etcdtest.Cluster, *testClock) {
	return etcdtest.Start(t), newTestClock(limitsAt(0).Add(time.Second/2), 0)
}

// limitsNode configures a limits test's node: its id, limitsParts
// partitions, the clock with a misfire threshold, then more.
func limitsNode(clock *testClock, misfire time.Duration, id string, more ...func(*Config)) func(*Config) {
	return clockTweak(clock, misfire, func(cfg *Config) {
		cfg.NodeID, cfg.Partitions = id, limitsParts
		for _, m := range more {
			m(cfg)
		}
	})
}

// blocked is a handler call held until the test lets it go.
type blocked struct {
	Fire
	ctx   context.Context // the call's context: canceled when the engine gives up on it
	ended chan struct{}   // closed when the call returned
}

// holder is a handler that holds every call of the tasks it is told,
// until release, and lets the others through.
type holder struct {
	ids     map[string]bool
	started chan blocked
	release chan struct{}
	once    sync.Once
}

// newHolder returns a holder of the calls of ids that lets them all go
// when the test ends. Call t.Cleanup(h.open) again once the nodes whose
// calls it holds started (cleanups run last first), so that no node waits
// for a held call while it closes.
func newHolder(t *testing.T, ids ...string) *holder {
	h := &holder{ids: map[string]bool{}, started: make(chan blocked, 64), release: make(chan struct{})}
	for _, id := range ids {
		h.ids[id] = true
	}
	t.Cleanup(h.open)
	return h
}

func (h *holder) handler(ctx context.Context, f Fire) error {
	if !h.ids[f.TaskID] {
		return nil
	}
	b := blocked{Fire: f, ctx: ctx, ended: make(chan struct{})}
	defer close(b.ended)
	h.started <- b
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *holder) open() { h.once.Do(func() { close(h.release) }) }

// next returns the next call that started.
func (h *holder) next(t *testing.T) blocked {
	t.Helper()
	select {
	case b := <-h.started:
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("no held fire started within 10s")
		return blocked{}
	}
}

// running reports whether a held call is still running, its context live.
func (b blocked) running() bool {
	select {
	case <-b.ended:
		return false
	default:
		return b.ctx.Err() == nil
	}
}

// heldPolicies is node-a and node-b, and node-a running the fires of
// 12:00:01 of a task of each policy asked for, held until h opens.
type heldPolicies struct {
	clock *testClock
	h     *holder
	a, b  *testNode
	aEtcd *etcdtest.Proxy // node-a's way to etcd
	aKV   *faultKV        // in front of node-a's client
	bKV   *faultKV        // in front of node-b's client
	ids   map[string]task.ConcurrencyPolicy
	old   map[string]blocked // the held runs, by task
}

// keptApart are the concurrency policies that keep a task's fires apart.
var keptApart = []task.ConcurrencyPolicy{task.ConcurrencyForbid, task.ConcurrencyBufferOne, task.ConcurrencyReplace}

func startHeldPolicies(t *testing.T, policies ...task.ConcurrencyPolicy) *heldPolicies {
	return startHeldPoliciesWaiting(t, *heldRunWait, policies...)
}

// heldRunWait sets startHeldPolicies' node-a's wait for runs at a release,
// for BENCHMARKS.md's figures of one wait against another.
var heldRunWait = flag.Duration("engine.held-run-wait", 0, "Config.ReleaseRunWait of startHeldPolicies' node-a (0: the default)")

// startHeldPoliciesWaiting is startHeldPolicies with node-a's releases
// waiting runWait for runs under way (0: the default).
func startHeldPoliciesWaiting(t *testing.T, runWait time.Duration, policies ...task.ConcurrencyPolicy) *heldPolicies {
	c, clock := limitsStart(t)
	hp := &heldPolicies{clock: clock, h: newHolder(t), aEtcd: c.NewProxy(t), ids: map[string]task.ConcurrencyPolicy{}, old: map[string]blocked{}}
	start := func(id string, cli *clientv3.Client) *testNode {
		n := startNodeOn(t, cli, "", hp.h.handler, limitsNode(clock, time.Hour, id, func(cfg *Config) {
			cfg.Partitions = limitsPolicyParts
			cfg.DrainTimeout = time.Minute // node-a's held runs outlast the hand-over
			cfg.ReleaseRunWait = runWait
		}))
		t.Cleanup(hp.h.open) // again: cleanups run last first
		return n
	}
	aCli := c.NewClient(t, hp.aEtcd.Endpoint())
	hp.aKV = injectFaults(aCli)
	bCli := c.NewClient(t)
	hp.bKV = injectFaults(bCli)
	hp.a, hp.b = start("node-a", aCli), start("node-b", bCli)
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return hp.a.e.Stats().PartitionsOwned+hp.b.e.Stats().PartitionsOwned == limitsPolicyParts
	})
	for _, p := range policies {
		// A task of node-a's: the ring placed the partitions.
		id := ""
		for i := 0; id == ""; i++ {
			if c := fmt.Sprintf("%s-%d", p, i); hp.a.e.owned[ring.Partition(c, limitsPolicyParts)].Load() {
				id = c
			}
		}
		hp.ids[id] = p
		hp.h.ids[id] = true
		tk := handlerTask(id, "* * * * * *")
		tk.Concurrency = p
		putTask(t, hp.a.e.Registry(), tk)
		waitNext(t, hp.a, id, limitsAt(1))
	}
	clock.Advance(time.Second)
	for range hp.ids {
		r := hp.h.next(t)
		hp.old[r.TaskID] = r
	}
	return hp
}

// limitsPolicyParts is heldPolicies' partitions.
const limitsPolicyParts = 4

// A release waits, within Config.ReleaseRunWait, for the runs under way
// of tasks whose policy keeps fires apart: the next owner, which does not
// know of them, starts nothing before the release commits. Here each
// task's fire of 12:00:01 runs on node-a (held) when node-a leaves
// gracefully, and 12:00:02 comes due; node-b starts no fire while node-a's
// runs are held, within a wait of 10 s, and each task's fire of 12:00:02
// once they end.
func TestEngine_ConcurrencyPoliciesHoldForARunEndingDuringItsRelease(t *testing.T) {
	hp := startHeldPoliciesWaiting(t, MaxReleaseRunWait, keptApart...)
	closed := closeInBackground(hp.a)
	ea := hp.a.e
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return ea.Stats().PartitionsOwned == 0 })
	hp.clock.Advance(time.Second)
	select {
	case r := <-hp.h.started: // without the wait, node-b's at once
		t.Fatalf("%s: started %s on %s while node-a's run of 12:00:01 was held", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	case <-time.After(700 * time.Millisecond):
	}
	hp.h.open()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	// node-b then starts each task's fire of 12:00:02, due since.
	waiting := maps.Clone(hp.ids)
	for len(waiting) > 0 {
		if r := hp.h.next(t); r.Node == "node-b" && r.ScheduledAt.Equal(limitsAt(2)) {
			delete(waiting, r.TaskID)
		}
	}
}

// Concurrency policies hold across a release for a run that goes on past
// its wait: the releasing node marks the run in etcd, and the next owner
// counts it as running until the marker goes (elsewhere.go). Here each
// task's fire of 12:00:01 still runs on node-a (held) when node-a leaves
// gracefully. On node-b, forbid's fire of 12:00:02 is skipped,
// buffer_one's waits, and replace's starts at once and cancels node-a's
// run; once node-a's runs end, buffer_one's waiting fire starts, and each
// task fires at 12:00:03 (TestEngine_ConcurrencyPolicies shows what each
// policy does on one owner: skip, wait, cancel).
func TestEngine_ConcurrencyPoliciesHoldForARunPastItsRelease(t *testing.T) {
	hp := startHeldPolicies(t, keptApart...)
	of := map[task.ConcurrencyPolicy]string{}
	for id, p := range hp.ids {
		of[p] = id
	}
	closed := closeInBackground(hp.a)
	for id := range hp.ids {
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(hp.b, id) })
		waitNext(t, hp.b, id, limitsAt(2))
	}
	hp.clock.Advance(time.Second)
	// started waits for the next call on node-b of task id's fire at s.
	started := func(id string, s int) {
		t.Helper()
		r := hp.h.next(t)
		if r.TaskID != id || r.Node != "node-b" || !r.ScheduledAt.Equal(limitsAt(s)) {
			t.Fatalf("started %s@%s on %s, want %s@%s on node-b", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node,
				id, limitsAt(s).Format(time.TimeOnly))
		}
	}
	if n := hp.a.e.Stats().RunsMarked; n != 3 {
		t.Errorf("node-a marked %d runs, want 3", n)
	}
	started(of[task.ConcurrencyReplace], 2)
	if n := hp.b.e.Stats().RunsElsewhere; n != 2 {
		t.Errorf("node-b counts %d runs elsewhere once replace's was canceled, want 2", n)
	}
	replaced := hp.old[of[task.ConcurrencyReplace]]
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !replaced.running() })
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, hp.b, of[task.ConcurrencyForbid]).Skipped == 1 })
	select {
	case r := <-hp.h.started:
		t.Fatalf("%s: started %s on %s while node-a's run of 12:00:01 was held", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	case <-time.After(700 * time.Millisecond):
	}
	for _, id := range []string{of[task.ConcurrencyForbid], of[task.ConcurrencyBufferOne]} {
		if !hp.old[id].running() {
			t.Fatalf("%s: node-a's run of 12:00:01 ended before it was let go", id)
		}
	}
	hp.h.open()
	started(of[task.ConcurrencyBufferOne], 2)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return hp.b.e.Stats().RunsElsewhere == 0 })
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	// The figures BENCHMARKS.md quotes ("A release's wait for runs").
	rel := hp.a.e.Stats().HandOver["release"]
	t.Logf("node-a's release of its partitions: %.3f s", rel.Sum)
	// node-a's markers are gone (deleted, or with its lease).
	cli := hp.b.e.cli
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		resp, err := cli.Get(context.Background(), newKeys("").prefix+"/running/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
	hp.clock.Advance(time.Second)
	waiting := maps.Clone(hp.ids)
	for len(waiting) > 0 {
		r := hp.h.next(t)
		if r.Node != "node-b" || !r.ScheduledAt.Equal(limitsAt(3)) {
			t.Fatalf("started %s@%s on %s, want each task's fire of 12:00:03 on node-b", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
		}
		delete(waiting, r.TaskID)
	}
}

// A node cut off from etcd fences itself, and its partitions go to the
// next owner once its lease ends, with no marker of its runs: it cancels
// the runs of tasks whose policy keeps their fires apart at the fence, as
// a crash would end them, so that the next owner's fires start beside
// none. Runs of tasks that allow overlaps go on. Here each task's fire of
// 12:00:01 runs on node-a (held) when node-a is cut off.
func TestEngine_FenceCancelsTheRunsOfTasksKeptApart(t *testing.T) {
	hp := startHeldPolicies(t, slices.Concat(keptApart, []task.ConcurrencyPolicy{task.ConcurrencyAllow})...)
	hp.aEtcd.Cut()
	etcdtest.WaitFor(t, 10*time.Second, hp.a.e.Fenced)
	for id, p := range hp.ids {
		run := hp.old[id]
		if p == task.ConcurrencyAllow {
			continue
		}
		etcdtest.WaitFor(t, 5*time.Second, func() bool { return !run.running() })
		if cause := context.Cause(run.ctx); !errors.Is(cause, errFenced) {
			t.Errorf("%s (%s): run canceled for %v, want %v", id, p, cause, errFenced)
		}
	}
	for id, p := range hp.ids {
		etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(hp.b, id) })
		waitNext(t, hp.b, id, limitsAt(2))
		if run, want := hp.old[id], p == task.ConcurrencyAllow; run.running() != want {
			t.Errorf("%s (%s): node-a's run still running: %v once node-b owns the task, want %v", id, p, run.running(), want)
		}
	}
	// Each task's next fire starts on node-b: a repeat of 12:00:01 (a
	// fenced node's successor resumes from its last watermark) or 12:00:02.
	hp.clock.Advance(time.Second)
	waiting := maps.Clone(hp.ids)
	for len(waiting) > 0 {
		r := hp.h.next(t)
		if r.Node != "node-b" {
			t.Fatalf("started %s@%s on %s, want node-b", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
		}
		if p := hp.ids[r.TaskID]; p != task.ConcurrencyAllow && hp.old[r.TaskID].running() {
			t.Errorf("%s (%s): started %s on node-b beside node-a's run", r.TaskID, p, r.ScheduledAt.Format(time.TimeOnly))
		}
		delete(waiting, r.TaskID)
	}
	hp.aEtcd.Restore() // node-a closes quickly
}

// So does a node cut off from etcd while it closes, its partitions
// released and its runs going on past them under their markers: its lease
// takes the markers when it ends, and the next owners then count no run
// of the tasks. Here forbid's and buffer_one's fires of 12:00:01 run on
// node-a (held) when node-a leaves gracefully; node-a is cut off during
// its drain.
func TestEngine_FenceWhileClosingCancelsTheRunsPastTheirRelease(t *testing.T) {
	hp := startHeldPolicies(t, task.ConcurrencyForbid, task.ConcurrencyBufferOne)
	closed := closeInBackground(hp.a)
	for id := range hp.ids {
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(hp.b, id) })
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return hp.b.e.Stats().RunsElsewhere == len(hp.ids) })
	hp.aEtcd.Cut()
	etcdtest.WaitFor(t, 10*time.Second, hp.a.e.Fenced)
	for id, p := range hp.ids {
		run := hp.old[id]
		etcdtest.WaitFor(t, 5*time.Second, func() bool { return !run.running() })
		if cause := context.Cause(run.ctx); !errors.Is(cause, errFenced) {
			t.Errorf("%s (%s): run canceled for %v, want %v", id, p, cause, errFenced)
		}
	}
	hp.aEtcd.Restore() // node-a closes quickly
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
}

// A marker put that etcd refuses once (a leader change, a request timed
// out) is tried again: the runs it marks are not canceled for it. Since
// the release waits 250 ms for runs (Config.ReleaseRunWait), not 2 s,
// nearly every run of a task kept apart at a release takes a marker, and
// one refusal canceled them all, their fires lost (a cancel is final: no
// retry). Here each task's fire of 12:00:01 runs on node-a (held) when
// node-a leaves gracefully, and etcd refuses node-a's first marker put.
func TestEngine_ReleaseMarksItsRunsThroughARefusal(t *testing.T) {
	hp := startHeldPolicies(t, keptApart...)
	hp.aKV.failsOnce(func(key, _ string) bool { return strings.Contains(key, "/running/") }, rpctypes.ErrLeaderChanged)
	closed := closeInBackground(hp.a)
	for id := range hp.ids {
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(hp.b, id) })
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return hp.a.e.Stats().PartitionsOwned == 0 })
	for id, p := range hp.ids {
		if run := hp.old[id]; !run.running() {
			t.Errorf("%s (%s): node-a's run of 12:00:01 ended at the release (%v), want it marked", id, p, context.Cause(run.ctx))
		}
	}
	if n := hp.a.e.Stats().RunsMarked; n != uint64(len(hp.ids)) {
		t.Errorf("node-a marked %d runs, want %d", n, len(hp.ids))
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return hp.b.e.Stats().RunsElsewhere == len(hp.ids) })
	hp.h.open()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
}

// A newer fire of a replace task cancels that task's run, not the run of
// a task deleted before it that still runs in the same record slot: the
// table reuses a deleted task's record for the next task it loads. Here
// old's triggered run is held when old is deleted, and new, loaded into
// its record, fires twice, its first run held: the second cancels new's
// first run and leaves old's.
func TestEngine_ReplaceCancelsItsOwnRunNotADeletedTasksInTheSameRecord(t *testing.T) {
	c, clock := limitsStart(t)
	h := newHolder(t, "old", "new")
	a := startNode(t, c, "", h.handler, limitsNode(clock, time.Hour, "node-a", func(cfg *Config) {
		cfg.Partitions = 1 // one record table for both tasks
	}))
	t.Cleanup(h.open) // again: cleanups run last first
	old := handlerTask("old", "0 0 0 1 1 *")
	old.Concurrency = task.ConcurrencyReplace
	oldRun := runOfADeletedTask(t, a, h, old)
	nt := handlerTask("new", "* * * * * *")
	nt.Concurrency = task.ConcurrencyReplace
	putTask(t, a.e.Registry(), nt)
	waitNext(t, a, "new", limitsAt(1))
	clock.Advance(time.Second)
	first := h.next(t)
	clock.Advance(time.Second)
	second := h.next(t)
	if first.TaskID != "new" || second.TaskID != "new" || !second.ScheduledAt.Equal(limitsAt(2)) {
		t.Fatalf("held %s@%s then %s@%s, want new's fires of 12:00:01 and 12:00:02",
			first.TaskID, first.ScheduledAt.Format(time.TimeOnly), second.TaskID, second.ScheduledAt.Format(time.TimeOnly))
	}
	if first.running() {
		t.Errorf("new's run of 12:00:01 still runs: its fire of 12:00:02 did not replace it")
	}
	if !oldRun.running() {
		t.Errorf("old's run was canceled by a fire of new, the task loaded into its record after old was deleted")
	}
}

// quietNode keeps a node's errors only: a node whose etcd requests a test
// refuses on purpose warns about each.
func quietNode(cfg *Config) {
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// watermarkWrites matches the node watermark's writes.
func watermarkWrites(key, _ string) bool { return strings.Contains(key, "/watermarks/") }

// waitNamed waits until partition p's checkpoint names the session of node
// n: from then on a successor after a crash resumes from that session's
// acknowledged watermark.
func waitNamed(t *testing.T, c *etcdtest.Cluster, n *testNode, p int) {
	t.Helper()
	sess := sessionID(n.e.sess.Load())
	key := newKeys("").checkpoint(p)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return readCheckpoint(t, c, key).Session == sess })
}

// crash cuts node n off from etcd through its proxy and waits until it
// fenced itself: for the cluster it crashed (its lease runs out and its
// locks pass on), and it dispatches nothing more.
func crash(t *testing.T, n *testNode, proxy *etcdtest.Proxy) {
	t.Helper()
	proxy.Cut()
	etcdtest.WaitFor(t, 10*time.Second, n.e.Fenced)
}

// A retry waits in its node's wheel. A graceful hand-over lists it in the
// released checkpoint; a crash writes none, and the next owner takes it
// from the node watermark's last write, which carries it
// (watermarkValue.Retries). Either way the next owner runs it when it is
// due, once, with its attempt number and its trigger's override. Here
// attempt 1 of a triggered fire fails on node-a with a retry due 5-10 s
// later, node-b takes the partition, and the clock moves 20 s on, then
// 20 s more. After a crash node-b ran nothing of flaky: the retry was lost.
// Deleted and put again between the crash and node-b's acquire, flaky is
// another task, which node-b's load names by the same id: its acquire
// drops the retry, created before the put (heldRetries). By its id alone
// node-b ran attempt 2 of a fire the new task never had.
func TestEngine_WaitingRetryAtAHandOver(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"graceful", "crash", "crash, then put again"} {
		t.Run(how, func(t *testing.T) {
			c, clock := limitsStart(t)
			log := &callLog{}
			h := log.handler(func(_ context.Context, f Fire) error {
				if f.TaskID == "flaky" {
					return errInjected
				}
				return nil
			})
			node := func(id string) func(*Config) { return limitsNode(clock, time.Hour, id) }
			proxy := c.NewProxy(t)
			a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", h, node("node-a"))
			flaky := handlerTask("flaky", "0 0 0 1 1 *") // yearly: only the trigger fires it
			flaky.Retry = task.Retry{MaxAttempts: 3, Backoff: task.Duration(10 * time.Second), MaxBackoff: task.Duration(10 * time.Second)}
			putTask(t, a.e.Registry(), flaky)
			putTask(t, a.e.Registry(), handlerTask("tick", "* * * * * *"))
			// tick reaches node-a's loop through its partition's watch,
			// which can come after flaky's failure: armed only after the
			// crash branch moved the clock on, it would wait for 12:00:02
			// and 12:00:01 would never fire.
			waitNext(t, a, "tick", limitsAt(1))
			payload := json.RawMessage(`{"override":1}`)
			if _, err := a.e.Registry().TriggerWith(context.Background(), "flaky", &task.Override{Payload: payload}); err != nil {
				t.Fatal(err)
			}
			// The failure is applied: the retry waits in node-a's wheel.
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				s, ok := a.e.TaskState(ctx, "flaky")
				return ok && s.Failures == 1
			})

			var b *testNode
			if how == "graceful" {
				b = startNodeOn(t, c.NewClient(t), "", h, node("node-b"))
				a.stop(t)
			} else {
				clock.Advance(time.Second)
				etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("tick", limitsAt(1)) })
				waitNamed(t, c, a, partOf("flaky"))
				key := a.e.keys.watermark("node-a", sessionID(a.e.sess.Load()))
				etcdtest.WaitFor(t, 10*time.Second, func() bool {
					m, err := a.e.readDeadMark(context.Background(), key)
					return err == nil && len(m.retries(partOf("flaky")).Fires) == 1
				})
				crash(t, a, proxy)
				if how == "crash, then put again" {
					reg, err := registry.OpenRegistry(context.Background(), c.Client, DefaultPrefix, limitsParts)
					if err != nil {
						t.Fatal(err)
					}
					if err := reg.Delete(context.Background(), "flaky"); err != nil {
						t.Fatal(err)
					}
					putTask(t, reg, flaky)
				}
				b = startNodeOn(t, c.NewClient(t), "", h, node("node-b"))
			}
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "flaky") })
			for _, s := range []int{20, 40} { // past the retry's time, then its next's
				clock.Advance(20 * time.Second)
				etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("tick", limitsAt(s)) })
			}
			a.stop(t)
			b.stop(t)
			calls := log.of("flaky")
			want := []string{"1 on node-a", "2 on node-b", "3 on node-b"}
			if how == "crash, then put again" {
				want = want[:1]
			}
			var got []string
			for _, c := range calls {
				got = append(got, fmt.Sprintf("%d on %s", c.Attempt, c.Node))
				if !c.ScheduledAt.Equal(calls[0].ScheduledAt) || string(c.Payload) != string(payload) {
					t.Errorf("attempt %d of flaky: fire of %s with payload %s, want the triggered fire's (%s, %s)",
						c.Attempt, c.ScheduledAt.Format(time.TimeOnly), c.Payload, calls[0].ScheduledAt.Format(time.TimeOnly), payload)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("flaky ran attempts %v, want %v", got, want)
			}
		})
	}
}

// heldAttempt is a node running attempt 1 of a triggered fire of flaky (two
// attempts, a backoff of 10s), held until fail, then failed.
type heldAttempt struct {
	c     *etcdtest.Cluster
	clock *testClock
	log   *callLog
	h     HandlerFunc
	a     *testNode // node-a, running it
	fail  func()
}

func startHeldAttempt(t *testing.T, tweaks ...func(*Config)) *heldAttempt {
	return startHeldAttemptOf(t, func(reg *registry.Registry) error {
		_, err := reg.Trigger(context.Background(), "flaky")
		return err
	}, tweaks...)
}

// startHeldAttemptOf is startHeldAttempt with flaky's fire started by
// fire, in place of a trigger, and node-a tweaked by tweaks.
func startHeldAttemptOf(t *testing.T, fire func(*registry.Registry) error, tweaks ...func(*Config)) *heldAttempt {
	return startHeldAttemptWith(t, task.ConcurrencyAllow, fire, tweaks...)
}

// startHeldAttemptWith is startHeldAttemptOf with flaky's concurrency
// policy.
func startHeldAttemptWith(t *testing.T, policy task.ConcurrencyPolicy, fire func(*registry.Registry) error, tweaks ...func(*Config)) *heldAttempt {
	c, clock := limitsStart(t)
	log := &callLog{}
	started, fail := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	failNow := func() { once.Do(func() { close(fail) }) }
	t.Cleanup(failNow)
	h := log.handler(func(ctx context.Context, f Fire) error {
		if f.TaskID != "flaky" || f.Attempt != 1 {
			return nil
		}
		started <- struct{}{}
		select {
		case <-fail:
		case <-ctx.Done():
		}
		return errInjected
	})
	ha := &heldAttempt{c: c, clock: clock, log: log, h: h, fail: failNow}
	ha.a = ha.start(t, "node-a", tweaks...)
	t.Cleanup(failNow) // again: cleanups run last first
	// Yearly: only the trigger fires it.
	flaky := handlerTask("flaky", "0 0 0 1 1 *")
	flaky.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(10 * time.Second), MaxBackoff: task.Duration(10 * time.Second)}
	flaky.Concurrency = policy
	putTask(t, ha.a.e.Registry(), flaky)
	putTask(t, ha.a.e.Registry(), handlerTask("tick", "* * * * * *"))
	if err := fire(ha.a.e.Registry()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("attempt 1 of flaky did not start within 10s")
	}
	return ha
}

func (ha *heldAttempt) start(t *testing.T, id string, tweaks ...func(*Config)) *testNode {
	return startNode(t, ha.c, "", ha.h, limitsNode(ha.clock, time.Hour, id, func(cfg *Config) {
		cfg.DrainTimeout = time.Minute // node-a's held attempt outlasts the hand-over
		for _, tweak := range tweaks {
			tweak(cfg)
		}
	}))
}

// attempts returns flaky's attempts as "attempt on node", once b's loop
// holds the retry of attempt 1 (or ran it), the clock passed the latest
// time of that retry, twice, and b stopped.
func (ha *heldAttempt) attempts(t *testing.T, b *testNode) []string {
	t.Helper()
	// A retry handed on through etcd reaches b's loop through its trigger
	// watch, which can come well after node-a wrote it: a clock moved on
	// and b stopped before would end the test with the retry still in
	// etcd, never run. (One handed over in a checkpoint is there once b
	// owns the task.) One due at once may have run before this looks.
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return b.e.Stats().RetryBacklog >= 1 || len(ha.log.of("flaky")) > 1
	})
	return ha.ran(t, b)
}

// ran returns flaky's attempts as "attempt on node", once the clock passed
// the latest time of a retry of attempt 1 due from now, twice, and b
// stopped.
func (ha *heldAttempt) ran(t *testing.T, b *testNode) []string {
	t.Helper()
	for _, s := range []int{20, 40} {
		ha.clock.Advance(20 * time.Second)
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return ha.log.firedAt("tick", limitsAt(s)) })
	}
	b.stop(t)
	var got []string
	for _, c := range ha.log.of("flaky") {
		got = append(got, fmt.Sprintf("%d on %s", c.Attempt, c.Node))
	}
	return got
}

// A graceful release waits up to Config.ReleaseRunWait for the attempts
// of retrying tasks under way (running, or queued and taken by a worker
// while it waits for the queue): one that fails meanwhile hands its retry
// over with its partition. Here attempt 1 of a triggered fire runs on
// node-a, held, while node-a leaves gracefully, its wait 10 s; it fails
// once the release has taken the task out of the loop, and node-b,
// starting after, runs attempt 2.
func TestEngine_RetryOfAnAttemptEndingDuringItsReleaseIsHandedOver(t *testing.T) {
	ha := startHeldAttempt(t, func(cfg *Config) { cfg.ReleaseRunWait = MaxReleaseRunWait })
	ea := ha.a.e
	closed := closeInBackground(ha.a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return ea.Stats().PartitionsOwned == 0 })
	ha.fail() // attempt 1 fails on node-a, during its release
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	ha.a.stop(t)
	b := ha.start(t, "node-b")
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "flaky") })
	if got, want := ha.attempts(t, b), []string{"1 on node-a", "2 on node-b"}; !slices.Equal(got, want) {
		t.Errorf("flaky ran attempts %v, want %v", got, want)
	}
}

// Past that wait the release is sealed: the retry of an attempt still
// running then is handed on through etcd, as a trigger that carries its
// attempt, which the task's owner runs after its backoff. Here attempt 1
// runs on node-a, held, while node-a leaves gracefully; it fails once
// node-b owns the task, with node-a's dispatch loop stopped (its worker
// hands the retry on), and attempt 2 runs on node-b. It was lost: the
// checkpoint, written, could not list it.
func TestEngine_RetryOfAnAttemptRunningPastItsReleaseIsHandedOnThroughEtcd(t *testing.T) {
	t.Parallel()
	ha := startHeldAttempt(t)
	b := ha.start(t, "node-b")
	closed := closeInBackground(ha.a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "flaky") })
	<-ha.a.e.loopDone // Close drains the workers once the loop stopped
	ha.fail()         // attempt 1 fails on node-a, after its release
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	if n := ha.a.e.Stats().RetriesHandedOn; n != 1 {
		t.Errorf("node-a counts %d retries handed on through etcd, want 1", n)
	}
	ha.a.stop(t)
	reg := b.e.Registry()
	if got, want := ha.attempts(t, b), []string{"1 on node-a", "2 on node-b"}; !slices.Equal(got, want) {
		t.Errorf("flaky ran attempts %v, want %v", got, want)
	}
	// The retry's trigger key went once node-b took the retry: left, it
	// would run again at every acquire of the partition.
	if n, err := reg.PendingTriggerCount(context.Background()); err != nil || n != 0 {
		t.Errorf("%d trigger keys left (%v), want none", n, err)
	}
}

// An attempt that the node's stop cancels with attempts left, past its
// drain timeout or hurried, has its retry handed on through etcd as one
// failing past its release has, but due at once: its cancel says nothing
// of what it calls. It was lost, neither retried here nor on the next
// owner: with the default drain timeout (30 s) under the default task
// timeout (1 m), a rolling restart lost such fires. Here attempt 1 of a
// triggered fire of flaky, with a payload, runs on node-a, held, while
// node-a leaves gracefully, and is canceled at the end of a drain of
// 100 ms, or by Hurry during one of an hour; node-b runs attempt 2 with
// the trigger's payload, and node-a's record of attempt 1 says canceled,
// and why. flaky, kept apart (forbid), has a marker of its run past the
// release, which node-b's retry does not wait for: it is of that run's
// fire.
func TestEngine_RetryOfAnAttemptTheStopCancelsIsHandedOn(t *testing.T) {
	payload := json.RawMessage(`{"override":1}`)
	for _, tc := range []struct {
		policy task.ConcurrencyPolicy
		hurry  bool
	}{
		{task.ConcurrencyAllow, false},
		{task.ConcurrencyAllow, true},
		{task.ConcurrencyForbid, false},
	} {
		t.Run(fmt.Sprintf("%s/hurry=%t", tc.policy, tc.hurry), func(t *testing.T) {
			hurry, drain := tc.hurry, 100*time.Millisecond
			if hurry {
				drain = time.Hour
			}
			ha := startHeldAttemptWith(t, tc.policy, func(reg *registry.Registry) error {
				_, err := reg.TriggerWith(context.Background(), "flaky", &task.Override{Payload: payload})
				return err
			}, func(cfg *Config) { cfg.DrainTimeout = drain })
			b := ha.start(t, "node-b")
			closed := closeInBackground(ha.a)
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "flaky") })
			if hurry {
				<-ha.a.e.loopDone // Close drains the workers once the loop stopped
				ha.a.e.Hurry()
			}
			if err := <-closed; err != nil {
				t.Errorf("close node-a: %v", err)
			}
			if n := ha.a.e.Stats().RetriesHandedOn; n != 1 {
				t.Errorf("node-a counts %d retries handed on through etcd, want 1", n)
			}
			marked := uint64(0)
			if tc.policy != task.ConcurrencyAllow {
				marked = 1
			}
			if n := ha.a.e.Stats().RunsMarked; n != marked {
				t.Errorf("node-a marked %d runs past their release, want %d", n, marked)
			}
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(history(t, ha.a, "flaky")) > 0 })
			if e := history(t, ha.a, "flaky")[0]; e.Status != task.ExecutionCanceled || !strings.Contains(e.Error, errStopped.Error()) {
				t.Errorf("node-a recorded attempt 1 %s (%s), want canceled for %q", e.Status, e.Error, errStopped)
			}
			ha.a.stop(t)
			if got, want := ha.attempts(t, b), []string{"1 on node-a", "2 on node-b"}; !slices.Equal(got, want) {
				t.Errorf("flaky ran attempts %v, want %v", got, want)
			}
			for _, c := range ha.log.of("flaky") {
				if string(c.Payload) != string(payload) {
					t.Errorf("attempt %d of flaky ran with payload %s, want the trigger's %s", c.Attempt, c.Payload, payload)
				}
			}
		})
	}
}

// A retry handed on through etcd is of the task whose attempt it retries,
// not of its id: deleted and put again after the release, before its node
// writes the retry, the task is another, which does not fire from it. It
// did: the retry's write checked only that a task of the id existed. Here
// attempt 1 of flaky runs on node-a, held, past node-a's release to
// node-b, flaky is deleted and put again, and attempt 1 fails, or the
// stop cancels it (Hurry); node-b runs no attempt of the new flaky.
func TestEngine_RetryOfATaskPutAgainSinceItsReleaseIsNotHandedOn(t *testing.T) {
	for _, hurry := range []bool{false, true} {
		t.Run(fmt.Sprintf("hurry=%t", hurry), func(t *testing.T) {
			ha := startHeldAttempt(t)
			b := ha.start(t, "node-b")
			closed := closeInBackground(ha.a)
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "flaky") })
			<-ha.a.e.loopDone // Close drains the workers once the loop stopped
			reg := b.e.Registry()
			ctx := context.Background()
			if err := reg.Delete(ctx, "flaky"); err != nil {
				t.Fatal(err)
			}
			again := handlerTask("flaky", "0 0 0 1 1 *")
			again.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(10 * time.Second), MaxBackoff: task.Duration(10 * time.Second)}
			putTask(t, reg, again)
			if hurry {
				ha.a.e.Hurry()
			} else {
				ha.fail()
			}
			if err := <-closed; err != nil {
				t.Errorf("close node-a: %v", err)
			}
			ha.a.stop(t)
			if n, err := reg.PendingTriggerCount(ctx); err != nil || n != 0 {
				t.Errorf("%d trigger keys (%v) once node-a closed, want none", n, err)
			}
			if got, want := ha.ran(t, b), []string{"1 on node-a"}; !slices.Equal(got, want) {
				t.Errorf("flaky ran attempts %v, want %v", got, want)
			}
		})
	}
}

// A backfill runs whole while its task is paused, retries too, and a
// graceful hand-over passes the retry of its fire on as the backfill's.
// Through etcd it went as a plain retry, which the next owner skipped
// for the pause. Here flaky, paused, is backfilled over its one yearly
// fire, and its attempt 1 fails once node-b owns it, as in
// TestEngine_RetryOfAnAttemptRunningPastItsReleaseIsHandedOnThroughEtcd.
func TestEngine_BackfillsRetryHandedOnThroughEtcdRunsWhileItsTaskIsPaused(t *testing.T) {
	t.Parallel()
	ha := startHeldAttemptOf(t, func(reg *registry.Registry) error {
		ctx := context.Background()
		if _, err := reg.SetPaused(ctx, "flaky", true); err != nil {
			return err
		}
		jan1 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		_, err := reg.Backfill(ctx, "flaky", jan1.Add(-time.Second), jan1.Add(time.Second), 1)
		return err
	})
	b := ha.start(t, "node-b")
	closed := closeInBackground(ha.a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "flaky") })
	<-ha.a.e.loopDone
	ha.fail()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	ha.a.stop(t)
	if got, want := ha.attempts(t, b), []string{"1 on node-a", "2 on node-b"}; !slices.Equal(got, want) {
		t.Errorf("flaky ran attempts %v, want %v", got, want)
	}
}

// The retry of a backfill's fire handed on through etcd is the backfill's
// until the backfill is canceled, also when the cancel came first: here
// node-b's watch saw the cancel before the retry of flaky's attempt 1,
// failing on node-a past its release, reached it. The retry came as the
// backfill's, and node-b, holding no fire of the backfill to stop, ran it
// while flaky was paused, and would have run its every attempt.
func TestEngine_BackfillsRetryHandedOnThroughEtcdAfterItsCancelIsSkippedWhilePaused(t *testing.T) {
	t.Parallel()
	first := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ha := startHeldAttemptOf(t, func(reg *registry.Registry) error {
		ctx := context.Background()
		if _, err := reg.SetPaused(ctx, "flaky", true); err != nil {
			return err
		}
		// Two yearly fires, one at a time: the release records the
		// first, still running, and the backfill runs on, to be canceled.
		_, err := reg.Backfill(ctx, "flaky", first.Add(-time.Second), first.AddDate(1, 0, 1), 1)
		return err
	})
	b := ha.start(t, "node-b")
	closed := closeInBackground(ha.a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "flaky") })
	<-ha.a.e.loopDone
	reg := b.e.Registry()
	if _, err := reg.CancelBackfill(context.Background(), "flaky"); err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("%s/backfills/%05d/flaky", DefaultPrefix, reg.Partition("flaky"))
	resp, err := ha.c.Client.Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the canceled record: %v, %v", resp, err)
	}
	canceledAt := resp.Kvs[0].ModRevision
	etcdtest.WaitFor(t, 10*time.Second, func() bool { // node-b's watch saw the cancel
		b.e.bf.mu.Lock()
		defer b.e.bf.mu.Unlock()
		return b.e.bf.newest["flaky"] >= canceledAt
	})
	ha.fail() // attempt 1 fails on node-a, after its release: its retry goes through etcd
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	if n := ha.a.e.Stats().RetriesHandedOn; n != 1 {
		t.Errorf("node-a counts %d retries handed on through etcd, want 1", n)
	}
	ha.a.stop(t)
	ha.attempts(t, b)
	var got []string
	for _, c := range ha.log.of("flaky") {
		if c.ScheduledAt.Equal(first) { // node-b may have run the second fire's attempt 1 before the cancel
			got = append(got, fmt.Sprintf("%d on %s", c.Attempt, c.Node))
		}
	}
	if want := []string{"1 on node-a"}; !slices.Equal(got, want) {
		t.Errorf("flaky, paused, ran attempts %v of its canceled backfill's first fire; want %v, its retry skipped", got, want)
	}
}

// A buffer_one fire waiting behind a running one is in flight with it: the
// node watermark passes it (it would otherwise hold the bounded lead, and
// every task of the node, for as long as the running fire takes). A
// graceful hand-over passes it on (TestEngine_GracefulHandOverPassesWaitingFires);
// so that a crash does not lose it, the watermark writes carry it with
// the waiting retries, and the next owner runs it, due by the point it
// resumes from. Before they did, node-b's first run was 12:00:03: the fire
// of 12:00:02 was lost.
func TestEngine_BufferedFireSurvivesACrash(t *testing.T) {
	t.Parallel()
	c, clock := limitsStart(t)
	h := newHolder(t, "slow")
	node := func(id string) func(*Config) {
		return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.DrainTimeout = time.Second })
	}
	a, proxy := startWaitingBehindAHeldRun(t, c, clock, h, h.handler, node("node-a"))

	crash(t, a, proxy)
	b := startNodeOn(t, c.NewClient(t), "", h.handler, node("node-b"))
	t.Cleanup(h.open) // again: cleanups run last first
	if r := h.next(t); r.Node != "node-b" || !r.ScheduledAt.Equal(limitsAt(2)) {
		t.Errorf("started %s on %s, want 12:00:02 on node-b, the fire that waited on node-a", r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	waitNext(t, b, "slow", limitsAt(3))
	h.open()
	clock.Advance(time.Second)
	if r := h.next(t); r.Node != "node-b" || !r.ScheduledAt.Equal(limitsAt(3)) {
		t.Errorf("then started %s on %s, want 12:00:03 on node-b", r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	a.stop(t)
}

// startWaitingBehindAHeldRun starts a node through a proxy of its own,
// with slow, a buffer_one task of every second whose fire of 12:00:01 runs
// held by h and whose fire of 12:00:02 waits behind it, and returns once
// the node's checkpoint names its session and a watermark write etcd
// acknowledged lists the waiting fire. handler calls h.
func startWaitingBehindAHeldRun(t *testing.T, c *etcdtest.Cluster, clock *testClock, h *holder, handler HandlerFunc, tweak func(*Config)) (*testNode, *etcdtest.Proxy) {
	t.Helper()
	proxy := c.NewProxy(t)
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", handler, tweak)
	t.Cleanup(h.open) // again: cleanups run last first
	slow := handlerTask("slow", "* * * * * *")
	slow.Concurrency = task.ConcurrencyBufferOne
	putTask(t, a.e.Registry(), slow)
	waitNext(t, a, "slow", limitsAt(1))
	clock.Advance(time.Second)
	if r := h.next(t); !r.ScheduledAt.Equal(limitsAt(1)) {
		t.Fatalf("first fire %s", r.ScheduledAt.Format(time.TimeOnly))
	}
	waitNext(t, a, "slow", limitsAt(2))
	clock.Advance(time.Second)
	waitNext(t, a, "slow", limitsAt(3)) // 12:00:02 was released: it waits behind 12:00:01
	key := a.e.keys.watermark(a.e.cfg.NodeID, sessionID(a.e.sess.Load()))
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		m, err := a.e.readDeadMark(context.Background(), key)
		return err == nil && !m.v.At.Before(limitsAt(2)) && len(m.retries(partOf("slow")).Fires) == 1
	})
	waitNamed(t, c, a, partOf("slow"))
	return a, proxy
}

// A node cut off from etcd runs on until it fences (the lease TTL less
// the fence margin): a buffer_one fire that its last acknowledged write
// lists as waiting must not start there meanwhile, for the successor runs
// it from that list. It may start once etcd acknowledged a write that no
// longer lists it, which a node cut off never has. Here node-a is cut off
// with slow@02 listed, waiting behind slow@01, and slow@01 ends at once.
// Carried without that wait, node-a started slow@02 before it fenced and
// node-b ran it again (TestChaos_CutOffNodeKeepsConcurrencyPolicies: 3
// fires twice).
func TestEngine_CutOffNodeLeavesAListedWaitingFireToItsSuccessor(t *testing.T) {
	t.Parallel()
	c, clock := limitsStart(t)
	log := &callLog{}
	h := newHolder(t, "slow")
	node := func(id string) func(*Config) {
		return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.DrainTimeout = time.Second })
	}
	a, proxy := startWaitingBehindAHeldRun(t, c, clock, h, log.handler(h.handler), node("node-a"))

	proxy.Cut()
	h.open() // slow@01 ends before node-a fences
	etcdtest.WaitFor(t, 10*time.Second, a.e.Fenced)
	if got := runsAt(log, "slow", limitsAt(2)); len(got) > 0 {
		t.Errorf("slow@02 ran on %v, cut off from etcd after a write that listed it", got)
	}
	b := startNodeOn(t, c.NewClient(t), "", log.handler(h.handler), node("node-b"))
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return len(runsAt(log, "slow", limitsAt(2))) > 0 })
	waitNext(t, b, "slow", limitsAt(3))
	clock.Advance(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(runsAt(log, "slow", limitsAt(3))) > 0 })
	if got := runsAt(log, "slow", limitsAt(2)); !slices.Equal(got, []string{"node-b"}) {
		t.Errorf("slow@02 ran on %v, want once, on node-b", got)
	}
	if d := duplicateKeys(log); len(d) > 0 {
		t.Errorf("fires ran twice: %v", d)
	}
	proxy.Restore() // node-a closes quickly
	a.stop(t)
}

// runsAt returns the nodes that ran the first attempt of id's fire at
// sched, in order.
func runsAt(log *callLog, id string, sched time.Time) []string {
	var out []string
	for _, c := range log.of(id) {
		if c.Attempt == 1 && c.ScheduledAt.Equal(sched) {
			out = append(out, c.Node)
		}
	}
	return out
}

// checkRuns checks on which nodes id's fire at each limitsAt(s) of want
// ran, once each has run as often as want says or 10 s have passed: a
// catch-up runs its fires side by side, so the last fire's run says
// nothing of the others'.
func checkRuns(t *testing.T, log *callLog, id string, want map[int][]string) {
	t.Helper()
	ran := func() bool {
		for s, nodes := range want {
			if len(runsAt(log, id, limitsAt(s))) < len(nodes) {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(10 * time.Second); !ran() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	for _, s := range slices.Sorted(maps.Keys(want)) {
		if got := runsAt(log, id, limitsAt(s)); !slices.Equal(got, want[s]) {
			t.Errorf("%s@%s ran on %v, want %v", id, limitsAt(s).Format(time.TimeOnly), got, want[s])
		}
	}
}

// A new owner names its session in a partition's checkpoint only once its
// acknowledged watermark covers the partition's catch-up (nameSession).
// Until then the checkpoint points at the previous owner's point, and a
// crash makes the next owner resume from there: it repeats what the
// crashed owner fired since. Here etcd refuses node-b's naming, which
// stretches that window (it is normally a watermark interval or two):
// node-b fires 12:00:02 and 12:00:03, crashes, and node-c fires both again.
func TestEngine_CrashBeforeTheSessionIsNamedRepeatsFires(t *testing.T) {
	t.Parallel()
	c, clock := limitsStart(t)
	log := &callLog{}
	node := func(id string) func(*Config) { return limitsNode(clock, time.Hour, id) }
	a := startNode(t, c, "", log.handler(nil), node("node-a"))
	putTask(t, a.e.Registry(), handlerTask("tick", "* * * * * *"))
	waitNext(t, a, "tick", limitsAt(1))
	clock.Advance(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("tick", limitsAt(1)) })

	proxy := c.NewProxy(t)
	cliB := c.NewClient(t, proxy.Endpoint())
	injectFaults(cliB).puts(func(key, value string) bool {
		return strings.Contains(key, "/checkpoints/") && strings.Contains(value, `"session":`)
	})
	b := startNodeOn(t, cliB, "", log.handler(nil), func(cfg *Config) { node("node-b")(cfg); quietNode(cfg) })
	a.stop(t) // a graceful hand-over: node-b resumes after node-a's mark
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, "tick") })
	for s := 2; s <= 3; s++ {
		waitNext(t, b, "tick", limitsAt(s))
		clock.Advance(time.Second)
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("tick", limitsAt(s)) })
	}
	cp := readCheckpoint(t, c, newKeys("").checkpoint(partOf("tick")))
	if cp.Node != "node-b" || cp.Session != "" {
		t.Fatalf("checkpoint %+v, want node-b's naming no session", cp)
	}

	crash(t, b, proxy)
	startNode(t, c, "", log.handler(nil), node("node-c"))
	checkRuns(t, log, "tick", map[int][]string{1: {"node-a"}, 2: {"node-b", "node-c"}, 3: {"node-b", "node-c"}})
	b.stop(t)
}

// A released checkpoint lists at most maxHandOver (2000) fires handed over
// unrun. Past that its point stops before the first fire left out, and the
// next owner fires every task from there as well as the listed fires: the
// listed fires due at or after the point run twice. Here 2100 fires of
// one tick wait in the queue (no worker takes them) when the partition is
// released: 2000 are listed, the point stops before the tick, and the next
// owner runs those 2000 twice and the other 100 once.
func TestLoop_ReleaseListsAtMost2000UnrunFires(t *testing.T) {
	const n = maxHandOver + 100
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), func(cfg *Config) { cfg.Queue, cfg.BatchSize = 2*n, 2*n })
	tl.add(t, 0, base.Add(-time.Second), noopProfile(task.MisfireFireOnce), "* * * * * *", ids("q", n)...)
	tl.clock.Advance(time.Second/2 + time.Millisecond)
	tl.dispatch()
	if got := len(tl.dispatched(0)); got != n {
		t.Fatalf("%d fires queued, want %d", got, n)
	}
	rel := tl.releaseNow(0)
	tl.handOverQueued(rel.hand, unrunAll) // the workers did not take them in time
	hand := rel.hand[0]
	if len(hand.pending) != maxHandOver {
		t.Errorf("%d fires listed, want %d", len(hand.pending), maxHandOver)
	}
	if left := tl.dispatched(0); len(left) != 0 {
		t.Errorf("%d fires still queued to run here after the hand-over", len(left))
	}
	if want := base.UnixNano() - 1; hand.mark != want {
		t.Errorf("released point %s, want just before the tick %s", time.Unix(0, hand.mark).UTC().Format(time.StampNano), base.Format(time.TimeOnly))
	}

	// What the next owner runs: every task from its first fire after the
	// point, and the listed fires.
	runs := map[string]int{}
	h := tl.everySecond(t)
	for _, id := range ids("q", n) {
		if at := next(tl.scheds.Get(h), hand.mark); at == base.UnixNano() {
			runs[id]++
		}
	}
	for _, f := range hand.pending {
		if f.At.Equal(base) {
			runs[f.ID]++
		}
	}
	twice, once := 0, 0
	for _, id := range ids("q", n) {
		switch runs[id] {
		case 2:
			twice++
		case 1:
			once++
		default:
			t.Errorf("%s@%s runs %d times on the next owner", id, base.Format(time.TimeOnly), runs[id])
		}
	}
	if twice != maxHandOver || once != n-maxHandOver {
		t.Errorf("the next owner runs %d fires of the tick twice and %d once, want %d and %d", twice, once, maxHandOver, n-maxHandOver)
	}
}

// A released checkpoint fits in an etcd request whatever its ids hold. Here
// 2000 fires of ids of 256 bytes, most of them '&' (6 bytes in JSON), and
// as many tasks fired past the mark, wait unrun when the partition is
// released: listed whole, the checkpoint would be over 3 MiB, which etcd
// refuses every time. It sheds what it lists, and the next owner still
// misses no fire: a fire shed is before the lowered mark.
func TestLoop_ReleaseOfLongEscapedIDsFitsInARequest(t *testing.T) {
	const n = maxHandOver
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), func(cfg *Config) { cfg.Queue, cfg.BatchSize = 2*n, 2*n })
	long := make([]string, n)
	for i := range long {
		long[i] = strings.Repeat("&", task.MaxIDLen-5) + fmt.Sprintf("%05d", i)
	}
	tl.add(t, 0, base.Add(-time.Second), noopProfile(task.MisfireFireOnce), "* * * * * *", long...)
	tl.clock.Advance(time.Second/2 + time.Millisecond)
	tl.dispatch()
	rel := tl.releaseNow(0)
	tl.handOverQueued(rel.hand, unrunAll) // the workers did not take them in time
	hand := rel.hand[0]
	hand.after = slices.Clone(hand.pending[:maxAfter]) // and some fired past the mark
	for _, f := range hand.pending[:maxFired] {        // and as many triggers that fired
		hand.fired = append(hand.fired, firedTrigger{ID: f.ID, At: f.At.Add(time.Millisecond), Rev: 1})
	}
	if len(hand.pending) != n {
		t.Fatalf("%d fires listed, want %d", len(hand.pending), n)
	}

	b := hand.encode("node-a")
	c := etcdtest.Start(t)
	if _, err := c.NewClient(t).Put(context.Background(), "/checkpoint", string(b)); err != nil {
		t.Fatalf("etcd refused a checkpoint of %d bytes: %v", len(b), err)
	}
	var cp checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		t.Fatal(err)
	}
	if len(cp.Pending) == 0 || len(cp.Pending) == n || len(cp.After) != 0 || len(cp.Fired) != 0 {
		t.Fatalf("%d fires, %d after and %d triggers fired listed in %d bytes, want fewer fires, no after and no trigger: a fire shed repeats",
			len(cp.Pending), len(cp.After), len(cp.Fired), len(b))
	}
	// It sheds no more than it must: each fire shed is one the next owner
	// repeats.
	if one := jsonSize(cp.Pending[0]) + 1; len(b) <= maxCheckpointBytes-one {
		t.Errorf("%d fires listed in %d bytes: room for %d more", len(cp.Pending), len(b), (maxCheckpointBytes-len(b))/one)
	}
	// What the next owner runs: every task from its first fire after the
	// point, and the listed fires.
	checkNoneMissed(t, tl, cp, base, long)
}

// checkNoneMissed checks that the next owner of cp runs the every-second
// fire at base of each of ids: listed, or after the point it resumes from.
func checkNoneMissed(t *testing.T, tl *testLoop, cp checkpoint, base time.Time, ids []string) {
	t.Helper()
	h := tl.everySecond(t)
	listed := map[string]bool{}
	for _, f := range cp.Pending {
		listed[f.ID] = f.At.Equal(base)
	}
	for _, id := range ids {
		if next(tl.scheds.Get(h), cp.Watermark.UnixNano()) > base.UnixNano() && !listed[id] {
			t.Fatalf("the fire of %.12s…@%s is neither listed nor after the point %s", id, base.Format(time.TimeOnly), cp.Watermark.Format(time.StampNano))
		}
	}
}

// startStalledNode starts node-a on clock through a proxy (so that the test
// can crash it) with the every-second task id, fires 12:00:01, and waits
// until etcd acknowledged a watermark at or past it and the checkpoint
// names the session. Then it refuses node-a's watermark writes: its
// acknowledged watermark stays at 12:00:01.5, and dispatch at most the
// bounded lead (1 s) past it.
func startStalledNode(t *testing.T, c *etcdtest.Cluster, clock *testClock, misfire time.Duration, log *callLog, id string) (*testNode, *etcdtest.Proxy) {
	t.Helper()
	proxy := c.NewProxy(t)
	cli := c.NewClient(t, proxy.Endpoint())
	faults := injectFaults(cli)
	a := startNodeOn(t, cli, "", log.handler(nil), limitsNode(clock, misfire, "node-a", quietNode))
	putTask(t, a.e.Registry(), handlerTask(id, "* * * * * *"))
	waitNext(t, a, id, limitsAt(1))
	clock.Advance(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt(id, limitsAt(1)) })
	waitNamed(t, c, a, partOf(id))
	sess := sessionID(a.e.sess.Load())
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !readWatermark(t, c, "node-a", sess).Before(limitsAt(1)) })
	faults.puts(watermarkWrites)
	return a, proxy
}

// Executors run a fire at least once in failure scenarios. A crashed
// node's successor resumes from the last watermark etcd acknowledged for
// it, and the node dispatched up to the bounded lead past that: those
// fires run again, with the same idempotency key and a higher fence. Here
// node-a's watermark stays at 12:00:01.5; it fires 12:00:02 (within the
// 1 s lead) but not 12:00:03, crashes, and node-b fires 12:00:02 again,
// then 12:00:03 once.
func TestEngine_CrashRepeatsFiresPastTheAcknowledgedWatermark(t *testing.T) {
	t.Parallel()
	c, clock := limitsStart(t)
	log := &callLog{}
	a, proxy := startStalledNode(t, c, clock, time.Hour, log, "tick")
	clock.Advance(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("tick", limitsAt(2)) })
	clock.Advance(time.Second) // 12:00:03 is past the lead: node-a waits for an acknowledgement
	waitNext(t, a, "tick", limitsAt(3))

	crash(t, a, proxy)
	startNode(t, c, "", log.handler(nil), limitsNode(clock, time.Hour, "node-b"))
	checkRuns(t, log, "tick", map[int][]string{1: {"node-a"}, 2: {"node-a", "node-b"}, 3: {"node-b"}})
	var twice []call
	for _, c := range log.of("tick") {
		if c.ScheduledAt.Equal(limitsAt(2)) {
			twice = append(twice, c)
		}
	}
	if len(twice) == 2 {
		if twice[0].IdempotencyKey() != twice[1].IdempotencyKey() {
			t.Errorf("the repeat's idempotency key %s differs from the first run's %s", twice[1].IdempotencyKey(), twice[0].IdempotencyKey())
		}
		if twice[1].Fence <= twice[0].Fence {
			t.Errorf("the repeat's fence %d is not above the first run's %d: a receiver cannot refuse the older", twice[1].Fence, twice[0].Fence)
		}
	}
	a.stop(t)
}

// A misfire decision looks up to the present, past the bounded lead: after
// a stall longer than the misfire threshold, fire_once fires the latest
// missed time at once, though the node's acknowledged watermark is far
// behind it. A crash right after makes the next owner resume from that
// watermark, make the same decision, and fire that one catch-up fire
// again (not the missed fires it stands for). Here node-a stalls from
// 12:00:01.5 to 12:00:31.5 and fires 12:00:31; node-b fires it again.
func TestEngine_MisfireCatchUpPastTheLeadRepeatsAfterACrash(t *testing.T) {
	t.Parallel()
	c, clock := limitsStart(t)
	log := &callLog{}
	a, proxy := startStalledNode(t, c, clock, 5*time.Second, log, "late") // fire_once, the default
	clock.Advance(30 * time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("late", limitsAt(31)) })

	crash(t, a, proxy)
	startNode(t, c, "", log.handler(nil), limitsNode(clock, 5*time.Second, "node-b"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(runsAt(log, "late", limitsAt(31))) == 2 })
	if got := runsAt(log, "late", limitsAt(31)); !slices.Equal(got, []string{"node-a", "node-b"}) {
		t.Errorf("late@12:00:31 ran on %v, want node-a then node-b", got)
	}
	if got := secs(log.scheds("late")); !slices.Equal(got, []string{"12:00:01.000", "12:00:31.000", "12:00:31.000"}) {
		t.Errorf("late fired at %v, want 12:00:01, then the catch-up fire 12:00:31 twice", got)
	}
	a.stop(t)
}

// A graceful hand-over neither repeats nor misses a fire (doc.go), a
// misfire's catch-up fire included. Here node-a's dispatch point is held
// back (its watermark is not acknowledged, so the lead stops the wheel at
// 12:00:02), the clock jumps 30 s, and node-a folds the missed fires into
// one catch-up fire, 12:00:31 (fire_once), past its wheel's time. Then
// node-a leaves gracefully: its released checkpoint's mark is its wheel's
// time, before 12:00:31, and node-b, resuming after the mark, must not run
// 12:00:31 again. (The chaos suite saw this as 273 duplicates when a node
// whose workers were far behind left in TestChaos_RollingRestart.)
func TestEngine_MisfireCatchUpIsNotRepeatedAfterAGracefulRelease(t *testing.T) {
	c, clock := limitsStart(t)
	log := &callLog{}
	a, _ := startStalledNode(t, c, clock, 5*time.Second, log, "late") // fire_once, the default
	clock.Advance(30 * time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("late", limitsAt(31)) })

	b := startNode(t, c, "", log.handler(nil), limitsNode(clock, 5*time.Second, "node-b"))
	a.stop(t) // graceful: a released checkpoint for every partition
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return b.e.Owns(partOf("late")) })
	clock.Advance(2 * time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("late", limitsAt(33)) })
	b.stop(t)
	if got := runsAt(log, "late", limitsAt(31)); !slices.Equal(got, []string{"node-a"}) {
		t.Errorf("late@12:00:31 ran on %v, want node-a only: a graceful hand-over repeated it", got)
	}
	t.Logf("late fired at %v", secs(log.scheds("late")))
}

// A trigger's key is its only record until the owner deletes it, once
// its fire started. When the delete fails and the node crashes before a retry
// succeeds, the next owner finds the key at its acquire and fires the
// trigger again (TestEngine_TriggerWhoseDeleteFailedFiresOnce shows that
// a live node retries the delete, so a graceful hand-over fires it once).
func TestEngine_TriggerWhoseDeleteFailedFiresAgainAfterACrash(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := &callLog{}
	proxy := c.NewProxy(t)
	cliA := c.NewClient(t, proxy.Endpoint())
	injectFaults(cliA).deletes(triggerKeys)
	a := startNodeOn(t, cliA, "", log.handler(nil), func(cfg *Config) { cfg.NodeID = "node-a"; cfg.Partitions = limitsParts; quietNode(cfg) })
	putTask(t, a.e.Registry(), handlerTask("once", "0 0 0 1 1 *")) // yearly: only the trigger fires it
	if _, err := a.e.Registry().Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("once")) == 1 })

	crash(t, a, proxy)
	startNode(t, c, "", log.handler(nil), func(cfg *Config) { cfg.NodeID = "node-b"; cfg.Partitions = limitsParts })
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("once")) == 2 })
	calls := log.of("once")
	if calls[0].Node != "node-a" || calls[1].Node != "node-b" || calls[0].IdempotencyKey() != calls[1].IdempotencyKey() {
		t.Errorf("the trigger ran as %s on %s, then %s on %s; want the same fire on node-a, then node-b",
			calls[0].IdempotencyKey(), calls[0].Node, calls[1].IdempotencyKey(), calls[1].Node)
	}
	a.stop(t)
}

// A release waits up to handOverWait (2 s) for workers to take the
// partition's queued fires, and only then lists those still queued in its
// checkpoint. Meanwhile neither node fires the partition: behind busy
// workers a hand-over stands still that long, and its fires run late on
// the next owner (once: neither repeated nor lost). Here node-a's only
// worker is held by a triggered fire, tick@12:00:01 waits in its queue,
// and node-a leaves: the release takes at least 2 s and node-b runs tick@1.
func TestEngine_ReleaseBehindBusyWorkersWaitsBeforeHandingQueuedFiresOver(t *testing.T) {
	c, clock := limitsStart(t)
	log := &callLog{}
	h := newHolder(t, "slow")
	handler := log.handler(h.handler)
	node := func(id string, workers int) func(*Config) {
		return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.Workers, cfg.DrainTimeout = workers, time.Minute })
	}
	a := startNode(t, c, "", handler, node("node-a", 1))
	putTask(t, a.e.Registry(), handlerTask("slow", "0 0 0 1 1 *")) // yearly: only the trigger fires it
	putTask(t, a.e.Registry(), handlerTask("tick", "* * * * * *"))
	waitNext(t, a, "tick", limitsAt(1))
	if _, err := a.e.Registry().Trigger(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	h.next(t) // node-a's only worker is busy
	clock.Advance(time.Second)
	waitNext(t, a, "tick", limitsAt(2)) // tick@1 is queued behind it

	b := startNodeOn(t, c.NewClient(t), "", handler, node("node-b", 8))
	t.Cleanup(h.open) // again: cleanups run last first
	ea := a.e
	closed := closeInBackground(a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(runsAt(log, "tick", limitsAt(1))) > 0 })
	h.open()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	if got := runsAt(log, "tick", limitsAt(1)); !slices.Equal(got, []string{"node-b"}) {
		t.Errorf("tick@12:00:01 ran on %v, want node-b only", got)
	}
	rel := ea.Stats().HandOver["release"]
	if rel.Sum < 2 { // doc.go says up to 2 s
		t.Errorf("node-a released %d partitions in %.2f s, want at least 2 s of waiting for its worker", rel.Count, rel.Sum)
	}
	b.stop(t)
}

// blockCmd holds the dispatch loop until out is closed: the commands sent
// meanwhile wait in line. in is closed once the loop is held.
type blockCmd struct{ in, out chan struct{} }

func (c blockCmd) run(*loop) { close(c.in); <-c.out }

// holdLoop holds n's dispatch loop until the returned function is called
// (at the latest when the test ends).
func holdLoop(t *testing.T, n *testNode) (let func()) {
	t.Helper()
	c := blockCmd{in: make(chan struct{}), out: make(chan struct{})}
	var once sync.Once
	let = func() { once.Do(func() { close(c.out) }) }
	t.Cleanup(let)
	if err := n.e.call(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	<-c.in
	return let
}

// tickReleasedAtOneAndAHalf has a node with cfg fire the every-second task
// "tick" of concurrency policy cp at 12:00:01 and stop, releasing it at
// 12:00:01.5, then moves the clock to 12:00:04.5: the fires of 2 to 4 are
// the next owner's to run.
func tickReleasedAtOneAndAHalf(t *testing.T, c *etcdtest.Cluster, clock *testClock, log *callLog, cp task.ConcurrencyPolicy, cfg func(*Config)) {
	t.Helper()
	a := startNode(t, c, "", log.handler(nil), cfg)
	tick := handlerTask("tick", "* * * * * *")
	tick.Concurrency = cp
	putTask(t, a.e.Registry(), tick)
	waitNext(t, a, "tick", limitsAt(1))
	clock.Advance(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt("tick", limitsAt(1)) })
	a.stop(t)
	clock.Advance(3 * time.Second)
}

// An acquire that fails after it loaded its partition (etcd did not
// answer one of its last reads) takes the tasks out of the wheel as a
// release does, dispatching the fires due up to the loop's time, and puts
// the previous checkpoint back: the next acquire resumes from the previous
// point and fires those again. Here the partition was released at
// 12:00:01.5 and nobody fired it until 12:00:04.5. node-b loads it, its
// read of the partition's triggers fails, and node-b fires 12:00:02-04 as
// it undoes; its next try resumes from the point put back and fires them
// again. (One the ring or a leave cancels after loading is not undone:
// TestEngine_AcquireTheRingCancelsAfterLoadingRepeatsNothing.)
func TestEngine_AcquireUndoneAfterLoadingRepeatsFires(t *testing.T) {
	c, clock := limitsStart(t)
	log := &callLog{}
	node := func(id string) func(*Config) {
		return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.Partitions = 1 }) // the loop hears from one acquire only
	}
	tickReleasedAtOneAndAHalf(t, c, clock, log, task.ConcurrencyAllow, node("node-a"))

	cliB := c.NewClient(t)
	injectFaults(cliB).failsGetOnce(func(key string) bool { return strings.Contains(key, "/triggers/") })
	b := startNodeOn(t, cliB, "", log.handler(nil), node("node-b"), noWait)
	defer b.stop(t)
	bb := []string{"node-b", "node-b"}
	checkRuns(t, log, "tick", map[int][]string{1: {"node-a"}, 2: bb, 3: bb, 4: bb})
}

// An acquire undone after it armed its partition cancels the runs it
// started of tasks whose policy keeps their fires apart: it puts the
// previous checkpoint back and writes no marker of them (elsewhere.go), so
// that the partition's next acquire, here or on another node, fires the
// same times again beside them. Here node-b loads the partition released
// at 12:00:01.5, its forbid task's fire of 12:00:02 starts (held), and the
// read of the partition's triggers then fails; node-b acquires the
// partition again and fires 12:00:02 again.
func TestEngine_AcquireUndoneCancelsTheRunsOfTasksKeptApart(t *testing.T) {
	c, clock := limitsStart(t)
	log := &callLog{}
	node := func(id string) func(*Config) {
		return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.Partitions = 1 })
	}
	tickReleasedAtOneAndAHalf(t, c, clock, log, task.ConcurrencyForbid, node("node-a"))

	h := newHolder(t, "tick")
	cliB := c.NewClient(t)
	started := make(chan struct{})
	injectFaults(cliB).failsGetOnceAfter(func(key string) bool { return strings.Contains(key, "/triggers/") }, started)
	b := startNodeOn(t, cliB, "", log.handler(h.handler), node("node-b"), noWait)
	defer b.stop(t)
	defer h.open() // before node-b stops
	undone := h.next(t)
	close(started)
	for {
		again := h.next(t)
		if again.Fence != undone.Fence {
			break // the next acquire's
		}
	}
	if undone.running() {
		t.Fatalf("the run of %s the undone acquire started goes on beside the next acquire's fires", undone.ScheduledAt.Format(time.TimeOnly))
	}
	if cause := context.Cause(undone.ctx); !errors.Is(cause, errUndone) {
		t.Errorf("the undone acquire's run canceled for %v, want %v", cause, errUndone)
	}
}

// So are the fires it dispatched of those tasks that wait for a worker
// when it is undone: taken after the cut, they ran beside the next
// acquire's fires of the same times. Here node-b, with two workers, loads
// the partition released at 12:00:00.5: the fires of 12:00:02 of two
// tasks take the workers (held), and the forbid task's fire of 12:00:03
// waits for one; the read of the partition's triggers then fails, and the
// workers are let go once the acquire is undone. node-b acquires the
// partition again and fires 12:00:03 again.
func TestEngine_AcquireUndoneDropsTheQueuedFiresOfTasksKeptApart(t *testing.T) {
	c, clock := limitsStart(t)
	node := func(id string, more ...func(*Config)) func(*Config) {
		return limitsNode(clock, time.Hour, id, append([]func(*Config){func(cfg *Config) { cfg.Partitions, cfg.Workers = 1, 2 }}, more...)...)
	}
	a := startNode(t, c, "", (&callLog{}).handler(nil), node("node-a"))
	for _, id := range []string{"busy-1", "busy-2"} {
		putTask(t, a.e.Registry(), handlerTask(id, "2 * * * * *"))
	}
	tick := handlerTask("tick", "3 * * * * *")
	tick.Concurrency = task.ConcurrencyForbid
	putTask(t, a.e.Registry(), tick)
	waitNext(t, a, "tick", limitsAt(3))
	a.stop(t)
	clock.Advance(4 * time.Second)

	h := newHolder(t, "tick")
	busy := make(chan Fire, 4)
	letBusy := make(chan struct{})
	let := sync.OnceFunc(func() { close(letBusy) })
	handler := func(ctx context.Context, f Fire) error {
		if f.TaskID != "tick" {
			busy <- f
			<-letBusy
			return nil
		}
		return h.handler(ctx, f)
	}
	var bLog logbuf.Buffer
	cliB := c.NewClient(t)
	started := make(chan struct{})
	injectFaults(cliB).failsGetOnceAfter(func(key string) bool { return strings.Contains(key, "/triggers/") }, started)
	b := startNodeOn(t, cliB, "", handler, node("node-b", func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&bLog, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}), noWait)
	defer b.stop(t)
	defer h.open() // before node-b stops
	defer let()
	var undone Fire
	select {
	case undone = <-busy:
	case <-time.After(10 * time.Second):
		t.Fatal("node-b's fires of 12:00:02 did not start")
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return b.e.pool.depth() == 1 }) // tick's fire of 12:00:03
	close(started)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(bLog.String(), "acquiring a partition failed") })
	let()
	var ran []blocked
	for {
		r := h.next(t)
		if r.Fence != undone.Fence {
			break // the next acquire's
		}
		ran = append(ran, r)
	}
	for _, r := range ran {
		if r.running() {
			t.Errorf("the fire of %s the undone acquire dispatched runs beside the next acquire's fires", r.ScheduledAt.Format(time.TimeOnly))
		}
	}
}

// An acquire the ring cancels after it loaded its partition (the fires
// due since the previous point are dispatched already) is not undone: it
// ends, and the partition is released to the node the ring chose, with its
// exact mark. Undone, its checkpoint put back, the next owner fired those
// fires again: under load, nodes fencing and rejoining moved partitions
// while they loaded, and a chaos run saw 2 010 repeats. Here node-b loads
// the partition released at 12:00:01.5 while its loop is held, node-c
// joins and the ring gives it the partition: node-b fires 12:00:02-04,
// node-c what follows, and nothing twice.
func TestEngine_AcquireTheRingCancelsAfterLoadingRepeatsNothing(t *testing.T) {
	c, clock := limitsStart(t)
	log := &callLog{}
	node := func(id string, more ...func(*Config)) func(*Config) {
		return limitsNode(clock, time.Hour, id, append([]func(*Config){func(cfg *Config) { cfg.Partitions = 1 }}, more...)...)
	}
	// node-c must win the one partition from node-b.
	var cID string
	for i := 0; cID == ""; i++ {
		id := fmt.Sprintf("node-c%d", i)
		cfg := DefaultConfig(id)
		cfg.Partitions = 1
		r, err := ring.New(cfg.ring())
		if err != nil {
			t.Fatal(err)
		}
		if a, err := r.Update([]string{"node-b", id}); err == nil && slices.Contains(a.Owned(id), 0) {
			cID = id
		}
	}
	tickReleasedAtOneAndAHalf(t, c, clock, log, task.ConcurrencyAllow, node("node-a"))

	cliB := c.NewClient(t)
	go_ := make(chan struct{})
	held := injectFaults(cliB).pauses(func(key, value string) bool { // node-b's first checkpoint, as it acquires
		return strings.Contains(key, "/checkpoints/") && strings.Contains(value, `"node":"node-b"`)
	}, go_)
	var bLog logbuf.Buffer
	b := startNodeOn(t, cliB, "", log.handler(nil), node("node-b", func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&bLog, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}), noWait)
	defer b.stop(t)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("node-b did not acquire the partition")
	}
	let := holdLoop(t, b)
	close(go_)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(b.e.loop.cmds) == 1 }) // the load, in line
	nc := startNodeOn(t, c.NewClient(t), "", log.handler(nil), node(cID), noWait)
	defer nc.stop(t)
	// node-b's ring gives the partition to node-c: the line is logged as
	// the member set is followed, and the acquire canceled right after.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(bLog.String(), "joined="+cID) })
	let()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return nc.e.Owns(0) })
	clock.Advance(time.Second)
	checkRuns(t, log, "tick", map[int][]string{1: {"node-a"}, 2: {"node-b"}, 3: {"node-b"}, 4: {"node-b"}, 5: {cID}})
}

// A leave cut short (Hurry, or a leave mark etcd refused, or prepareWait
// passed) ends the acquires still under way, but one that loaded its
// partition is not undone either: it ends, and the partition is released
// with the others, with its exact mark. Undone, its checkpoint put back,
// the next owner fired again what it had fired. Here node-b loads the
// partition released at 12:00:01.5 while its loop is held, and closes in a
// hurry: node-b fires 12:00:02-04, node-c what follows, and nothing twice.
func TestEngine_AcquireAHurriedCloseEndsAfterLoadingRepeatsNothing(t *testing.T) {
	hurriedCloseWithTheLoadInLine(t, func(eb *Engine) {
		// Undone, the acquire puts its release in line behind the load at
		// once; not undone, nothing comes.
		for deadline := time.Now().Add(2 * time.Second); len(eb.loop.cmds) < 2 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}, nil)
}

// A job a worker took before its partition's release counts as started
// there (waitTaken): the release lists it nowhere. Under Hurry, the stop
// of the executions comes right after the release; a worker that reaches
// its stop check (pool.work) only then does not run the job, and hands it
// on (stopUnrun), for a task that neither retries nor keeps its fires
// apart too, by its partition's release (leavers.unrun). It was run nowhere,
// seen once under load as "tick@12:00:02 ran on [], want [node-b]". Here
// the first worker that takes one of node-b's fires 12:00:02-04 is held
// between its take and its check until the stop, as a loaded machine may
// hold it.
func TestEngine_AcquireAHurriedCloseRunsAFireTakenBeforeTheStop(t *testing.T) {
	hurriedCloseWithTheLoadInLine(t, func(*Engine) {}, newTakenGate())
}

// A leave cut short waits for an acquire that loaded its partition, even
// past etcdTimeout, while that acquire waits for the dispatch loop: its
// load is in line there and runs whatever becomes of the request that put
// it there, so undone, its checkpoint put back, the next owner fired again
// what the load had fired. Here node-b's loop, held, takes the load 6 s
// after a hurried Close: node-b fires 12:00:02-04, node-c what follows,
// and nothing twice.
func TestEngine_AcquireAHurriedCloseWaitsForALoopSlowerThanEtcdTimeout(t *testing.T) {
	t.Parallel()
	hurriedCloseWithTheLoadInLine(t, func(*Engine) {
		time.Sleep(etcdTimeout + time.Second) // a loop busy past the leave's wait
	}, nil)
}

// takenGate is a Clock that holds the first reading a worker takes after
// taking a job (pool.work), until let: the worker has taken the job, for
// the release, and not yet looked at the stop.
type takenGate struct {
	Clock
	held atomic.Bool // one worker is held; the others pass (a sync.Once would hold them all)
	open chan struct{}
	once sync.Once
}

func newTakenGate() *takenGate { return &takenGate{open: make(chan struct{})} }

// let lets the held worker go; it may be called more than once.
func (g *takenGate) let() { g.once.Do(func() { close(g.open) }) }

func (g *takenGate) Now() time.Time {
	if pc, _, _, ok := runtime.Caller(1); ok && strings.HasSuffix(runtime.FuncForPC(pc).Name(), ".(*pool).work") {
		if g.held.CompareAndSwap(false, true) {
			<-g.open
		}
	}
	return g.Clock.Now()
}

// hurriedCloseWithTheLoadInLine has node-b load the partition node-a
// released at 12:00:01.5 while node-b's loop is held, closes node-b in a
// hurry, runs busy while the loop is still held, then checks that node-b
// fires 12:00:02-04, node-c what follows, and nothing twice. With gate,
// node-b's first job taken waits at it until the node's stop canceled
// the executions, and node-c runs that fire instead.
func hurriedCloseWithTheLoadInLine(t *testing.T, busy func(eb *Engine), gate *takenGate) {
	t.Helper()
	c, clock := limitsStart(t)
	log := &callLog{}
	node := func(id string) func(*Config) {
		return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.Partitions = 1 })
	}
	tickReleasedAtOneAndAHalf(t, c, clock, log, task.ConcurrencyAllow, node("node-a"))

	cliB := c.NewClient(t)
	go_ := make(chan struct{})
	held := injectFaults(cliB).pauses(func(key, value string) bool { // node-b's first checkpoint, as it acquires
		return strings.Contains(key, "/checkpoints/") && strings.Contains(value, `"node":"node-b"`)
	}, go_)
	tweakB := node("node-b")
	if gate != nil {
		tweakB = func(cfg *Config) {
			node("node-b")(cfg)
			gate.Clock = cfg.Clock
			cfg.Clock = gate
		}
	}
	b := startNodeOn(t, cliB, "", log.handler(nil), tweakB, noWait)
	defer b.stop(t)
	if gate != nil {
		defer gate.let() // before the stop, which drains the worker it holds
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("node-b did not acquire the partition")
	}
	let := holdLoop(t, b)
	close(go_)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(b.e.loop.cmds) == 1 }) // the load, in line
	b.e.Hurry()
	eb := b.e
	closed := closeInBackground(b)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return eb.runCtx.Err() != nil })
	busy(eb)
	let()
	if gate != nil {
		etcdtest.WaitFor(t, 20*time.Second, func() bool { return context.Cause(eb.pool.execCtx) == errStopped })
		if !gate.held.Load() {
			t.Fatal("no worker was held between its take and its stop check: did pool.work change?")
		}
		gate.let()
	}
	if err := <-closed; err != nil {
		t.Errorf("close node-b: %v", err)
	}
	nc := startNode(t, c, "", log.handler(nil), node("node-c"))
	defer nc.stop(t)
	clock.Advance(time.Second)
	if gate == nil {
		checkRuns(t, log, "tick", map[int][]string{1: {"node-a"}, 2: {"node-b"}, 3: {"node-b"}, 4: {"node-b"}, 5: {"node-c"}})
		return
	}
	// The held job's fire, 12:00:02 unless another worker looked at the
	// clock first, is handed on, and node-c runs it.
	checkRuns(t, log, "tick", map[int][]string{1: {"node-a"}, 5: {"node-c"}})
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return len(runsAt(log, "tick", limitsAt(2))) > 0 && len(runsAt(log, "tick", limitsAt(3))) > 0 && len(runsAt(log, "tick", limitsAt(4))) > 0
	})
	handed := 0
	for s := 2; s <= 4; s++ {
		switch got := runsAt(log, "tick", limitsAt(s)); {
		case slices.Equal(got, []string{"node-c"}):
			handed++
		case !slices.Equal(got, []string{"node-b"}):
			t.Errorf("tick@%s ran on %v, want once, on node-b or, handed on, node-c", limitsAt(s).Format(time.TimeOnly), got)
		}
	}
	if handed != 1 {
		t.Errorf("node-c ran %d of node-b's fires, want the one held", handed)
	}
}

// A checkpoint over 512 KiB sheds fires from the end of pending and moves
// the mark before them, so that the next owner fires them again from the
// schedule. A backfill's fire is not on the schedule (the backfill's
// progress is recorded past it): shed, nobody runs it. Here 400 fires of
// long escaped ids wait in the queue with, behind them, a trigger and a
// backfill fire of another task when the partition is released: the
// checkpoint must still list the backfill's fire. The trigger is not
// listed: its key stays for the next owner.
func TestLoop_ReleaseOverTheSizeLimitKeepsBackfillFires(t *testing.T) {
	const n = 400
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), func(cfg *Config) { cfg.Queue, cfg.BatchSize = 2*n, 2*n })
	long := make([]string, n)
	for i := range long {
		long[i] = strings.Repeat("&", task.MaxIDLen-5) + fmt.Sprintf("%05d", i)
	}
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", long...)
	tl.add(t, 0, base.Add(-time.Second), prof, "0 0 0 1 1 *", "manual") // yearly: not due now
	tl.clock.Advance(time.Second/2 + time.Millisecond)
	tl.dispatch()
	tl.trigger(0, "manual", base)
	bfAt := base.AddDate(0, -1, 0) // a backfill of last month
	bf := &backfillCmd{part: 0, id: "manual", at: bfAt.UnixNano(), reply: make(chan backfillAnswer, 1)}
	tl.handle(bf)
	if a := <-bf.reply; a != backfillTook {
		t.Fatalf("the backfill fire was not taken: %d", a)
	}
	rel := tl.releaseNow(0)
	tl.handOverQueued(rel.hand, unrunAll) // the workers did not take them in time
	hand := rel.hand[0]
	if len(hand.pending) != n+1 {
		t.Fatalf("%d fires listed, want %d: the schedule's and the backfill's", len(hand.pending), n+1)
	}

	b := hand.encode("node-a")
	var cp checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		t.Fatal(err)
	}
	if len(b) > maxCheckpointBytes {
		t.Fatalf("checkpoint of %d bytes", len(b))
	}
	backfill := slices.ContainsFunc(cp.Pending, func(f pendingFire) bool {
		return f.ID == "manual" && f.Backfill && f.At.Equal(bfAt)
	})
	if !backfill {
		t.Errorf("checkpoint of %d fires does not list the backfill's fire; shed, nobody runs it (point %s)",
			len(cp.Pending), cp.Watermark.Format(time.RFC3339Nano))
	}
	if !cp.Watermark.After(base.Add(-time.Second)) {
		t.Errorf("point %s: every task of the partition fires again from there", cp.Watermark.Format(time.RFC3339Nano))
	}
	// And the schedule fires shed still run on the next owner.
	checkNoneMissed(t, tl, cp, base, long)
}

// resumingEngine is an engine of node-a, its clock stopped at base, with
// what resume needs: a client of a new etcd, and keys.
func resumingEngine(t *testing.T, base time.Time) (*Engine, *clientv3.Client) {
	t.Helper()
	cli := etcdtest.Start(t).NewClient(t)
	cfg := DefaultConfig("node-a").withDefaults()
	cfg.Clock = newTestClock(base, 0)
	return &Engine{cfg: cfg, log: quietLogger(), cli: cli, keys: newKeys("")}, cli
}

// putKey puts k, and returns the etcd revision it was written at.
func putKey(t *testing.T, cli *clientv3.Client, k, v string) int64 {
	t.Helper()
	resp, err := cli.Put(context.Background(), k, v)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// The hand-over an ended session kept in memory (drop) is bounded as a
// release's: when this node takes the partition again, resume returns its
// pending and after lists, and the acquire writes them in its hold
// checkpoint before anything else. Whole, with long escaped ids, that
// checkpoint was over etcd's request limit, refused every time: the
// partition was never acquired again.
func TestEngine_ResumeFromAnEndedSessionFitsInARequest(t *testing.T) {
	const n = maxHandOver
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, cli := resumingEngine(t, base)
	hand := &handOver{mark: base.UnixNano()}
	for i := range n {
		id := strings.Repeat("&", task.MaxIDLen-5) + fmt.Sprintf("%05d", i)
		hand.pending = append(hand.pending, pendingFire{ID: id, At: base})
		if i < maxAfter {
			hand.after = append(hand.after, pendingFire{ID: id, At: base.Add(time.Second)})
		}
	}
	e.keepEnded("s1", map[int]*handOver{0: hand})
	named, _ := json.Marshal(checkpoint{Node: "node-a", Session: "s1", Watermark: base.Add(-time.Minute)})
	if _, err := cli.Put(context.Background(), e.keys.checkpoint(0), string(named)); err != nil {
		t.Fatal(err)
	}

	res, err := e.resume(context.Background(), 0, newDeadMarks())
	if err != nil {
		t.Fatal(err)
	}
	// What acquire writes first (putCheckpoint).
	hold, _ := json.Marshal(checkpoint{Node: e.cfg.NodeID, Watermark: time.Unix(0, res.w).UTC(), Pending: res.pending, After: res.after})
	if _, err := cli.Put(context.Background(), "/hold", string(hold)); err != nil {
		t.Fatalf("etcd refused the acquire's hold checkpoint of %d bytes (%d fires, %d after): %v", len(hold), len(res.pending), len(res.after), err)
	}
}

// Past maxHandOver fires a release moves its mark before a scheduled
// fire, which the next owner repeats, rather than drop a backfill's fire,
// which nobody would run again; only a list full of those loses one, and
// counts it.
func TestHandOver_ListKeepsBackfillsPastTheCap(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sched := base.Add(-time.Second)
	h := &handOver{mark: base.UnixNano()}
	for i := range maxHandOver {
		h.list(pendingFire{ID: fmt.Sprint("s", i), At: sched}, sched.UnixNano())
	}
	h.list(pendingFire{ID: "s-more", At: sched}, sched.UnixNano())
	h.list(pendingFire{ID: "b", At: base.AddDate(0, -1, 0), Backfill: true}, base.AddDate(0, -1, 0).UnixNano())
	b1 := slices.ContainsFunc(h.pending, func(f pendingFire) bool { return f.ID == "b" })
	if len(h.pending) != maxHandOver || !b1 {
		t.Errorf("%d fires listed, the backfill's %v; want %d with it", len(h.pending), b1, maxHandOver)
	}
	if want := sched.UnixNano() - 1; h.mark != want {
		t.Errorf("mark %s, want just before the scheduled fires left out (%s)", time.Unix(0, h.mark).UTC().Format(time.StampNano), sched.Format(time.StampNano))
	}

	full := &handOver{mark: base.UnixNano()}
	for i := range maxHandOver + 3 {
		full.list(pendingFire{ID: fmt.Sprint("b", i), At: base.AddDate(0, -1, 0), Backfill: true}, base.AddDate(0, -1, 0).UnixNano())
	}
	if len(full.pending) != maxHandOver || full.lost != 3 || full.mark != base.UnixNano() {
		t.Errorf("a list of backfills' fires only: %d listed, %d lost, mark moved %v; want %d, 3, not moved", len(full.pending), full.lost, full.mark != base.UnixNano(), maxHandOver)
	}
}

// A checkpoint that cannot list every scheduled fire moves its mark before
// the ones it drops, and the next owner repeats every fire of the
// partition after the mark: it drops the latest, which moves the mark back
// least. pending is not in time order (fires waiting behind a running one
// come from a map); dropping the last listed moved it back further.
func TestHandOver_DropsTheLatestScheduledFires(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	late, early := base.Add(-100*time.Millisecond), base.Add(-time.Second)

	// Past the cap, a backfill's fire takes the latest scheduled fire's place.
	h := &handOver{mark: base.UnixNano()}
	h.list(pendingFire{ID: "late", At: late}, late.UnixNano())
	for i := range maxHandOver - 1 {
		h.list(pendingFire{ID: fmt.Sprintf("early%04d", i), At: early}, early.UnixNano())
	}
	h.list(pendingFire{ID: "backfill", At: early, Backfill: true}, early.UnixNano())
	if h.mark != late.UnixNano()-1 || h.pending[0].ID != "backfill" {
		t.Errorf("past the cap: mark %s, first listed %s; want the mark before %s, the backfill's fire in late's place",
			time.Unix(0, h.mark).UTC().Format(time.StampMilli), h.pending[0].ID, late.Format(time.StampMilli))
	}

	// Over the checkpoint's bytes, the latest is shed first.
	h = &handOver{mark: base.UnixNano(), pending: []pendingFire{{ID: "late", At: late}, {ID: "early", At: early}}}
	h.shedPending(1)
	if h.mark != late.UnixNano()-1 || len(h.pending) != 1 || h.pending[0].ID != "early" {
		t.Errorf("over the bytes: mark %s, kept %v; want the mark before %s, early kept",
			time.Unix(0, h.mark).UTC().Format(time.StampMilli), h.pending, late.Format(time.StampMilli))
	}
}

// Retries of a released partition go to its next owner, as the released
// checkpoint lists them: one waiting for its backoff runs when it was
// due, one queued when the drain ended runs at once, each with its attempt
// number and its trigger's override.
func TestLoop_RetriesAreHandedOverWaitingOrQueued(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.maxAttempts = "noop/retry3", 3
	over := &task.Override{Payload: json.RawMessage(`{"n":1}`)}
	retries := []pendingFire{
		{ID: "waiting", At: at.Add(-time.Minute), Attempt: 2, Due: at.Add(30 * time.Second), Override: over},
		{ID: "queued", At: at.Add(-time.Minute), Attempt: 3, Due: at},
	}
	load := func() *testLoop {
		tl := newTestLoop(t, at, nil)
		tl.add(t, 0, at, prof, "0 0 0 1 1 *", "waiting", "queued")
		tl.handle(&takeOverCmd{part: 0, fires: retries})
		tl.dispatchAll()
		return tl
	}
	// queued returns the loop's queued jobs as "id attempt override".
	queued := func(tl *testLoop) []string {
		var out []string
		tl.pool.mu.Lock()
		defer tl.pool.mu.Unlock()
		for i := range tl.pool.queued() {
			j := tl.pool.at(i)
			o := "none"
			if over := j.extra.override(); over != nil {
				o = string(over.Payload)
			}
			out = append(out, fmt.Sprintf("%s@%d attempt %d override %s", j.id, j.sched/int64(time.Millisecond), j.attempt, o))
		}
		return out
	}
	sched := at.Add(-time.Minute).UnixMilli()
	wantQueued := fmt.Sprintf("queued@%d attempt 3 override none", sched)
	wantWaiting := fmt.Sprintf(`waiting@%d attempt 2 override {"n":1}`, sched)

	a := load()
	if got := queued(a); !slices.Equal(got, []string{wantQueued}) {
		t.Fatalf("the first owner queued %v, want %v", got, wantQueued)
	}
	rel := a.releaseNow(0)
	a.handOverQueued(rel.hand, unrunAll) // the workers did not take the queued retry in time
	if n := a.retrying.Load(); n != 0 {
		t.Errorf("%d retries still wait in the released owner's wheel", n)
	}
	cp := rel.hand[0].encode("a")
	var back checkpoint
	if err := json.Unmarshal(cp, &back); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(back.Pending, func(x, y pendingFire) int { return strings.Compare(y.ID, x.ID) })
	if len(back.Pending) != 2 || back.Pending[0].Due != retries[0].Due || back.Pending[0].Attempt != 2 ||
		back.Pending[1].Attempt != 3 || back.Pending[1].Due.After(at) {
		t.Fatalf("the released checkpoint lists %s, want both retries", cp)
	}

	b := newTestLoop(t, at, nil)
	b.add(t, 0, at, prof, "0 0 0 1 1 *", "waiting", "queued")
	b.handle(&takeOverCmd{part: 0, fires: back.Pending})
	b.dispatchAll()
	if got := queued(b); !slices.Equal(got, []string{wantQueued}) {
		t.Errorf("the next owner queued %v at once, want %v", got, wantQueued)
	}
	b.clock.Advance(29 * time.Second)
	b.dispatchAll()
	if got := queued(b); len(got) != 1 {
		t.Errorf("the next owner queued %v before the waiting retry was due", got)
	}
	b.clock.Advance(time.Second)
	b.dispatchAll()
	if got := queued(b); !slices.Equal(got, []string{wantQueued, wantWaiting}) {
		t.Errorf("the next owner queued %v once the waiting retry was due, want %v", got, []string{wantQueued, wantWaiting})
	}
}

// A release waits a little for the attempts of retrying tasks that were
// under way when it took their tasks out (running, or queued and taken
// while it waited): one that fails before the release is sealed hands its
// retry over with the partition, due after its backoff, as if it had
// failed before the release; one queued and handed over unrun ends there;
// one that fails after the seal of a graceful release has its retry
// written to etcd (through the chain writer), and after another seal (a
// fence, an undone acquire) is lost with its partition.
func TestLoop_RetryOfAnAttemptEndingDuringTheReleaseIsHandedOver(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	retrying := retryingProfile()
	sched := at.Add(-time.Minute).UnixMilli()
	// start queues attempt 1 of flaky and of steady (one attempt), as
	// handed over to this owner, and the release takes them out: the
	// returned jobs, then taken by workers.
	start := func(t *testing.T) (*testLoop, release, []job) {
		tl := newTestLoop(t, at, nil)
		tl.add(t, 0, at, retrying, "0 0 0 1 1 *", "flaky")
		tl.add(t, 0, at, noopProfile(task.MisfireFireOnce), "0 0 0 1 1 *", "steady")
		tl.handle(&takeOverCmd{part: 0, fires: []pendingFire{
			{ID: "flaky", At: at.Add(-time.Minute)}, {ID: "steady", At: at.Add(-time.Minute)}}})
		tl.dispatchAll()
		var jobs []job
		tl.pool.mu.Lock()
		for i := range tl.pool.queued() {
			jobs = append(jobs, *tl.pool.at(i))
		}
		tl.pool.mu.Unlock()
		if len(jobs) != 2 {
			t.Fatalf("queued %d jobs, want flaky's and steady's", len(jobs))
		}
		return tl, tl.releaseNow(0), jobs
	}
	fail := func(tl *testLoop, jobs ...job) {
		var done completionBatch
		for i := range jobs {
			done.add(&jobs[i], statusFailed, "boom", false)
		}
		tl.complete(&done)
	}
	seal := func(tl *testLoop, rel release, queued unrunJobs) {
		c := &sealCmd{rel: rel, queued: queued, late: true, reply: make(chan struct{}, 1)}
		tl.handle(c)
		<-c.reply
	}
	ended := func(rel release) bool {
		select {
		case <-rel.running.ended:
			return true
		default:
			return false
		}
	}
	pending := func(rel release) []string {
		var out []string
		for _, f := range rel.hand[0].pending {
			out = append(out, fmt.Sprintf("%s@%d attempt %d", f.ID, f.At.UnixMilli(), f.Attempt))
		}
		return out
	}

	t.Run("fails before the seal", func(t *testing.T) {
		tl, rel, jobs := start(t)
		tl.pool.reset() // the workers took both
		if rel.running == nil || ended(rel) {
			t.Fatal("the release waits for no attempt, want flaky's")
		}
		tl.clock.Advance(time.Second)
		fail(tl, jobs...)
		if !ended(rel) {
			t.Error("the release still waits once flaky's attempt ended")
		}
		seal(tl, rel, unrunNone)
		want := []string{fmt.Sprintf("flaky@%d attempt 2", sched)}
		if got := pending(rel); !slices.Equal(got, want) {
			t.Fatalf("the release hands over %v, want %v", got, want)
		}
		// Due after its backoff from the failure: between half and all of it.
		due := rel.hand[0].pending[0].Due
		if failed := at.Add(time.Second); due.Before(failed.Add(5*time.Second)) || due.After(failed.Add(10*time.Second)) {
			t.Errorf("the handed retry is due at %v, want 5-10s after the failure at %v", due, failed)
		}
		if tl.pool.leaving.len() != 0 {
			t.Errorf("the loop still holds %d leaving tasks", tl.pool.leaving.len())
		}
	})
	t.Run("queued and handed over unrun", func(t *testing.T) {
		tl, rel, _ := start(t)
		seal(tl, rel, unrunAll) // the workers took nothing in time
		if !ended(rel) {
			t.Error("the release still waits for an attempt handed over unrun")
		}
		want := []string{fmt.Sprintf("flaky@%d attempt 0", sched), fmt.Sprintf("steady@%d attempt 0", sched)}
		if got := pending(rel); !slices.Equal(got, want) {
			t.Errorf("the release hands over %v, want %v", got, want)
		}
	})
	t.Run("fails after the seal", func(t *testing.T) {
		tl, rel, jobs := start(t)
		tl.pool.reset()
		seal(tl, rel, unrunNone) // the wait ran out
		tl.clock.Advance(time.Second)
		fail(tl, jobs...)
		if got := pending(rel); len(got) != 0 {
			t.Errorf("a sealed release got %v", got)
		}
		var got []string
		for _, f := range tl.pool.chains.take() {
			if f.retry != nil {
				got = append(got, fmt.Sprintf("%s@%d attempt %d", f.from, f.sched/int64(time.Millisecond), f.retry.Attempt))
				if failed := at.Add(time.Second); f.retry.Due.Before(failed.Add(5*time.Second)) || f.retry.Due.After(failed.Add(10*time.Second)) {
					t.Errorf("the retry is due at %v, want 5-10s after the failure at %v", f.retry.Due, failed)
				}
			}
		}
		if want := []string{fmt.Sprintf("flaky@%d attempt 2", sched)}; !slices.Equal(got, want) {
			t.Errorf("retries for etcd %v, want %v", got, want)
		}
		if tl.pool.leaving.len() != 0 {
			t.Errorf("the loop still holds %d leaving tasks", tl.pool.leaving.len())
		}
	})
	t.Run("fails after the seal, read by no loop", func(t *testing.T) {
		// Its worker found the release not sealed, and sent the completion
		// once the loop had stopped (Close drains the workers after it).
		tl, rel, jobs := start(t)
		tl.pool.reset()
		seal(tl, rel, unrunNone)
		b := tl.pool.batch()
		b.add(&jobs[0], statusFailed, "boom", false)
		tl.pool.done <- b
		tl.pool.drain(time.Second)
		if got := tl.pool.chains.take(); len(got) != 1 || got[0].retry == nil || got[0].from != "flaky" {
			t.Errorf("handed on %+v, want flaky's retry", got)
		}
	})
	t.Run("fails after a fence's seal", func(t *testing.T) {
		tl, rel, jobs := start(t)
		tl.pool.reset()
		c := &sealCmd{rel: rel, reply: make(chan struct{}, 1)} // late false: a fence's drop
		tl.handle(c)
		<-c.reply
		if tl.pool.leaving.len() != 0 {
			t.Errorf("the loop still holds %d leaving tasks once sealed", tl.pool.leaving.len())
		}
		fail(tl, jobs...)
		if got := tl.pool.chains.take(); len(got) != 0 || len(pending(rel)) != 0 {
			t.Errorf("a fenced release handed %v on, and %v over", got, pending(rel))
		}
	})
}

// A node whose fenced session is followed by a second one that fences
// before it acquires anything (etcd still overloaded) takes the first
// one's partitions back from the first one's hand-over: the second, which
// held nothing, does not erase it. It did, and the partitions resumed from
// the first session's watermark, repeating up to the lead of its fires
// (a chaos run under a load of 20 repeated a second's burst so).
func TestEngine_ResumeAfterTwoFencesUsesTheHandOverOfThePartitionsSession(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, cli := resumingEngine(t, base)
	hand := &handOver{mark: base.UnixNano(), pending: []pendingFire{{ID: "cut", At: base}}}
	e.keepEnded("s1", map[int]*handOver{0: hand})
	e.keepEnded("s2", map[int]*handOver{})
	named, _ := json.Marshal(checkpoint{Node: "node-a", Session: "s1", Watermark: base.Add(-time.Minute)})
	for k, v := range map[string]string{
		e.keys.checkpoint(0):             string(named),
		e.keys.watermark("node-a", "s1"): encodeWatermark(base.Add(-time.Second).UnixNano(), nil, nil, 0, carriedLists{}),
	} {
		if _, err := cli.Put(context.Background(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	res, err := e.resume(context.Background(), 0, newDeadMarks())
	if err != nil {
		t.Fatal(err)
	}
	if res.w != hand.mark || len(res.pending) != 1 {
		t.Errorf("resumed after %s with %d fires pending, want after s1's mark %s with its cut fire",
			time.Unix(0, res.w).UTC().Format(time.TimeOnly), len(res.pending), base.Format(time.TimeOnly))
	}
}

// After a crash the next owner resumes from the session's watermark, with
// the revision up to which the session had armed the partition when its
// dispatch reached it: in the value, or in the value it names, which etcd
// keeps in the key's history (a base compacted away is not known). A
// session whose watermark is behind the checkpoint's says nothing of the
// fires in between, so no revision goes with it.
func TestEngine_ResumeAfterACrashTakesTheSessionsAppliedRevision(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, cli := resumingEngine(t, base)
	ctx := context.Background()
	put := func(k, v string) int64 { t.Helper(); return putKey(t, cli, k, v) }
	key := e.keys.watermark("node-a", "s1")
	named := func(w time.Time) {
		t.Helper()
		b, _ := json.Marshal(checkpoint{Node: "node-a", Session: "s1", Watermark: w})
		put(e.keys.checkpoint(0), string(b))
		put(e.keys.checkpoint(1), string(b))
	}
	check := func(p int, wantResume time.Time, wantApplied int64) {
		t.Helper()
		res, err := e.resume(ctx, p, newDeadMarks()) // a round each: the test writes the key between
		if err != nil {
			t.Fatal(err)
		}
		if res.w != wantResume.UnixNano() || res.applied != wantApplied {
			t.Errorf("partition %d resumes after %s with applied %d, want after %s with %d",
				p, time.Unix(0, res.w).UTC().Format(time.TimeOnly), res.applied, wantResume.Format(time.TimeOnly), wantApplied)
		}
	}
	w := base.Add(10 * time.Second)
	named(base)
	whole := put(key, encodeWatermark(w.UnixNano(), nil, map[int]int64{0: 40, 1: 41}, 0, carriedLists{}))
	check(0, w, 40)
	put(key, encodeWatermark(w.UnixNano(), nil, map[int]int64{1: 50}, whole, carriedLists{}))
	check(0, w, 40) // from the base
	check(1, w, 50)
	put(key, encodeWatermark(w.UnixNano(), nil, map[int]int64{1: 0}, whole, carriedLists{}))
	check(1, w, 0) // no longer armed there

	named(w.Add(time.Second)) // the acquire's resume point, which the dispatch never reached
	check(0, w.Add(time.Second), 0)

	named(base)
	if _, err := cli.Compact(ctx, put(key, encodeWatermark(w.UnixNano(), nil, nil, whole, carriedLists{}))); err != nil {
		t.Fatal(err)
	}
	check(0, w, 0)
}

// A queued retry that a newer fire of a replace task replaced is canceled
// unrun, by a worker of its owner, as it would have been without the
// release: it is not handed over. Here the newer fire is a trigger, whose
// key stays for the next owner; the retry was handed over, and the next
// owner ran it before the trigger.
func TestLoop_ReplacedQueuedRetryIsNotHandedOver(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.maxAttempts, prof.concurrency = "noop/retry3/replace", 3, task.ConcurrencyReplace
	a := newTestLoop(t, at, nil)
	a.add(t, 0, at, prof, "0 0 0 1 1 *", "rp")
	a.handle(&takeOverCmd{part: 0, fires: []pendingFire{{ID: "rp", At: at.Add(-time.Minute), Attempt: 2, Due: at}}})
	a.dispatchAll()
	a.trigger(0, "rp", at)
	a.dispatchAll()
	if got := a.dispatched(0); len(got) != 2 {
		t.Fatalf("dispatched %v, want the retry and the trigger's fire", got)
	}
	rel := a.releaseNow(0)
	a.handOverQueued(rel.hand, unrunAll) // the workers did not take them in time
	if got := rel.hand[0].pending; len(got) != 0 {
		t.Errorf("the release hands over %+v, want nothing: the retry was replaced, and the trigger's key stays", got)
	}
}
