package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"
)

// idIn returns an id starting with prefix whose task is in partition p
// of parts.
func idIn(prefix string, p, parts int) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("%s-%d", prefix, i); ring.Partition(id, parts) == p {
			return id
		}
	}
}

// joinParts is the partitions of the tests in which node-b joins node-a
// and takes some of its partitions: two would all go to node-b.
const joinParts = 4

// joinAssignment is how the ring shares joinParts partitions between
// node-a and node-b.
func joinAssignment(t *testing.T) *ring.Assignment {
	t.Helper()
	cfg := DefaultConfig("node-a")
	cfg.Partitions = joinParts
	two, err := ring.NewAssignment(cfg.ring(), []string{"node-a", "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	return two
}

// While a release waits for the attempt under way of a retrying task, the
// node's other partitions fire on: only the released partition stands
// still. The release held the whole node's watermark at its mark while it
// waited, and dispatch runs at most the bounded lead (1 s) past it, so
// that every task of the node stopped for up to a second of the wait (2 s then)
// at every hand-over during which a retrying task's attempt ran. Here
// node-b joins and takes slow's partition from node-a while slow's attempt
// runs, held; node-a's release commit is held too, and node-a must fire
// tick, in the partition it keeps, 2 s past the release mark meanwhile.
func TestEngine_ReleaseWaitingForAnAttemptHoldsOnlyItsPartitions(t *testing.T) {
	c, clock := limitsStart(t)
	const parts = joinParts
	two := joinAssignment(t)
	moving, staying := two.Owned("node-b")[0], two.Owned("node-a")[0]
	slow, tick := idIn("slow", moving, parts), idIn("tick", staying, parts)
	log := &callLog{}
	h := newHolder(t, slow)
	node := func(id string) func(*Config) {
		return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.Partitions, cfg.DrainTimeout = parts, time.Minute })
	}
	cliA := c.NewClient(t)
	commit := make(chan struct{})
	var once sync.Once
	letCommit := func() { once.Do(func() { close(commit) }) }
	t.Cleanup(letCommit)
	injectFaults(cliA).pauses(func(key, value string) bool {
		return strings.Contains(key, "/checkpoints/") && strings.Contains(value, `"released":true`)
	}, commit)
	a := startNodeOn(t, cliA, "", log.handler(h.handler), node("node-a"))
	retrying := handlerTask(slow, "0 0 0 1 1 *") // yearly: only the trigger fires it
	retrying.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(10 * time.Second), MaxBackoff: task.Duration(10 * time.Second)}
	putTask(t, a.e.Registry(), retrying)
	putTask(t, a.e.Registry(), handlerTask(tick, "* * * * * *"))
	waitNext(t, a, tick, limitsAt(1))
	if _, err := a.e.Registry().Trigger(context.Background(), slow); err != nil {
		t.Fatal(err)
	}
	h.next(t) // slow's attempt 1 runs on node-a

	b := startNodeOn(t, c.NewClient(t), "", log.handler(nil), node("node-b"), noWait)
	t.Cleanup(h.open) // again: cleanups run last first
	t.Cleanup(letCommit)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return !a.e.Owns(moving) })
	clock.Advance(2 * time.Second) // 12:00:02.5: tick@2 is past the lead from the mark
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return len(runsAt(log, tick, limitsAt(2))) > 0
	})
	if got := runsAt(log, tick, limitsAt(2)); len(got) != 1 || got[0] != "node-a" {
		t.Errorf("%s@12:00:02 ran on %v, want node-a", tick, got)
	}
	letCommit()
	h.open()
	b.stop(t)
	a.stop(t)
}

// Hurry cuts short a release's wait for the attempts under way of retrying
// tasks, as it does Close's other waits for running executions: the
// release commits at once, and the executions are canceled. Here node-a
// closes while attempt 1 of flaky runs, held, and is hurried once its
// release has begun, its wait the longest (10 s): under the default of
// 250 ms the release ended about as soon without Hurry, and the test
// passed whether Hurry cut the wait or not.
func TestEngine_HurryCutsTheReleasesWaitForAttemptsShort(t *testing.T) {
	ha := startHeldAttempt(t, func(cfg *Config) { cfg.ReleaseRunWait = MaxReleaseRunWait })
	ea := ha.a.e
	closed := closeInBackground(ha.a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return ea.Stats().PartitionsOwned == 0 })
	ea.Hurry()
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
	if rel := ea.Stats().HandOver["release"]; rel.Count == 0 || rel.Sum/float64(rel.Count) >= handOverWait.Seconds() {
		t.Errorf("node-a released %d partitions in %.2f s in all, want them released without waiting out %v",
			rel.Count, rel.Sum, MaxReleaseRunWait)
	}
}

// A release's wait for attempts under way ends with the node's session:
// once the lease is gone the partitions are no longer the node's, and the
// node fences at once (drops them all and joins again with a new
// session) rather than wait out Config.ReleaseRunWait for attempts it can
// no longer hand over. Here node-b joins and takes slow's partition from
// node-a while slow's attempt runs, held (a retrying task that allows
// overlaps: the fence does not cancel it), node-a's wait the longest
// (10 s), and node-a's lease is revoked once its release has begun:
// node-a joins again, its wait never run out.
func TestEngine_ReleaseWaitForAttemptsEndsWithTheSession(t *testing.T) {
	c, clock := limitsStart(t)
	const parts = joinParts
	moving := joinAssignment(t).Owned("node-b")[0]
	slow := idIn("slow", moving, parts)
	h := newHolder(t, slow)
	var logs logbuf.Buffer
	a := startNodeOn(t, c.NewClient(t), "", h.handler, limitsNode(clock, time.Hour, "node-a", func(cfg *Config) {
		cfg.Partitions, cfg.DrainTimeout, cfg.ReleaseRunWait = parts, time.Minute, MaxReleaseRunWait
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}))
	retrying := handlerTask(slow, "0 0 0 1 1 *") // yearly: only the trigger fires it
	retrying.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(10 * time.Second), MaxBackoff: task.Duration(10 * time.Second)}
	putTask(t, a.e.Registry(), retrying)
	if _, err := a.e.Registry().Trigger(context.Background(), slow); err != nil {
		t.Fatal(err)
	}
	run := h.next(t) // slow's attempt 1 runs on node-a
	old := a.e.sess.Load()

	b := startNodeOn(t, c.NewClient(t), "", h.handler, limitsNode(clock, time.Hour, "node-b", func(cfg *Config) { cfg.Partitions = parts }), noWait)
	t.Cleanup(h.open) // again: cleanups run last first
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return !a.e.Owns(moving) })
	if err := membership.Revoke(context.Background(), c.Client, old.Lease()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return a.e.sess.Load() != old && a.e.Ready() })
	if strings.Contains(logs.String(), runWaitOver) {
		t.Errorf("node-a's release waited out its %v for slow's attempt after its session ended", MaxReleaseRunWait)
	}
	if !run.running() {
		t.Errorf("slow's attempt ended (%v), want it held throughout", context.Cause(run.ctx))
	}
	h.open()
	b.stop(t)
	a.stop(t)
}

// A release's wait for the workers to take its partitions' queued fires
// (handOverWait, 2 s) ends with the node's session too: the partitions
// went with the lease, and the node, fenced, neither dropped them nor
// joined again for the rest of the wait. Here node-a's one worker runs
// slow, held, and a fire of bf's backfill, in the partition node-b takes,
// waits behind it. node-a's release is held as it stops the backfill
// (its runner's progress write) until node-a's session has ended, its
// lease revoked, so that the wait begins after the end: it never runs
// out (a fenced node's workers take nothing).
func TestEngine_ReleaseWaitForQueuedFiresEndsWithTheSession(t *testing.T) {
	c, clock := limitsStart(t)
	const parts = joinParts
	two := joinAssignment(t)
	moving, staying := two.Owned("node-b")[0], two.Owned("node-a")[0]
	slow, bf := idIn("slow", staying, parts), idIn("bf", moving, parts)
	h := newHolder(t, slow)
	var logs logbuf.Buffer
	cliA := c.NewClient(t)
	faults := injectFaults(cliA)
	a := startNodeOn(t, cliA, "", h.handler, limitsNode(clock, time.Hour, "node-a", func(cfg *Config) {
		cfg.Partitions, cfg.Workers, cfg.DrainTimeout = parts, 1, time.Minute
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}))
	reg := a.e.Registry()
	putTask(t, reg, handlerTask(slow, "0 0 0 1 1 *")) // yearly: only the trigger fires it
	putTask(t, reg, handlerTask(bf, "0 0 0 1 1 *"))
	if _, err := reg.Trigger(context.Background(), slow); err != nil {
		t.Fatal(err)
	}
	h.next(t) // slow runs on node-a's one worker
	jan1 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := reg.Backfill(context.Background(), bf, jan1.Add(-time.Second), jan1.Add(time.Second), 1); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return a.e.Stats().QueueDepth == 1 })
	old := a.e.sess.Load()
	recorded := make(chan struct{})
	var once sync.Once
	letRecord := func() { once.Do(func() { close(recorded) }) }
	t.Cleanup(letRecord)
	held := faults.pauses(func(key, _ string) bool { return strings.Contains(key, "/backfills/") }, recorded)

	b := startNodeOn(t, c.NewClient(t), "", h.handler, limitsNode(clock, time.Hour, "node-b", func(cfg *Config) { cfg.Partitions = parts }), noWait)
	t.Cleanup(h.open) // again: cleanups run last first
	t.Cleanup(letRecord)
	select {
	case <-held: // node-a's release stops bf's backfill, whose runner records its fire
	case <-time.After(20 * time.Second):
		t.Fatal("node-a did not stop bf's backfill within 20s of node-b's join")
	}
	if err := membership.Revoke(context.Background(), c.Client, old.Lease()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return old.Mutexes().Ctx().Err() != nil })
	letRecord()
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return a.e.sess.Load() != old && a.e.Ready() })
	if strings.Contains(logs.String(), takenWaitOver) {
		t.Errorf("node-a's release waited out its %v for the workers to take bf's fire after its session ended", handOverWait)
	}
	h.open()
	b.stop(t)
	a.stop(t)
}
