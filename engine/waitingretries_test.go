package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// A watermark value carries at most maxWaitingRetries retries of at most
// maxWaitingRetryBytes of JSON, overrides of 16 KiB included: the
// partitions' in order, a partition's retries in order, up to what fits.
// Retries with no revision to judge them by are not carried: a successor
// would drop them. Carried whole, a thousand retries of 16 KiB overrides
// made a value of 16 MiB, which etcd refuses every WatermarkInterval.
func TestRetryMarks_AValueCarriesABoundedList(t *testing.T) {
	at := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	fires := func(n int, over *task.Override) waitingRetries {
		w := waitingRetries{Fires: make([]pendingFire, n), sizes: make([]int, n)}
		for i := range w.Fires {
			w.Fires[i] = pendingFire{ID: fmt.Sprintf("t%05d", i), At: at, Attempt: 2, Due: at.Add(time.Minute), Override: over}
		}
		return w
	}
	judged := func(applied int64, w waitingRetries) waitingRetries {
		w.Applied = applied
		return w
	}
	count := func(v map[int]waitingRetries) (n, size int) {
		for _, w := range v {
			n += len(w.Fires)
		}
		return n, jsonSize(v)
	}
	var m retryMarks
	m.publish(map[int]waitingRetries{0: fires(1, nil), 1: judged(7, fires(maxWaitingRetries-10, nil)), 2: judged(8, fires(20, nil))})
	got := m.carried()
	if n, _ := count(got); n != maxWaitingRetries || len(got[1].Fires) != maxWaitingRetries-10 || len(got[2].Fires) != 10 || got[0].Fires != nil {
		t.Errorf("carried %d retries (partition 0: %d, 1: %d, 2: %d), want %d: none of 0, all of 1, 10 of 2",
			n, len(got[0].Fires), len(got[1].Fires), len(got[2].Fires), maxWaitingRetries)
	}
	payload := json.RawMessage(`"` + strings.Repeat("x", 16<<10-2) + `"`)
	m.publish(map[int]waitingRetries{1: {}, 2: judged(8, fires(maxWaitingRetries, &task.Override{Payload: payload}))})
	got = m.carried()
	if n, size := count(got); n == 0 || size > maxWaitingRetryBytes+100 || got[1].Fires != nil {
		t.Errorf("carried %d retries with 16 KiB overrides in %d bytes, partition 1's %d; want some, within %d bytes, none of 1",
			n, size, len(got[1].Fires), maxWaitingRetryBytes)
	}
	m.publish(map[int]waitingRetries{2: {}})
	if got := m.carried(); got != nil {
		t.Errorf("carried %v once the retries were gone, want none", got)
	}
}

// A partition past what a value carries is not built, and is once the
// partitions before it hold fewer retries: its retries are carried then.
func TestLoop_WaitingRetriesPastTheBoundAreBuiltOnceThereIsRoom(t *testing.T) {
	tl, _, slots := retriesAtTheBound(t)
	tl.publishRetries()
	carried := tl.retryMarks.carried()
	if len(carried[0].Fires) != maxWaitingRetries || len(carried[1].Fires) != 0 || !tl.retryChanged[1] {
		t.Fatalf("carried %d and %d retries, partition 1 changed %v; want %d, none, and partition 1 to build later",
			len(carried[0].Fires), len(carried[1].Fires), tl.retryChanged[1], maxWaitingRetries)
	}
	for _, slot := range slots {
		tl.wheel.Cancel(retryBase + slot)
		tl.freeRetry(slot)
	}
	tl.publishRetries()
	carried = tl.retryMarks.carried()
	if len(carried[0].Fires) != 0 || len(carried[1].Fires) != 1 || len(tl.retryChanged) != 0 {
		t.Errorf("carried %d and %d retries, %d partitions changed; want none, b's, none", len(carried[0].Fires), len(carried[1].Fires), len(tl.retryChanged))
	}
}

// waitingFires is a loop with the buffer_one tasks ids in partition 0,
// armed up to revision 10, their fires at, and wait, which makes id's
// fire at at wait for a running one.
func waitingFires(t *testing.T, ids ...string) (tl *testLoop, at int64, wait func(id string)) {
	t.Helper()
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl = newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	prof.concurrency = task.ConcurrencyBufferOne
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", ids...)
	tl.setApplied(0, 10)
	at = base.UnixNano()
	return tl, at, func(id string) {
		i, r, _ := tl.tab.lookup(id)
		r.running = 1
		tl.admit(i, r, prof, ownFire{at: at, kind: kindSchedule}, at)
	}
}

// The fires of the schedule waiting for the running one (buffer_one) go
// to the watermark writes with the waiting retries, each with its due
// time, and leave them once they run or their task is deleted.
func TestLoop_WaitingFiresArePublishedWithTheRetries(t *testing.T) {
	tl, at, wait := waitingFires(t, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		wait(id)
	}
	carried := func() []string {
		t.Helper()
		tl.publishRetries()
		var got []string
		for _, f := range tl.retryMarks.carried()[0].Fires {
			if f.Due.UnixNano() != at || !f.scheduled() {
				t.Errorf("carried %+v, want a fire of the schedule due at its time", f)
			}
			got = append(got, f.ID)
		}
		return got
	}
	if got := carried(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("carried %v, want the three waiting", got)
	}
	i, r, _ := tl.tab.lookup("a")
	r.running = 0
	tl.admitWaiting(i, r) // it runs: the last one takes its place
	i, _, _ = tl.tab.lookup("c")
	tl.remove(i)
	if got := carried(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("carried %v once a ran and c was deleted, want [b]", got)
	}
	i, _, _ = tl.tab.lookup("b")
	if w, in := tl.pending[i], tl.bufferedIn[0]; len(in) != 1 || in[w.pos] != i {
		t.Errorf("b waits at %d of %v", w.pos, in)
	}
}

// The fires waiting for the running one (buffer_one) count in the bound
// of a value as the retries do: 998 retries and two such fires fill it,
// and the partition after theirs is built once there is room.
func TestLoop_WaitingFiresCountInTheBoundOfAValue(t *testing.T) {
	tl, ids, slots := retriesAtTheBound(t)
	prof := noopProfile(task.MisfireFireOnce)
	prof.concurrency = task.ConcurrencyBufferOne
	at := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC).UnixNano()
	for k, slot := range slots[:2] {
		tl.wheel.Cancel(retryBase + slot)
		tl.freeRetry(slot)
		i, r, _ := tl.tab.lookup(ids[k])
		tl.profs.unref(r.prof)
		r.prof = tl.profs.ref(prof)
		r.running = 1
		tl.admit(i, r, prof, ownFire{at: at, kind: kindSchedule}, at)
	}
	tl.publishRetries()
	carried := tl.retryMarks.carried()
	if len(carried[0].Fires) != maxWaitingRetries || len(carried[1].Fires) != 0 || !tl.retryChanged[1] {
		t.Fatalf("carried %d and %d, partition 1 changed %v; want %d, none, and partition 1 to build later",
			len(carried[0].Fires), len(carried[1].Fires), tl.retryChanged[1], maxWaitingRetries)
	}
	i, r, _ := tl.tab.lookup(ids[0])
	r.running = 0
	tl.admitWaiting(i, r)
	tl.publishRetries()
	if carried = tl.retryMarks.carried(); len(carried[0].Fires) != maxWaitingRetries-1 || len(carried[1].Fires) != 1 {
		t.Errorf("carried %d and %d once a waiting fire started; want %d and b's", len(carried[0].Fires), len(carried[1].Fires), maxWaitingRetries-1)
	}
}

// retriesAtTheBound is a loop with a retry waiting an hour for each of
// maxWaitingRetries tasks, ids, in partition 0 (in slots), and for task b
// in partition 1.
func retriesAtTheBound(t *testing.T) (tl *testLoop, ids []string, slots []uint32) {
	t.Helper()
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl = newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	ids = make([]string, maxWaitingRetries)
	for k := range ids {
		ids[k] = fmt.Sprintf("a%04d", k)
	}
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", ids...)
	tl.add(t, 1, base, prof, "0 0 0 1 1 *", "b")
	tl.setApplied(0, 10)
	tl.setApplied(1, 10)
	due := base.Add(time.Hour).UnixNano()
	for _, id := range ids {
		i, r, _ := tl.tab.lookup(id)
		slots = append(slots, tl.waitRetry(i, r, base.UnixNano(), 2, due, nil))
	}
	i, r, _ := tl.tab.lookup("b")
	tl.waitRetry(i, r, base.UnixNano(), 2, due, nil)
	return tl, ids, slots
}

// The retries of deleted tasks stay in the wheel until they come due, and
// run nothing: they take no room in a value. Counted as waiting, a
// thousand of them held the partitions after theirs out of every value
// for as long as their backoff, and a crash lost those partitions'
// retries, though a value had room for them.
func TestLoop_RetriesOfDeletedTasksTakeNoRoomInAValue(t *testing.T) {
	tl, ids, _ := retriesAtTheBound(t)
	tl.handle(&eventsCmd{part: 0, rev: 11, deletes: ids})
	tl.publishRetries()
	carried := tl.retryMarks.carried()
	if len(carried[0].Fires) != 0 || len(carried[1].Fires) != 1 {
		t.Errorf("carried %d and %d retries once partition 0's tasks were deleted, want none and b's", len(carried[0].Fires), len(carried[1].Fires))
	}
}

// A fire of the schedule that waited for the running one (buffer_one)
// and that a publish listed starts once etcd acknowledged a watermark
// value of a later publish, which no longer lists it: a successor runs
// the fires the last acknowledged value lists. One that no publish listed
// starts at once, and one held at the gate when its partition is
// released goes with it as a waiting fire.
func TestLoop_AListedWaitingFireStartsOnceAValueWithoutItIsAcknowledged(t *testing.T) {
	tl, at, wait := waitingFires(t, "listed", "unlisted", "held")
	end := func(id string) {
		i, r, _ := tl.tab.lookup(id)
		r.running--
		tl.admitWaiting(i, r)
		tl.pushJobs()
	}
	dispatched := func(want ...string) {
		t.Helper()
		for k := range want {
			want[k] += fmt.Sprintf("@%d", at/int64(time.Millisecond))
		}
		if got := tl.dispatched(0); !slices.Equal(got, want) {
			t.Fatalf("dispatched %v, want %v", got, want)
		}
	}
	wait("listed")
	wait("held")
	tl.publishRetries()
	wait("unlisted")
	end("unlisted")
	end("listed")
	dispatched("unlisted")
	tl.acked.retries.Store(tl.retrySeq) // a value that lists it
	tl.openGate()
	dispatched("unlisted")
	tl.publishRetries()
	tl.acked.retries.Store(tl.retrySeq)
	tl.openGate()
	dispatched("unlisted", "listed")

	end("held")
	rel := tl.releaseParts([]int{0}, nil)
	if h := rel.hand[0].pending; len(tl.gated) != 0 || len(h) != 1 || h[0].ID != "held" || !h[0].scheduled() {
		t.Fatalf("released with %d held at the gate, handing over %+v; want held's fire, as a waiting one", len(tl.gated), h)
	}
	dispatched("unlisted", "listed")
}

// A fire held at the gate whose task's policy became replace, and that a
// newer fire replaced, is canceled unrun by a worker here, as a queued
// one is (TestLoop_ReplacedQueuedRetryIsNotHandedOver): a release does
// not hand it over. Handed over as a waiting fire, the next owner ran it
// after the newer one, which it replaced in turn.
func TestLoop_ReplacedFireHeldAtTheGateIsNotHandedOver(t *testing.T) {
	tl, at, wait := waitingFires(t, "rp")
	wait("rp")
	tl.publishRetries() // listed: once its running fire ends, it is held at the gate
	replace := noopProfile(task.MisfireFireOnce)
	replace.key, replace.concurrency = "noop/replace", task.ConcurrencyReplace
	h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "rp")
	if err != nil {
		t.Fatal(err)
	}
	tl.handle(&eventsCmd{part: 0, rev: 11, upserts: []taskDef{{id: "rp", hash: xxhash.Sum64String("rp"), part: 0, sched: h, prof: replace}}})
	i, r, _ := tl.tab.lookup("rp")
	r.running--
	tl.admitWaiting(i, r)
	tl.pushJobs()
	if len(tl.gated) != 1 {
		t.Fatalf("%d held at the gate, want rp's fire", len(tl.gated))
	}
	next := at + int64(time.Second)
	tl.admit(i, r, replace, ownFire{at: next, kind: kindSchedule}, next)
	tl.pushJobs()

	rel := tl.releaseNow(0)
	tl.handOverQueued(rel.hand, unrunAll) // the workers did not take them in time
	var got []string
	for _, f := range rel.hand[0].pending {
		got = append(got, fmt.Sprintf("%s@%d", f.ID, f.At.UnixMilli()))
	}
	if want := []string{fmt.Sprintf("rp@%d", next/int64(time.Millisecond))}; !slices.Equal(got, want) {
		t.Errorf("the release hands over %v, want %v: the fire held at the gate was replaced", got, want)
	}
}

// The retries waiting in the wheel go to the watermark writes with the
// revision up to which their partition's changes were armed, as the loop
// stands between commands, and leave them once they come due, or once
// their task is deleted: deleted and put again, it is another task, whose
// fire the retry is not.
func TestLoop_WaitingRetriesArePublishedWithTheirPartitionsRevision(t *testing.T) {
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	failed := func(t *testing.T) (tl *testLoop, def taskDef) {
		t.Helper()
		tl = newTestLoop(t, base.Add(-time.Second/2), nil)
		h, err := tl.scheds.Intern("0 0 0 1 1 *", "UTC", "t")
		if err != nil {
			t.Fatal(err)
		}
		prof := noopProfile(task.MisfireFireOnce)
		prof.maxAttempts, prof.backoff, prof.maxBackoff = 3, time.Minute, time.Minute
		def = taskDef{id: "t", hash: xxhash.Sum64String("t"), part: 0, sched: h, prof: prof, createRev: 5}
		tl.handle(&loadCmd{part: 0, resume: base.Add(-time.Second).UnixNano(), first: true, rev: 10, done: make(chan struct{}), defs: []taskDef{def}})
		i, r, _ := tl.tab.lookup("t")
		tl.admit(i, r, prof, ownFire{at: base.UnixNano(), kind: kindSchedule}, base.UnixNano())
		tl.pushJobs()
		tl.pool.mu.Lock()
		j := *tl.pool.at(0)
		tl.pool.pop()
		tl.pool.mu.Unlock()
		var b completionBatch
		b.add(&j, statusFailed, "boom", false)
		tl.complete(&b)
		tl.publishRetries()
		got := tl.retryMarks.carried()[0]
		if got.Applied != 10 || len(got.Fires) != 1 || got.Fires[0].ID != "t" || got.Fires[0].Attempt != 2 || !got.Fires[0].At.Equal(base) {
			t.Fatalf("published %+v once t's attempt 1 failed, want its attempt 2 of t@%s with the revision 10", got, base.Format(time.TimeOnly))
		}
		return tl, def
	}
	t.Run("comes due", func(t *testing.T) {
		tl, _ := failed(t)
		tl.clock.Advance(2 * time.Minute)
		tl.dispatchAll()
		tl.publishRetries()
		if got := tl.retryMarks.carried(); got != nil {
			t.Errorf("published %v once the retry came due, want none", got)
		}
	})
	t.Run("deleted and put again", func(t *testing.T) {
		tl, def := failed(t)
		tl.handle(&eventsCmd{part: 0, rev: 11, deletes: []string{"t"}})
		def.createRev = 12
		tl.handle(&eventsCmd{part: 0, rev: 12, created: 12, upserts: []taskDef{def}})
		tl.publishRetries()
		if got := tl.retryMarks.carried(); got != nil {
			t.Errorf("published %v once t was deleted and put again, want none", got)
		}
	})
}

// After a crash or a fence the next owner takes the retries waiting on
// the dead session from its watermark key: from its value, or from the
// value it names as its base but for the partitions whose retries the
// value carries (those that changed since the base: an empty list when
// they are gone). A value written by a node of the version before the
// retries has none, and that version reads the rest of a value with them.
func TestEngine_ResumeAfterACrashTakesTheSessionsRetries(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, cli := resumingEngine(t, base)
	ctx := context.Background()
	key := e.keys.watermark("node-a", "s1")
	b, _ := json.Marshal(checkpoint{Node: "node-a", Session: "s1", Watermark: base})
	putKey(t, cli, e.keys.checkpoint(0), string(b))
	check := func(what string, want waitingRetries) {
		t.Helper()
		res, err := e.resume(ctx, 0, newDeadMarks())
		if err != nil {
			t.Fatal(err)
		}
		// As JSON: the overrides decoded are not the ones written.
		got, _ := json.Marshal(res.retries)
		if w, _ := json.Marshal(want); string(got) != string(w) {
			t.Errorf("%s: resumed with the retries %s, want %s", what, got, w)
		}
	}
	w := base.Add(10 * time.Second).UnixNano()
	a := appliedRevs{armed: map[int]int64{}}
	for p := range 8 {
		a.armed[p] = int64(40 + p)
	}
	write := func(rets map[int]waitingRetries) (whole bool) {
		t.Helper()
		v, whole := a.value(w, nil, carriedLists{retries: rets}, "s1")
		if rev := putKey(t, cli, key, v); whole {
			a.wrote(rev, carriedLists{retries: rets})
		}
		return whole
	}
	retry := func(id string) pendingFire {
		return pendingFire{ID: id, At: base, Attempt: 2, Due: base.Add(time.Minute), Override: &task.Override{Payload: json.RawMessage(`1`)}}
	}
	first := map[int]waitingRetries{0: {Applied: 40, Fires: []pendingFire{retry("x")}}, 1: {Applied: 41, Fires: []pendingFire{retry("y")}}}
	if !write(first) {
		t.Fatal("the first value names a base")
	}
	check("in the value", first[0])
	a.armed[2]++
	if write(first) {
		t.Fatal("a value whose applied revisions moved a little names a base")
	}
	check("in the base", first[0])
	next := map[int]waitingRetries{0: {Applied: 42, Fires: []pendingFire{retry("x"), retry("z")}}, 1: first[1]}
	if write(next) {
		t.Fatal("a value whose retries changed names a base all the same")
	}
	check("changed since the base", next[0])
	if write(map[int]waitingRetries{1: first[1]}) {
		t.Fatal("a value whose retries went names a base all the same")
	}
	check("gone since the base", waitingRetries{})

	v, _ := a.value(w, nil, carriedLists{retries: first}, "s2") // a new session's first value: all of it
	var before struct {
		At       time.Time        `json:"at"`
		Applied  map[int]int64    `json:"applied"`
		EndWaits map[int]endWaits `json:"end_waits"`
	}
	if err := json.Unmarshal([]byte(v), &before); err != nil || before.At.UnixNano() != w || before.Applied[0] != 40 {
		t.Errorf("a node of the version before the retries read %s as %+v (%v)", v, before, err)
	}
	putKey(t, cli, key, `{"at":"2026-03-01T12:00:10Z","applied":{"0":40},"end_waits":{"0":{"applied":40,"ids":["x"]}}}`)
	check("a value of the version before", waitingRetries{})
}

// A fire that waited for the running one (buffer_one) comes in a crashed
// session's watermark with its due time. The successor runs it when it is
// due by the point the partition resumes from, and leaves it to the
// schedule, which fires it again from there, when it is due after: run
// from the list too, it fired twice.
func TestEngine_HeldRetriesLeaveAWaitingFireDueAfterTheResumeToTheSchedule(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	waiting := func(id string, at time.Time) pendingFire {
		f := handedFire(id, at.UnixNano(), kindSchedule)
		f.Due = at.Add(5 * time.Millisecond) // its jitter
		return f
	}
	retry := pendingFire{ID: "r", At: base, Attempt: 2, Due: base.Add(time.Hour)}
	handed := handedTo{retries: waitingRetries{Applied: 10, Fires: []pendingFire{
		waiting("before", base.Add(-time.Second)), waiting("at", base.Add(-5*time.Millisecond)), waiting("after", base), retry,
	}}}
	a := &arming{defs: []taskDef{{id: "before", createRev: 3}, {id: "at", createRev: 3}, {id: "after", createRev: 3}, {id: "r", createRev: 3}},
		resume: base.UnixNano(), handed: &handed}
	if err := (&Engine{}).heldRetries(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range handed.pending {
		got = append(got, f.ID)
	}
	if want := []string{"before", "at", "r"}; !slices.Equal(got, want) {
		t.Errorf("runs %v of the waiting fires carried, want %v: after is due past the resume point", got, want)
	}
}

// FuzzPendingFireJSONSize: the size a publish counts is json.Marshal's.
func FuzzPendingFireJSONSize(f *testing.F) {
	f.Add("a", int64(0), int64(0), uint16(0), false, false, int64(0))
	f.Add(`t"<&>\`, int64(1_700_000_000_123_000_000), int64(1_700_000_001_000_000_000), uint16(3), true, false, int64(0))
	f.Add("é\u2028", int64(-1), int64(5), uint16(2), false, true, int64(0))
	f.Add("x\x01y", int64(1), int64(0), uint16(65535), false, false, int64(0))
	f.Add("t", int64(1), int64(2), uint16(1), false, false, int64(123456789))
	f.Fuzz(func(t *testing.T, id string, at, due int64, attempt uint16, backfill, override bool, trigger int64) {
		p := pendingFire{ID: id, At: time.Unix(0, at).UTC(), Backfill: backfill, Attempt: attempt, Trigger: trigger}
		if due != 0 {
			p.Due = time.Unix(0, due).UTC()
		}
		if override {
			p.Override = &task.Override{Payload: json.RawMessage(`{"k":1}`)}
		}
		if got, want := p.jsonSize(), jsonSize(p); got != want {
			t.Errorf("%+v: size %d, json.Marshal wrote %d", p, got, want)
		}
	})
}

// The loop publishes the waiting retries at most once a WatermarkInterval,
// so that a retry that came due right after a publish stays listed until
// the next, while the workers take it and the watermark passes its time.
// A value written then, the last before a crash, lists a retry that
// started before it: the next owner ran that attempt again, with the same
// idempotency key, where a retry runs again only if it started after the
// last write etcd took.
func TestEngine_ResumeAfterACrashRunsNoRetryThatStartedBeforeTheWatermark(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, retryingProfile(), "0 0 0 1 1 *", "flaky", "other")
	tl.setApplied(0, 10)
	tl.trigger(0, "flaky", base)
	tl.dispatchAll()
	flaky := tl.takeQueued()
	tl.trigger(0, "other", base.Add(time.Millisecond))
	tl.dispatchAll()
	other := tl.takeQueued()
	tl.end(flaky, statusFailed) // flaky's attempt 2 waits
	tl.publishRetriesDue()
	var due time.Time
	for _, rs := range tl.retries {
		if rs.due != 0 {
			due = time.Unix(0, rs.due).UTC()
		}
	}
	// other's attempt 1 fails just before flaky's attempt 2 is due: that
	// publish is the last for a WatermarkInterval.
	tl.clock.Advance(due.Add(-tl.cfg.WatermarkInterval / 2).Sub(tl.clock.Now()))
	tl.end(other, statusFailed)
	tl.publishRetriesDue()
	tl.clock.Advance(tl.cfg.WatermarkInterval/2 + tl.cfg.Tick) // the wheel releases whole ticks
	tl.dispatchAll()
	tl.publishRetriesDue()
	if j := tl.takeQueued(); j.id != "flaky" || j.attempt != 2 { // a worker takes it: it starts
		t.Fatalf("took attempt %d of %s, want flaky's attempt 2", j.attempt, j.id)
	}
	tl.publish()
	w := tl.applieds.fold(map[int]int64{})
	if w < due.UnixNano() {
		t.Fatalf("the watermark %v is before flaky's attempt 2, due %v", time.Unix(0, w).UTC(), due)
	}

	if got, want := resumedRetries(t, base, tl, w), []string{"other attempt 2"}; !slices.Equal(got, want) {
		t.Errorf("the next owner runs %v after a watermark at %v, want %v: flaky's attempt 2 started before it",
			got, time.Unix(0, w).UTC().Format(time.StampMilli), want)
	}
}

// A retry handed on late, armed already due, waits in the wheel with its
// time behind the dispatch point until the next dispatch: a value
// written meanwhile has a watermark past it, and the next owner runs it.
func TestEngine_ResumeAfterACrashRunsARetryArmedAlreadyDue(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, retryingProfile(), "0 0 0 1 1 *", "flaky")
	tl.setApplied(0, 10)
	tl.clock.Advance(10 * time.Second)
	tl.dispatchAll()
	sched := base.Add(time.Second)
	tl.putRetry(0, "flaky", sched.Add(time.Millisecond), 11, registry.Retry{Attempt: 2, Due: base.Add(5 * time.Second), At: sched})
	tl.publishRetriesDue()
	w := tl.applieds.fold(map[int]int64{})
	if w < base.Add(5*time.Second).UnixNano() {
		t.Fatalf("the watermark %v is before the retry's time", time.Unix(0, w).UTC())
	}
	if got, want := resumedRetries(t, base, tl, w), []string{"flaky attempt 2"}; !slices.Equal(got, want) {
		t.Errorf("the next owner runs %v, want %v: it waited in the wheel", got, want)
	}
}

// An acquire names its session in the checkpoint, which then lists no
// pending fires, once a watermark past the point where the partition was
// armed is acknowledged (nameSession): from there a successor takes the
// retries handed over from that watermark. A retry the acquire took over
// waited unpublished for up to a WatermarkInterval (publishRetriesDue),
// so that the value that named the session lacked it, and a crash right
// after lost it, where one just before ran it from the hold checkpoint.
func TestEngine_RetryTakenOverIsInTheWatermarkThatNamesTheSession(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	tl.add(t, 0, base, retryingProfile(), "0 0 0 1 1 *", "flaky")
	tl.add(t, 1, base, retryingProfile(), "0 0 0 1 1 *", "other")
	tl.setApplied(0, 10)
	tl.setApplied(1, 10)
	tl.trigger(1, "other", base)
	tl.dispatchAll()
	tl.failFirstQueued() // other's retry waits: published now, the last for a WatermarkInterval
	tl.publishRetriesDue()
	sched := base.Add(-time.Minute)
	tl.handle(&takeOverCmd{part: 0, fires: []pendingFire{{ID: "flaky", At: sched, Attempt: 2, Due: base.Add(5 * time.Second)}}})
	namingValueCarries(t, base, tl, "flaky attempt 2")
}

// So is a fire of the schedule handed over in a released checkpoint
// that waits, taken over, for the run of the previous owner that went on
// past the release (buffer_one): the value that named the session lacked
// it, and a crash right after lost it.
func TestEngine_WaitingFireTakenOverIsInTheWatermarkThatNamesTheSession(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.concurrency = "noop/buffer", task.ConcurrencyBufferOne
	tl.add(t, 0, base, prof, "0 0 0 1 1 *", "slow")
	tl.add(t, 1, base, retryingProfile(), "0 0 0 1 1 *", "other")
	tl.setApplied(0, 10)
	tl.setApplied(1, 10)
	i, r, _ := tl.tab.lookup("slow")
	tl.runElsewhere(i, r, []elsewhereRun{{key: "run-of-the-previous-owner"}})
	tl.trigger(1, "other", base)
	tl.dispatchAll()
	tl.failFirstQueued() // other's retry waits: published now, the last for a WatermarkInterval
	tl.publishRetriesDue()
	tl.handle(&takeOverCmd{part: 0, fires: []pendingFire{{ID: "slow", At: base.Add(-time.Second)}}})
	if _, waits := tl.pending[i]; !waits {
		t.Fatal("the fire handed over does not wait for the run elsewhere")
	}
	namingValueCarries(t, base, tl, "slow attempt 0")
}

// namingValueCarries lets tl's acquire, whose take-over it just handled,
// name its session: its watermark passes the point where it armed the
// partition half a WatermarkInterval later. The value written then, the
// session's last before a crash, must hand the next owner want.
func namingValueCarries(t *testing.T, base time.Time, tl *testLoop, want ...string) {
	t.Helper()
	tl.publishRetriesDue()
	armed := tl.through // nameSession's throughCmd
	tl.clock.Advance(tl.cfg.WatermarkInterval / 2)
	tl.dispatchAll()
	tl.publishRetriesDue()
	w := tl.applieds.fold(map[int]int64{})
	if w <= armed {
		t.Fatalf("the watermark %v is not past the point %v where the partition was armed", time.Unix(0, w).UTC(), time.Unix(0, armed).UTC())
	}
	if got := resumedRetries(t, base, tl, w); !slices.Equal(got, want) {
		t.Errorf("the next owner runs %v after the value that named the session, want %v", got, want)
	}
}

// resumedRetries writes the watermark value of tl's session s1 at w, as
// its last before a crash, and returns the retries its next owner takes
// from it, as "id attempt n".
func resumedRetries(t *testing.T, base time.Time, tl *testLoop, w int64) []string {
	t.Helper()
	e, cli := resumingEngine(t, base)
	a := appliedRevs{armed: map[int]int64{0: 10}}
	v, _ := a.value(w, nil, carriedLists{retries: tl.retryMarks.carried()}, "s1")
	putKey(t, cli, e.keys.watermark("node-a", "s1"), v)
	b, _ := json.Marshal(checkpoint{Node: "node-a", Session: "s1", Watermark: base})
	putKey(t, cli, e.keys.checkpoint(0), string(b))
	res, err := e.resume(context.Background(), 0, newDeadMarks())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range res.retries.Fires {
		got = append(got, fmt.Sprintf("%s attempt %d", f.ID, f.Attempt))
	}
	return got
}
