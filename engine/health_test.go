package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// TestEngine_Health drives a node's clock through fires of tasks that
// succeed, fail and are paused, and checks the state the owner keeps
// (last success, last failure, failures in a row, last error), the status
// filters of Query (failing, paused, stale) with prefix, cursor and limit,
// and the node's recent failures.
func TestEngine_Health(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 500e6, time.UTC)
	at := func(s int) time.Time { return time.Date(2026, 1, 1, 12, 0, s, 0, time.UTC) }
	clock := newTestClock(t0, 0)
	var failing atomic.Bool
	failing.Store(true)
	h := func(_ context.Context, f Fire) error {
		if f.TaskID == "paused/1" {
			return errors.New("resumed and failing")
		}
		if strings.HasPrefix(f.TaskID, "bad/") && failing.Load() {
			return fmt.Errorf("boom %s", f.TaskID)
		}
		return nil
	}
	n := startNode(t, c, "", h, clockTweak(clock, time.Hour, nil))
	reg := n.e.Registry()
	ids := []string{"bad/1", "bad/2", "bad/3", "ok/1"}
	for _, id := range ids {
		putTask(t, reg, handlerTask(id, "@every 10s"))
	}
	paused := handlerTask("paused/1", "@every 10s")
	paused.Paused = true
	putTask(t, reg, paused)
	for _, id := range ids {
		waitNext(t, n, id, at(10))
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(n, "paused/1") })

	query := func(st task.Status, prefix, after string, limit int) ([]string, bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ms, more, _, err := n.e.Query(ctx, task.StatusQuery{Status: st, Prefix: prefix, After: after, Limit: limit})
		if err != nil {
			t.Fatalf("query %s: %v", st, err)
		}
		got := []string{}
		for _, m := range ms {
			if m.State == nil || m.State.Owner != "node-1" {
				t.Errorf("query %s: %s has state %+v, want the owner's", st, m.ID, m.State)
			}
			got = append(got, m.ID)
		}
		return got, more
	}
	expect := func(st task.Status, prefix, after string, limit int, want []string, wantMore bool) {
		t.Helper()
		got, more := query(st, prefix, after, limit)
		if !slices.Equal(got, want) || more != wantMore {
			t.Errorf("query %s prefix %q after %q limit %d: %q, more %v; want %q, more %v",
				st, prefix, after, limit, got, more, want, wantMore)
		}
	}
	// fired waits until every task's fire at sched has finished.
	fired := func(sched time.Time) {
		t.Helper()
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			for _, id := range ids {
				s := taskState(t, n, id)
				if !s.LastSuccessAt.Equal(sched) && !s.LastFailureAt.Equal(sched) {
					return false
				}
			}
			return true
		})
	}

	expect(task.StatusFailing, "", "", 10, []string{}, false)
	expect(task.StatusStale, "", "", 10, []string{}, false)
	expect(task.StatusPaused, "", "", 10, []string{"paused/1"}, false)

	clock.Advance(10 * time.Second) // 12:00:10.5: the fires of :10
	fired(at(10))
	bad := taskState(t, n, "bad/1")
	if bad.ConsecutiveFailures != 1 || !bad.LastFailureAt.Equal(at(10)) || bad.LastError != "boom bad/1" || !bad.LastSuccessAt.IsZero() {
		t.Errorf("bad/1 after one failure: %+v", bad)
	}
	if ok := taskState(t, n, "ok/1"); ok.ConsecutiveFailures != 0 || !ok.LastSuccessAt.Equal(at(10)) || !ok.LastFailureAt.IsZero() || ok.LastError != "" {
		t.Errorf("ok/1 after one success: %+v", ok)
	}
	expect(task.StatusFailing, "", "", 10, []string{"bad/1", "bad/2", "bad/3"}, false)
	expect(task.StatusFailing, "", "", 2, []string{"bad/1", "bad/2"}, true)
	expect(task.StatusFailing, "", "bad/2", 2, []string{"bad/3"}, false)
	expect(task.StatusFailing, "bad/3", "", 10, []string{"bad/3"}, false)
	expect(task.StatusFailing, "ok/", "", 10, []string{}, false)
	expect(task.StatusStale, "", "", 10, []string{}, false) // one interval without success: not yet

	clock.Advance(11 * time.Second) // 12:00:21.5: the fires of :20 failed too
	fired(at(20))
	if bad := taskState(t, n, "bad/2"); bad.ConsecutiveFailures != 2 || !bad.Stale {
		t.Errorf("bad/2 after two failures: %+v", bad)
	}
	// No success since the node took them (12:00:00), and :20 has passed.
	expect(task.StatusStale, "", "", 10, []string{"bad/1", "bad/2", "bad/3"}, false)
	expect(task.StatusStale, "bad/", "bad/1", 1, []string{"bad/2"}, true)

	failing.Store(false)
	clock.Advance(10 * time.Second) // 12:00:31.5: the fires of :30 succeed
	fired(at(30))
	bad = taskState(t, n, "bad/1")
	if bad.ConsecutiveFailures != 0 || !bad.LastSuccessAt.Equal(at(30)) || !bad.LastFailureAt.Equal(at(20)) || bad.LastError != "boom bad/1" || bad.Stale {
		t.Errorf("bad/1 after its recovery: %+v", bad)
	}
	expect(task.StatusFailing, "", "", 10, []string{}, false)
	expect(task.StatusStale, "", "", 10, []string{}, false)

	fails := n.e.RecentFailures(100)
	if len(fails) != 6 {
		t.Fatalf("%d recent failures, want 6 (3 tasks x 2 fires): %+v", len(fails), fails)
	}
	for i, f := range fails {
		want := at(20)
		if i >= 3 {
			want = at(10)
		}
		if !f.ScheduledAt.Equal(want) || f.Status != "failed" || f.Error != "boom "+f.TaskID || f.Node != "node-1" {
			t.Errorf("recent failure %d: %+v, want one of %v", i, f, want)
		}
	}
	if got := n.e.RecentFailures(2); len(got) != 2 {
		t.Errorf("RecentFailures(2) gave %d", len(got))
	}

	// A task resumed after a long pause starts its staleness clock again:
	// its first fire after the resume fails, and it is not stale for that.
	if _, err := reg.SetPaused(context.Background(), "paused/1", false); err != nil {
		t.Fatal(err)
	}
	waitNext(t, n, "paused/1", at(40))
	expect(task.StatusPaused, "", "", 10, []string{}, false)
	clock.Advance(10 * time.Second) // 12:00:41.5
	fired(at(40))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, n, "paused/1").LastFailureAt.Equal(at(40)) })
	expect(task.StatusFailing, "", "", 10, []string{"paused/1"}, false)
	expect(task.StatusStale, "", "", 10, []string{}, false)
}

// TestEngine_HealthCountsFiresNotAttempts checks that a fire whose retry
// succeeds is a success: only a fire's last attempt counts.
func TestEngine_HealthCountsFiresNotAttempts(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	h := func(_ context.Context, f Fire) error {
		if f.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}
	n := startNode(t, c, "", h, nil)
	tsk := handlerTask("flaky", "* * * * * *")
	tsk.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(10 * time.Millisecond)}
	putTask(t, n.e.Registry(), tsk)
	etcdtest.WaitFor(t, 15*time.Second, func() bool {
		s, ok := n.e.TaskState(context.Background(), "flaky")
		return ok && s.Failures >= 2 && !s.LastSuccessAt.IsZero()
	})
	if s := taskState(t, n, "flaky"); s.ConsecutiveFailures != 0 || !s.LastFailureAt.IsZero() {
		t.Errorf("a task whose retries succeed: %+v; want no failed fire", s)
	}
}

func TestParseStatus(t *testing.T) {
	for _, s := range []string{"failing", "paused", "stale"} {
		if got, err := task.ParseStatus(s); err != nil || string(got) != s {
			t.Errorf("task.ParseStatus(%q) = %q, %v", s, got, err)
		}
	}
	var ve *task.ValidationError
	if _, err := task.ParseStatus("broken"); !errors.As(err, &ve) || ve.Field != "status" {
		t.Errorf("task.ParseStatus(broken): %v, want a status ValidationError", err)
	}
}

func TestTruncateError(t *testing.T) {
	long := strings.Repeat("é", maxErrorLen) // 2 bytes a rune
	got := truncateError(long)
	if len(got) > maxErrorLen || !strings.HasSuffix(got, "…") || !strings.HasPrefix(long, strings.TrimSuffix(got, "…")) {
		t.Errorf("truncateError: %d bytes, %q...", len(got), got[:10])
	}
	if truncateError("short") != "short" {
		t.Error("a short error changed")
	}
}

// TestLoop_HandHealth checks what a released partition hands over of its
// tasks' health, and that the next owner's loop takes it: failing tasks
// first, within the bounds, errors cut on a rune boundary, and a task
// that already has an outcome on the new owner keeps its own.
func TestLoop_HandHealth(t *testing.T) {
	newTestLoop := func() *loop {
		cfg := DefaultConfig("n").withDefaults()
		cfg.Partitions = 2
		st := &stats{}
		never := func() bool { return false }
		var ack acked
		p := newPool(cfg, nil, st, never, 0)
		t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
		l, err := newLoop(cfg, schedule.NewTable(), p, newHolds(), st, nil, never, &ack, make(chan struct{}, 1), 0)
		if err != nil {
			t.Fatal(err)
		}
		prof := &profile{key: "noop", exec: executor.Noop, noop: true, timeout: time.Minute, maxAttempts: 1,
			misfire: task.MisfireFireOnce, catchup: time.Minute, concurrency: task.ConcurrencyAllow}
		var defs []taskDef
		for i := range maxHandOverHealth + 10 {
			id := fmt.Sprintf("t/%04d", i)
			h, err := l.scheds.Intern("@every 1h", "UTC", id)
			if err != nil {
				t.Fatal(err)
			}
			defs = append(defs, taskDef{id: id, hash: xxhash.Sum64String(id), part: 1, sched: h, prof: prof})
		}
		l.handle(&loadCmd{part: 1, defs: defs, first: true, done: make(chan struct{})})
		return l
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	old := newTestLoop()
	long := strings.Repeat("é", handOverErrorLen)
	// t/0000-t/0019 fail (t/0001 with a long error); the others failed
	// once and recovered: more than the bound in all.
	for k := range maxHandOverHealth + 10 {
		i, r, _ := old.tab.lookup(fmt.Sprintf("t/%04d", k))
		why := "boom"
		if k == 1 {
			why = long
		}
		old.outcome(i, r, at, statusFailed, why)
		if k >= 20 {
			old.outcome(i, r, at+int64(time.Hour), statusOK, "")
		}
	}
	handed := old.handHealth(1)
	if len(handed) != maxHandOverHealth {
		t.Fatalf("%d handed over, want the bound %d", len(handed), maxHandOverHealth)
	}
	var first handedHealth
	for k, h := range handed {
		if failing := h.Fails > 0; failing != (k < 20) {
			t.Fatalf("handed over %d is %s with %d fails: want the 20 failing first", k, h.ID, h.Fails)
		}
		if h.ID == "t/0001" {
			first = h
		}
	}
	if first.Fails != 1 || len(first.Error) > handOverErrorLen || !utf8.ValidString(first.Error) || !strings.HasPrefix(long, first.Error) {
		t.Errorf("t/0001 handed over: %d fails, %d bytes of error", first.Fails, len(first.Error))
	}

	next := newTestLoop()
	i, r, _ := next.tab.lookup("t/0002")
	next.outcome(i, r, at+2*int64(time.Hour), statusOK, "") // succeeded on the new owner already
	// As the load that arms them does:
	for _, e := range handed {
		if i, r, ok := next.tab.lookup(e.ID); ok {
			next.adoptHealth(i, r, e)
		}
	}
	now := at + 3*int64(time.Hour)
	i, r, _ = next.tab.lookup("t/0001")
	if s := next.stateOf(i, r, now); s.ConsecutiveFailures != 1 || !s.LastFailureAt.Equal(time.Unix(0, at)) || s.LastError != first.Error {
		t.Errorf("t/0001 on the new owner: %+v", s)
	}
	i, r, _ = next.tab.lookup("t/0002")
	if s := next.stateOf(i, r, now); s.ConsecutiveFailures != 0 || !s.LastFailureAt.IsZero() {
		t.Errorf("t/0002, which succeeded on the new owner, took the old failure: %+v", s)
	}
}

// With concurrency allow a fire can end after a later one. The task's
// state follows the fires in schedule order: a late failure before the
// last success neither makes the task failing nor alerts, and a late
// success before the last failure does not end the run of failures.
func TestLoop_OutcomesFollowScheduleOrder(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, noopProfile(task.MisfireFireOnce), "* * * * * *", "overlap")
	i, r, _ := tl.tab.lookup("overlap")
	at := func(s int) int64 { return base.Add(time.Duration(s) * time.Second).UnixNano() }
	steps := []struct {
		sched  int
		status uint8
		alert  task.NotifyEvent
		streak uint64
		ok     int // the last success, seconds after base; -1 for none
		fail   int
	}{
		{2, statusOK, "", 0, 2, -1},
		{0, statusFailed, "", 0, 2, 0},                 // ended after 2: not failing, no alert
		{3, statusFailed, task.NotifyFailure, 1, 2, 3}, // in order
		{1, statusOK, "", 1, 2, 3},                     // ended after 3, older than 2: nothing
		{5, statusFailed, "", 2, 2, 5},
		{4, statusFailed, "", 3, 2, 5}, // after the last success: one of the run
		{3, statusOK, "", 3, 3, 5},     // newer than the last success, older than 5: the run stays
		{6, statusOK, task.NotifyRecovery, 0, 6, 5},
	}
	for _, s := range steps {
		if got := tl.outcome(i, r, at(s.sched), s.status, "boom"); got != s.alert {
			t.Errorf("fire of +%ds ended %s: alert %q, want %q", s.sched, statusNames[s.status], got, s.alert)
		}
		st := tl.stateOf(i, r, at(10))
		okAt, failAt := -1, -1
		if !st.LastSuccessAt.IsZero() {
			okAt = int(st.LastSuccessAt.Sub(base) / time.Second)
		}
		if !st.LastFailureAt.IsZero() {
			failAt = int(st.LastFailureAt.Sub(base) / time.Second)
		}
		if st.ConsecutiveFailures != s.streak || okAt != s.ok || failAt != s.fail {
			t.Errorf("after the fire of +%ds (%s): %d failures in a row, last success +%ds, last failure +%ds; want %d, +%ds, +%ds",
				s.sched, statusNames[s.status], st.ConsecutiveFailures, okAt, failAt, s.streak, s.ok, s.fail)
		}
	}
}

// Health follows the fires in schedule order to the second; fires of one
// second count in the order they end. A trigger's fire at +2.5 s fails
// and ends first; the scheduled fire of +2 s succeeds and ends after it:
// the run of failures ends, with a recovery alert. The success was taken
// for overtaken, compared with the failure to the nanosecond, and the task
// stayed failing.
func TestLoop_OutcomesOfOneSecondCountInTheOrderTheyEnd(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, noopProfile(task.MisfireFireOnce), "* * * * * *", "same-second")
	i, r, _ := tl.tab.lookup("same-second")
	at := func(ms int) int64 { return base.Add(time.Duration(ms) * time.Millisecond).UnixNano() }
	if got := tl.outcome(i, r, at(1000), statusOK, ""); got != "" {
		t.Fatalf("first success alerted %q", got)
	}
	if got := tl.outcome(i, r, at(2500), statusFailed, "boom"); got != task.NotifyFailure {
		t.Fatalf("trigger's failure at +2.5s: alert %q, want failure", got)
	}
	got := tl.outcome(i, r, at(2000), statusOK, "")
	st := tl.stateOf(i, r, at(3000))
	if got != task.NotifyRecovery || st.ConsecutiveFailures != 0 {
		t.Errorf("success of +2s ending after the failure of +2.5s (one second): alert %q, %d failures in a row; want recovery, 0",
			got, st.ConsecutiveFailures)
	}
}

// pause_on_failure pauses a task when a failure brings its run to a
// multiple of K; a task resumed while failing is paused again only after
// K more failures. A fire that ends without adding to the run (a success
// ending after a later failure, here) pauses nothing. With K = 1: the
// fire of +7 s fails (a pause), the fire of +6 s (concurrency allow,
// slower) then succeeds. It paused the task again, with the run unchanged.
func TestLoop_FireAddingNoFailurePausesNothing(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.pauseAfter = "noop/pause1", 1
	tl.add(t, 0, base, prof, "* * * * * *", "p")
	tl.alerts = newNotifier(http.DefaultClient, "ua", 16, quietLogger()) // not started: notices stay queued
	i, r, _ := tl.tab.lookup("p")
	at := func(s int) int64 { return base.Add(time.Duration(s) * time.Second).UnixNano() }
	end := func(sched int64, st uint8) {
		var b completionBatch
		j := job{sched: sched, rec: i, gen: r.gen, attempt: 1, kind: kindSchedule}
		b.add(&j, st, map[bool]string{true: "boom"}[st == statusFailed], false)
		tl.complete(&b)
	}
	if got := tl.outcome(i, r, at(5), statusOK, ""); got != "" {
		t.Fatalf("first success alerted %q", got)
	}
	r.running = 2 // the fires of +6 s and +7 s run side by side (allow)
	end(at(7), statusFailed)
	if n := len(tl.alerts.q); n != 1 {
		t.Fatalf("after the failure of +7s: %d pause notices, want 1", n)
	}
	end(at(6), statusOK) // ends after the later failure: changes nothing
	if n := len(tl.alerts.q); n != 1 {
		t.Errorf("a success of +6s ending after the failure of +7s queued %d pause notices in all, want 1 (streak %d, unchanged)", n, r.failStreak)
	}
}

// pause_on_failure does not pause a task that is paused already: a
// trigger's or a backfill's fire of a paused task runs, and one that
// failed K times in a row paused it again, replacing the operator's pause
// record (who paused it, when, the note) with the owner's, and rewriting
// the task in etcd at every K-th failure.
func TestLoop_PauseOnFailureLeavesAPausedTaskAlone(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.pauseAfter = "noop/pause1", 1
	h, err := tl.scheds.Intern("* * * * * *", "UTC", "p")
	if err != nil {
		t.Fatal(err)
	}
	tl.handle(&loadCmd{part: 0, resume: base.UnixNano(), first: true, done: make(chan struct{}),
		defs: []taskDef{{id: "p", hash: xxhash.Sum64String("p"), part: 0, sched: h, prof: prof, paused: true}}})
	tl.alerts = newNotifier(http.DefaultClient, "ua", 16, quietLogger()) // not started: notices stay queued
	i, r, _ := tl.tab.lookup("p")
	r.running = 1 // a trigger's fire of the paused task runs
	var b completionBatch
	j := job{sched: base.Add(time.Second / 3).UnixNano(), rec: i, gen: r.gen, attempt: 1, kind: kindTrigger}
	b.add(&j, statusFailed, "boom", false)
	tl.complete(&b)
	if r.failStreak != 1 {
		t.Fatalf("streak %d after the trigger's failure, want 1", r.failStreak)
	}
	if n := len(tl.alerts.q); n != 0 {
		t.Errorf("%d pause notices for a task paused already, want none", n)
	}
}

// A status query covers a partition only while its node holds every task
// of it: one taken over whose tasks are not armed yet (its acquire reads
// etcd between the lock and the load) is left out of held, so that a list
// by status says its tasks may be missing instead of missing them unsaid.
func TestEngine_QueryLeavesOutAPartitionStillLoading(t *testing.T) {
	c := etcdtest.Start(t)
	a := startNode(t, c, "", nil, nil)
	reg := a.e.Registry()
	for i := range 32 {
		tk := handlerTask(fmt.Sprintf("paused/%02d", i), "@every 1h")
		tk.Paused = true
		putTask(t, reg, tk)
	}
	query := func(n *testNode) (ids []string, held []int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ms, _, held, err := n.e.Query(ctx, task.StatusQuery{Status: task.StatusPaused, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		return ids, held
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { ids, held := query(a); return len(ids) == 32 && len(held) == 16 })

	// node-b's acquires stop once they hold their partitions' locks, before
	// their tasks are armed: at the read of the partitions' runs elsewhere.
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	reached, release := make(chan struct{}, 16), make(chan struct{})
	hook := func(key string) {
		if strings.Contains(key, "/running/") {
			reached <- struct{}{}
			<-release
		}
	}
	faults.afterGet.Store(&hook)
	open := sync.OnceFunc(func() { faults.afterGet.Store(nil); close(release) })
	b := startNodeOn(t, cli, "", nil, func(cfg *Config) { cfg.NodeID = "node-b" }, noWait)
	t.Cleanup(open) // before b stops: cleanups run last first
	select {
	case <-reached:
	case <-time.After(20 * time.Second):
		t.Fatal("node-b acquired no partition")
	}
	p := -1
	for q := range 16 {
		if b.e.Owns(q) {
			p = q
		}
	}
	if p < 0 {
		t.Fatal("node-b owns no partition past its lock")
	}
	if ids, held := query(b); slices.Contains(held, p) {
		t.Errorf("node-b's answer %q covers partition %d, whose tasks it has not armed yet", ids, p)
	}
	open()
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		ids, held := query(b)
		if !slices.Contains(held, p) {
			return false
		}
		for i := range 32 {
			if id := fmt.Sprintf("paused/%02d", i); reg.Partition(id) == p && !slices.Contains(ids, id) {
				t.Fatalf("node-b's answer %q covers partition %d without its task %s", ids, p, id)
			}
		}
		return true
	})
}
