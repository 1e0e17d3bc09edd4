package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
)

// testLoop is a dispatch loop driven by the test, without etcd and without
// its goroutine: the test calls dispatch and sends commands itself, and the
// pool's workers never take a job, so that what was dispatched stays in
// the queue to be looked at.
type testLoop struct {
	*loop
	clock *testClock
}

func newTestLoop(t testing.TB, at time.Time, tweak func(*Config)) *testLoop {
	t.Helper()
	cfg := DefaultConfig("loop").withDefaults()
	cfg.Partitions, cfg.Workers, cfg.Queue, cfg.BatchSize = 2, 1, 1000, 10
	clock := newTestClock(at, 0)
	cfg.Clock = clock
	if tweak != nil {
		tweak(&cfg)
	}
	start := clock.Now().UnixNano()
	st := &stats{}
	never := func() bool { return true } // workers wait: nothing is taken
	p := newPool(cfg, nil, st, never, start)
	var ack acked
	ack.at.Store(math.MaxInt64 / 2) // no lead limit
	l, err := newLoop(cfg, schedule.NewTable(), p, newHolds(), st, nil, func() bool { return false }, &ack, make(chan struct{}, 1), start)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(p.quit)
		p.drain(time.Second)
	})
	return &testLoop{loop: l, clock: clock}
}

// everySecond interns the every-second schedule most loop tests fire by.
func (tl *testLoop) everySecond(t testing.TB) schedule.Handle {
	t.Helper()
	h, err := tl.scheds.Intern("* * * * * *", "UTC", "x")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// add loads tasks into partition part, each resuming after resume.
func (tl *testLoop) add(t testing.TB, part int, resume time.Time, prof *profile, spec string, ids ...string) {
	t.Helper()
	defs := make([]taskDef, 0, len(ids))
	for _, id := range ids {
		h, err := tl.scheds.Intern(spec, "UTC", id)
		if err != nil {
			t.Fatal(err)
		}
		defs = append(defs, taskDef{id: id, hash: xxhash.Sum64String(id), part: part, sched: h, prof: prof})
	}
	tl.handle(&loadCmd{part: part, resume: resume.UnixNano(), defs: defs, first: true, done: make(chan struct{})})
}

// dispatched returns the fires in the queue and waiting for room, as
// "id@unix-ms", skipping those dropped.
func (tl *testLoop) dispatched(part int) []string {
	var out []string
	add := func(j *job) {
		if int(j.part) == part && j.kind != kindDropped {
			out = append(out, fmt.Sprintf("%s@%d", j.id, j.sched/int64(time.Millisecond)))
		}
	}
	p := tl.pool
	p.mu.Lock()
	for i := range p.queued() {
		add(p.at(i))
	}
	p.mu.Unlock()
	for i := range tl.unpushed {
		add(&tl.unpushed[i])
	}
	return out
}

// failFirstQueued empties the queue, and the first job queued ends
// failed, as a worker would report it.
func (tl *testLoop) failFirstQueued() {
	tl.end(tl.takeQueued(), statusFailed)
}

// takeQueued empties the queue, as workers taking its jobs do, and returns
// the first job queued.
func (tl *testLoop) takeQueued() job {
	tl.pool.mu.Lock()
	j := *tl.pool.at(0)
	tl.pool.mu.Unlock()
	tl.pool.reset()
	return j
}

// end applies the end of job j with status st, as a worker reports it.
func (tl *testLoop) end(j job, st uint8) {
	var done completionBatch
	done.add(&j, st, map[bool]string{true: "boom"}[st == statusFailed], false)
	tl.complete(&done)
}

// A job of a task the release did not note as leaving (one attempt,
// allow), which a worker took before the release and so counted started,
// is handed on should the node's stop meet it unrun (leavers.unrun): by
// its partition's release, once sealed and graceful, and only a job of
// that release's fence, and a first attempt. The node's stop comes only
// after the releases (Close): TestEngine_AcquireAHurriedCloseRunsAFireTakenBeforeTheStop.
func TestLoop_UnrunJobGoesByItsPartitionsRelease(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), nil)
	plain := noopProfile(task.MisfireFireOnce)
	plain.key, plain.noop = "plain", false // workers take nothing here: it never runs
	tl.add(t, 0, base.Add(-time.Second), plain, "* * * * * *", "plain")
	tl.parts[0].fence, tl.parts[0].created = 9, 7
	tl.clock.Advance(time.Second/2 + time.Millisecond)
	tl.dispatch()
	j := tl.takeQueued()
	handed := func() []string {
		var out []string
		for _, f := range tl.pool.chains.take() {
			out = append(out, fmt.Sprintf("%s@%d attempt %d created %d", f.from, f.sched/int64(time.Second), f.retry.Attempt, f.created))
		}
		return out
	}
	rel := tl.releaseNow(0)
	if rel.running != nil {
		t.Fatalf("the release waits for %+v; a task of one attempt that allows overlaps is not waited for", rel.running)
	}
	if tl.pool.leaving.unrun(&j) {
		t.Error("a job was handed on before its release was sealed")
	}
	tl.pool.leaving.seal(rel, false) // as a fence's, or an undone acquire's
	if tl.pool.leaving.unrun(&j) {
		t.Error("a job was handed on by a release that was not graceful")
	}
	tl.pool.leaving.seal(rel, true)
	for name, other := range map[string]func(j *job){
		"another fence":   func(j *job) { j.fence = 8 },
		"a later attempt": func(j *job) { j.attempt = 2 },
	} {
		o := j
		other(&o)
		if tl.pool.leaving.unrun(&o) {
			t.Errorf("a job of %s was handed on", name)
		}
	}
	if !tl.pool.leaving.unrun(&j) {
		t.Error("the job was not handed on")
	}
	if got, want := handed(), []string{fmt.Sprintf("plain@%d attempt 1 created 7", base.Unix())}; !slices.Equal(got, want) {
		t.Errorf("handed on %v, want %v", got, want)
	}
	// A release of the partition while it loaded again, which dispatched
	// nothing, leaves the record of the release before.
	tl.pool.leaving.seal(release{hand: map[int]*handOver{0: {}}}, true)
	if !tl.pool.leaving.unrun(&j) {
		t.Error("a release while loading, after, took the record of the release that dispatched the job")
	}
	handed()
	// Nor does a later release that was not graceful: the job is still the
	// graceful one's.
	tl.pool.leaving.seal(release{hand: map[int]*handOver{0: {fence: 10}}}, false)
	if !tl.pool.leaving.unrun(&j) {
		t.Error("a release that was not graceful, after, took the record of the release that dispatched the job")
	}
	handed()
}

// len is how many tasks the leavers hold.
func (ls *leavers) len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.m)
}

// releaseNow releases parts as the coordinator's release command does,
// between two of the loop's batches.
func (tl *testLoop) releaseNow(parts ...int) release {
	c := &releaseCmd{parts: parts, reply: make(chan release, 1)}
	tl.handle(c)
	return <-c.reply
}

func noopProfile(misfire task.MisfirePolicy) *profile {
	return &profile{key: "noop/" + string(misfire), exec: executor.Noop, noop: true, timeout: time.Minute,
		maxAttempts: 1, misfire: misfire, catchup: time.Minute, concurrency: task.ConcurrencyAllow}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// A release served between two batches of one tick (the tick holds more
// fires than a batch) must hand each fire of the tick over exactly once:
// either dispatched here or left to the next owner, who arms every task
// from its first fire after the released mark and runs the pending list.
// It used to set the mark before the tick and list the queued fires as
// pending too, so the new owner ran the whole tick again.
func TestLoop_ReleaseBetweenBatchesOfOneTickHandsEachFireOverOnce(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), nil)
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", ids("a", 25)...)
	tl.add(t, 1, base.Add(-time.Second), prof, "* * * * * *", ids("b", 25)...)

	tl.clock.Advance(time.Second/2 + time.Millisecond)
	if !tl.dispatch() {
		t.Fatal("the first batch should be cut: the tick holds 50 fires, a batch 10")
	}
	before := tl.dispatched(0)
	rel := tl.releaseNow(0)
	hand := rel.hand[0]

	// What the next owner will do: every task from its first fire after
	// the mark, plus the pending list.
	counts := map[string]int{}
	for _, k := range tl.dispatched(0) {
		counts[k]++
	}
	for _, f := range hand.pending {
		counts[fmt.Sprintf("%s@%d", f.ID, f.At.UnixMilli())]++
	}
	h := tl.everySecond(t)
	for _, id := range ids("a", 25) {
		first := next(tl.scheds.Get(h), hand.mark)
		for at := base; at.UnixNano() <= base.Add(2*time.Second).UnixNano(); at = at.Add(time.Second) {
			if at.UnixNano() >= first {
				counts[fmt.Sprintf("%s@%d", id, at.UnixMilli())]++
			}
		}
	}
	for _, id := range ids("a", 25) {
		for at := base; !at.After(base.Add(2 * time.Second)); at = at.Add(time.Second) {
			if n := counts[fmt.Sprintf("%s@%d", id, at.UnixMilli())]; n != 1 {
				t.Errorf("%s at %s: fired %d times across the hand-over (dispatched before the release: %d fires of the partition)",
					id, at.Format("15:04:05"), n, len(before))
			}
		}
	}
	if rel.ticket < tl.pool.pushedCount() {
		t.Errorf("ticket %d is before the last dispatched job (%d pushed)", rel.ticket, tl.pool.pushedCount())
	}
	if tl.holds.cap(math.MaxInt64) != hand.mark {
		t.Errorf("the watermark is not held at the released mark")
	}
}

// After every dispatch, no timer still in the wheel may be due at or
// before the dispatch point: the point says every fire up to it was
// handed to the pool, and the watermark follows it. A fire_all catch-up
// chain arms its next missed fire in the past; the point used to claim it
// before the wheel released it, so a crash or release lost it.
func TestLoop_DispatchPointStaysBeforeFiresArmedInThePast(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	// The node was stalled for 20 s (its loop started then): past the
	// misfire threshold, so fire_all walks the missed seconds one dispatch
	// at a time.
	tl := newTestLoop(t, base.Add(-20*time.Second), nil)
	tl.add(t, 0, base.Add(-20*time.Second), noopProfile(task.MisfireFireAll), "* * * * * *", ids("all", 3)...)
	tl.add(t, 1, base.Add(-20*time.Second), noopProfile(task.MisfireFireOnce), "* * * * * *", ids("once", 3)...)
	tl.clock.Advance(20 * time.Second)
	for range 30 {
		tl.dispatch()
		for i := uint32(0); int(i) < len(tl.tab.pages)*recPageSize; i++ {
			r := tl.tab.rec(i)
			if r.flags&flagLive == 0 || r.next == 0 {
				continue
			}
			if due := r.next + tl.delay(r, r.next); due <= tl.through {
				t.Fatalf("%s: armed at %s, at or before the dispatch point %s",
					tl.tab.id(r), time.Unix(0, due).UTC().Format("15:04:05.000"),
					time.Unix(0, tl.through).UTC().Format("15:04:05.000"))
			}
		}
	}
	got := tl.dispatched(0)
	slices.Sort(got)
	if want := 3 * 20; len(got) != want { // 19 missed seconds and the one due now, for 3 tasks
		t.Errorf("fire_all dispatched %d fires, want %d", len(got), want)
	}
}

// faultKV fails, slows or holds the etcd requests a test chooses, on one
// node's client, at any time.
type faultKV struct {
	clientv3.KV
	put      atomic.Pointer[func(key, value string) bool] // transactions with a Put that matches fail
	del      atomic.Pointer[func(key string) bool]        // Deletes of keys that match fail
	pause    atomic.Pointer[pausing]
	late     atomic.Pointer[lateCommit]
	once     atomic.Pointer[failOnce]
	slowRead atomic.Int64 // ns added to reads of tasks
	slowPut  atomic.Pointer[slowPut]
	afterGet atomic.Pointer[func(key string)]
	failDo   atomic.Pointer[failingGet]                   // the next Do of a Get of a key that matches fails
	failGet  atomic.Pointer[func(key string) bool]        // the next Get of a key that matches fails
	lostOnce atomic.Pointer[func(key, value string) bool] // the next transaction with a Put that matches commits, unanswered
}

// slowPut makes every transaction with a Put that matches answer after
// delay, as a slow etcd does: one whose caller gives up first fails.
type slowPut struct {
	match func(key, value string) bool
	delay time.Duration
}

// slowsPuts slows from now on the transactions with a Put that matches by
// delay; a nil match slows none.
func (f *faultKV) slowsPuts(match func(key, value string) bool, delay time.Duration) {
	if match == nil {
		f.slowPut.Store(nil)
	} else {
		f.slowPut.Store(&slowPut{match: match, delay: delay})
	}
}

// pausing holds the commit of the next transaction with a Put that
// matches: it says so on reached, and commits once until is closed.
type pausing struct {
	match   func(key, value string) bool
	reached chan struct{}
	until   <-chan struct{}
}

var errInjected = errors.New("injected etcd failure")

// injectFaults puts a faultKV in front of cli's KV.
func injectFaults(cli *clientv3.Client) *faultKV {
	f := &faultKV{KV: cli.KV}
	cli.KV = f
	return f
}

// puts fails from now on the transactions with a Put that matches; nil
// fails none.
func (f *faultKV) puts(match func(key, value string) bool) {
	if match == nil {
		f.put.Store(nil)
	} else {
		f.put.Store(&match)
	}
}

// deletes fails from now on the Deletes of keys that match; nil fails
// none.
func (f *faultKV) deletes(match func(key string) bool) {
	if match == nil {
		f.del.Store(nil)
	} else {
		f.del.Store(&match)
	}
}

// pauses holds the commit of the next transaction with a Put that matches
// until until is closed; the channel it returns is closed when one is
// held.
func (f *faultKV) pauses(match func(key, value string) bool, until <-chan struct{}) <-chan struct{} {
	p := &pausing{match: match, reached: make(chan struct{}), until: until}
	f.pause.Store(p)
	return p.reached
}

// failOnce fails the next transaction with a Put that matches with err.
type failOnce struct {
	match func(key, value string) bool
	err   error
}

// failsOnce makes the next transaction with a Put that matches fail with
// err, without reaching etcd.
func (f *faultKV) failsOnce(match func(key, value string) bool, err error) {
	f.once.Store(&failOnce{match: match, err: err})
}

// lateCommit is a transaction whose caller gave up while etcd still got
// it: it fails at its caller when the caller's context ends, and etcd
// applies it after the next Delete of the key it puts has returned, as
// etcd can apply a committed proposal after a later request of the same
// client (sent to another member, or proposed first).
type lateCommit struct {
	match   func(key, value string) bool
	mu      sync.Mutex                 // guards key
	key     string                     // the key the held transaction puts; "" until one is held
	reached chan struct{}              // closed when the transaction is held
	deleted chan struct{}              // closed when a Delete of key returned
	after   <-chan struct{}            // the commit waits for it too
	done    chan *clientv3.TxnResponse // the late commit's answer (nil: it failed)
}

// claim holds the transaction that puts key if none is held yet.
func (l *lateCommit) claim(key, value string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.key != "" || !l.match(key, value) {
		return false
	}
	l.key = key
	return true
}

// puts reports whether the held transaction puts key.
func (l *lateCommit) puts(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.key == key
}

// lateCommits makes the next transaction with a Put that matches a late
// commit (lateCommit), which also waits until after is closed.
func (f *faultKV) lateCommits(match func(key, value string) bool, after <-chan struct{}) *lateCommit {
	l := &lateCommit{match: match, reached: make(chan struct{}), deleted: make(chan struct{}), after: after,
		done: make(chan *clientv3.TxnResponse, 1)}
	f.late.Store(l)
	return l
}

// answersLostOnce makes the next transaction with a Put that matches
// commit in etcd and fail at its caller, as one whose answer a timeout or
// a leader change cut off.
func (f *faultKV) answersLostOnce(match func(key, value string) bool) { f.lostOnce.Store(&match) }

// releasedCheckpoints matches the writes of a released checkpoint;
// triggerKeys the keys of triggers.
func releasedCheckpoints(key, value string) bool {
	return strings.Contains(key, "/checkpoints/") && strings.Contains(value, `"released":true`)
}
func triggerKeys(key string) bool { return strings.Contains(key, "/triggers/") }

// failingGet is the Do of a Get that fails (failsGetOnce): it fails once
// after is closed, nil: at once.
type failingGet struct {
	match func(key string) bool
	after <-chan struct{}
}

// failsGetOnce makes the next Do of a Get of a key that matches fail,
// without reaching etcd.
func (f *faultKV) failsGetOnce(match func(key string) bool) { f.failsGetOnceAfter(match, nil) }

// failsGetOnceAfter is failsGetOnce, the failure held until after is
// closed: what the caller does meanwhile happens before it fails.
func (f *faultKV) failsGetOnceAfter(match func(key string) bool, after <-chan struct{}) {
	f.failDo.Store(&failingGet{match: match, after: after})
}

func (f *faultKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if g := f.failDo.Load(); g != nil && op.IsGet() && g.match(string(op.KeyBytes())) && f.failDo.CompareAndSwap(g, nil) {
		if g.after != nil {
			select {
			case <-g.after:
			case <-ctx.Done():
				return clientv3.OpResponse{}, ctx.Err()
			}
		}
		return clientv3.OpResponse{}, errInjected
	}
	return f.KV.Do(ctx, op)
}

// failsGetOnceOf makes the next Get of a key that matches fail, without
// reaching etcd.
func (f *faultKV) failsGetOnceOf(match func(key string) bool) { f.failGet.Store(&match) }

func (f *faultKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if m := f.failGet.Load(); m != nil && (*m)(key) && f.failGet.CompareAndSwap(m, nil) {
		return nil, errInjected
	}
	if d := time.Duration(f.slowRead.Load()); d > 0 && strings.Contains(key, "/tasks/") {
		if !sleepCtx(ctx, d) {
			return nil, ctx.Err()
		}
	}
	resp, err := f.KV.Get(ctx, key, opts...)
	if hook := f.afterGet.Load(); hook != nil {
		(*hook)(key)
	}
	return resp, err
}

func (f *faultKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	if m := f.del.Load(); m != nil && (*m)(key) {
		return nil, errInjected
	}
	resp, err := f.KV.Delete(ctx, key, opts...)
	if l := f.late.Load(); l != nil && l.puts(key) && f.late.CompareAndSwap(l, nil) {
		close(l.deleted)
	}
	return resp, err
}

func (f *faultKV) Txn(ctx context.Context) clientv3.Txn {
	return &faultTxn{Txn: f.KV.Txn(ctx), f: f, ctx: ctx}
}

type faultTxn struct {
	clientv3.Txn
	f     *faultKV
	fail  bool
	err   error // fail with it rather than errInjected
	pause *pausing
	late  *lateCommit
	lost  bool // commit, then fail
	slow  time.Duration

	// The transaction as built, for a late commit.
	ctx          context.Context
	cmps         []clientv3.Cmp
	thens, elses []clientv3.Op
}

func (t *faultTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *faultTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elses = append(t.elses, ops...)
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *faultTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if m := t.f.del.Load(); op.IsDelete() && m != nil && (*m)(string(op.KeyBytes())) {
			t.fail = true
		}
		if !op.IsPut() {
			continue
		}
		key, value := string(op.KeyBytes()), string(op.ValueBytes())
		if m := t.f.put.Load(); m != nil && (*m)(key, value) {
			t.fail = true
		}
		if p := t.f.pause.Load(); p != nil && p.match(key, value) && t.f.pause.CompareAndSwap(p, nil) {
			t.pause = p
		}
		if o := t.f.once.Load(); o != nil && o.match(key, value) && t.f.once.CompareAndSwap(o, nil) {
			t.fail, t.err = true, o.err
		}
		if l := t.f.late.Load(); l != nil && l.claim(key, value) {
			t.late = l
		}
		if m := t.f.lostOnce.Load(); m != nil && (*m)(key, value) && t.f.lostOnce.CompareAndSwap(m, nil) {
			t.lost = true
		}
		if sp := t.f.slowPut.Load(); sp != nil && sp.match(key, value) {
			t.slow = sp.delay
		}
	}
	t.thens = append(t.thens, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *faultTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.fail {
		if t.err != nil {
			return nil, t.err
		}
		return nil, errInjected
	}
	if l := t.late; l != nil {
		close(l.reached)
		go func() {
			<-l.deleted
			<-l.after
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := t.f.KV.Txn(ctx).If(t.cmps...).Then(t.thens...).Else(t.elses...).Commit()
			if err != nil {
				resp = nil
			}
			l.done <- resp
		}()
		<-t.ctx.Done()
		return nil, t.ctx.Err()
	}
	if t.pause != nil {
		close(t.pause.reached)
		<-t.pause.until
	}
	if t.lost {
		_, _ = t.Txn.Commit()
		return nil, errInjected
	}
	if t.slow > 0 {
		select {
		case <-time.After(t.slow):
		case <-t.ctx.Done():
			return nil, t.ctx.Err()
		}
	}
	return t.Txn.Commit()
}

// everySecond checks that each task fired at every second from its first
// fire until at least until, and counts the repeats.
func everySecond(t *testing.T, log *fireLog, tasks []string, until time.Time) (repeats int) {
	t.Helper()
	for _, id := range tasks {
		seen := map[time.Time]int{}
		var first time.Time
		for _, at := range log.forTask(id) {
			seen[at]++
			if first.IsZero() || at.Before(first) {
				first = at
			}
		}
		if first.IsZero() {
			t.Errorf("%s never fired", id)
			continue
		}
		for at := first; !at.After(until); at = at.Add(time.Second) {
			switch n := seen[at]; {
			case n == 0:
				t.Errorf("%s: the fire of %s is missing", id, at.Format("15:04:05"))
			case n > 1:
				repeats += n - 1
			}
		}
	}
	return repeats
}

// A release etcd refuses (a space quota alarm refuses writes but not
// keep-alives) must not strand its partitions. While the refusal lasts
// less than the lease TTL, the release is retried and commits: nothing
// repeats or is missed. When it lasts longer, the node ends its session so
// that its locks pass on, and the successors resume from the watermark
// held at the release: nothing is missed, at most the bounded lead
// repeats. Before, the partitions' locks stayed with the live session and
// the new owner waited for them for as long as the node lived. The
// successors fire the stalled seconds late, after the lease TTL (4 s) and
// their acquire: a misfire threshold of 30 s keeps them all, which the
// default 5 s collapsed into one (fire_once) when the tests ran in
// parallel under the race detector, and the check took them for misses.
func TestEngine_FailedReleaseDoesNotStrandPartitions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		refuse  time.Duration
		repeats bool
	}{
		{"refused briefly", 1500 * time.Millisecond, false},
		{"refused past the lease TTL", 0, true}, // until the session ended
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := etcdtest.Start(t)
			log := newFireLog()
			cfg := func(id string) func(*Config) {
				return func(c *Config) {
					c.NodeID, c.Partitions, c.LeaseTTL, c.MisfireThreshold = id, 8, 4*time.Second, 30*time.Second
				}
			}
			cliA := c.NewClient(t)
			faults := injectFaults(cliA)
			a := startNodeOn(t, cliA, "", log.handler, cfg("node-a"))
			tasks := ids("t", 40)
			for _, id := range tasks {
				putTask(t, a.e.Registry(), handlerTask(id, "* * * * * *"))
			}
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask(tasks[0])) >= 2 })

			faults.puts(releasedCheckpoints)
			sessA := a.e.sess.Load()
			b := startNodeOn(t, c.Client, "", log.handler, cfg("node-b"), noWait)
			if tc.refuse > 0 {
				time.Sleep(tc.refuse)
				faults.puts(nil)
			} else {
				etcdtest.WaitFor(t, 20*time.Second, func() bool { return sessA.Fenced() })
				faults.puts(nil)
			}
			etcdtest.WaitFor(t, 20*time.Second, func() bool { return b.e.Ready() && a.e.Ready() })
			until := time.Now().Truncate(time.Second).Add(2 * time.Second)
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				fires := log.forTask(tasks[0]) // once: the log grows between reads
				return len(fires) > 0 && !fires[len(fires)-1].Before(until.Add(time.Second))
			})
			fenced := sessA.Fenced()
			stopAndDrain(t, b, a)
			repeats := everySecond(t, log, tasks, until)
			if !tc.repeats && repeats > 0 {
				t.Errorf("%d fires repeated, want none: the release committed once etcd took it", repeats)
			}
			if tc.repeats && repeats > len(tasks)*2 {
				t.Errorf("%d fires repeated: more than the bounded lead's worth", repeats)
			}
			if fenced != tc.repeats {
				t.Errorf("node-a's session ended: %v, want %v", fenced, tc.repeats)
			}
		})
	}
}

// A release etcd applied though its answer was lost (a timeout, a leader
// change) is done: the lock is gone by its own delete, under a live lease.
// Taken for a lock lost with the lease, it stayed stuck: the node held its
// watermark at the mark, so that dispatch stopped at the lead for every
// partition it kept, and ended its session after the lease TTL; the fires
// of those partitions over the stall came later than the misfire
// threshold, and fire_once ran one of them. Here node-a's release of the
// partition node-b takes commits unanswered: node-a must go on firing the
// partition it keeps, every second, in the same session.
func TestEngine_ReleaseCommittedUnansweredIsDone(t *testing.T) {
	t.Parallel()
	const parts = 8
	c := etcdtest.Start(t)
	log := newFireLog()
	cfg := func(id string) func(*Config) {
		return func(c *Config) { c.NodeID = id; c.Partitions = parts; c.LeaseTTL = 8 * time.Second }
	}
	cliA := c.NewClient(t)
	faults := injectFaults(cliA)
	a := startNodeOn(t, cliA, "", log.handler, cfg("node-a"))
	var tasks []string // one a partition
	for i := 0; len(tasks) < parts; i++ {
		id := fmt.Sprintf("tick-%d", i)
		if !slices.ContainsFunc(tasks, func(t string) bool { return ring.Partition(t, parts) == ring.Partition(id, parts) }) {
			tasks = append(tasks, id)
			putTask(t, a.e.Registry(), handlerTask(id, "* * * * * *"))
		}
	}
	for _, id := range tasks {
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask(id)) >= 2 })
	}

	faults.answersLostOnce(releasedCheckpoints)
	sessA := a.e.sess.Load()
	b := startNodeOn(t, c.Client, "", log.handler, cfg("node-b"))
	defer b.stop(t)
	if a.e.loop.owned.Load() == 0 {
		t.Fatal("node-a kept no partition")
	}
	// Past the lease TTL of node-a's release.
	until := time.Now().Truncate(time.Second).Add(10 * time.Second)
	etcdtest.WaitFor(t, 30*time.Second, func() bool {
		for _, id := range tasks {
			if fs := log.forTask(id); len(fs) == 0 || fs[len(fs)-1].Before(until.Add(time.Second)) {
				return false
			}
		}
		return true
	})
	if faults.lostOnce.Load() != nil {
		t.Fatal("no release checkpoint was committed unanswered: the test sets up nothing")
	}
	if sessA.Fenced() {
		t.Error("node-a's session ended: its release was taken for a lock lost")
	}
	stopAndDrain(t, b, a)
	if repeats := everySecond(t, log, tasks, until); repeats > 0 {
		t.Errorf("%d fires repeated, want none", repeats)
	}
}

// A node whose key left the member set (its lease ended while its own
// clock did not see it, or the key was deleted) ends its session at once:
// another node may own its partitions already.
func TestEngine_NodeKeyGoneEndsTheSession(t *testing.T) {
	c := etcdtest.Start(t)
	a := startNode(t, c, "", nil, func(c *Config) { c.LeaseTTL = 10 * time.Second })
	sess := a.e.sess.Load()
	if _, err := c.Client.Delete(context.Background(), sess.Key()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 5*time.Second, sess.Fenced)
	// It rejoins with a new session and owns its partitions again.
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.sess.Load() != sess && a.e.Ready() })
}

// Fires a released checkpoint handed over are run by the next owner,
// unless they are older than the task's catch-up window: a stale pending
// list (a checkpoint written long ago) must not replay.
func TestEngine_HandedOverFiresOlderThanTheCatchupWindowDoNotRun(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	k := newKeys(DefaultPrefix)
	tsk := handlerTask("stale", "0 0 1 1 *") // yearly: only the hand-over fires it
	p := int(xxhash.Sum64String(tsk.ID) % 4)
	now := time.Now().UTC().Truncate(time.Second)
	cp, _ := json.Marshal(checkpoint{Node: "gone", Watermark: now, Released: true, Pending: []pendingFire{
		{ID: "stale", At: now.Add(-2 * time.Minute)},  // outside the default 1 m window
		{ID: "stale", At: now.Add(-10 * time.Second)}, // inside
	}})
	if _, err := c.Client.Put(context.Background(), k.checkpoint(p), string(cp)); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, c, "", log.handler, func(c *Config) { c.Partitions = 4 })
	putTask(t, a.e.Registry(), tsk)
	a.stop(t) // hand over with the task present
	if _, err := c.Client.Put(context.Background(), k.checkpoint(p), string(cp)); err != nil {
		t.Fatal(err)
	}
	b := startNode(t, c, "", log.handler, func(c *Config) { c.Partitions = 4; c.NodeID = "node-b" })
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("stale")) >= 1 })
	b.stop(t)
	got := log.forTask("stale")
	if len(got) != 1 || !got[0].Equal(now.Add(-10*time.Second)) {
		t.Errorf("fired %v, want only the fire inside the catch-up window (%s)", secs(got), now.Add(-10*time.Second).Format("15:04:05"))
	}
}

// The fires handed over unrun that a node runs at its acquires are counted
// in the round's line, not logged a line a partition: a node stopped
// behind busy workers hands such fires over in most of its partitions,
// and its successor logged a thousand lines at a start.
func TestEngine_HandedOverFiresAreCountedInTheRoundsLine(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	k := newKeys(DefaultPrefix)
	byPart := map[int]string{} // a yearly task in each of two partitions: only the hand-over fires them
	for i := 0; len(byPart) < 2; i++ {
		id := fmt.Sprintf("unrun-%d", i)
		byPart[int(xxhash.Sum64String(id)%4)] = id
	}
	a := startNode(t, c, "", log.handler, func(c *Config) { c.Partitions = 4 })
	for _, id := range byPart {
		putTask(t, a.e.Registry(), handlerTask(id, "0 0 1 1 *"))
	}
	a.stop(t) // hand over with the tasks present
	at := time.Now().UTC().Truncate(time.Second).Add(-10 * time.Second)
	for p, id := range byPart {
		cp, _ := json.Marshal(checkpoint{Node: "gone", Watermark: at.Add(time.Second), Released: true, Pending: []pendingFire{{ID: id, At: at}}})
		if _, err := c.Client.Put(context.Background(), k.checkpoint(p), string(cp)); err != nil {
			t.Fatal(err)
		}
	}
	var buf logbuf.Buffer
	b := startNode(t, c, "", log.handler, func(c *Config) {
		c.Partitions, c.NodeID = 4, "node-b"
		c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		for _, id := range byPart {
			if len(log.forTask(id)) == 0 {
				return false
			}
		}
		return true
	})
	b.stop(t)
	unrun := 0
	for line := range strings.SplitSeq(buf.String(), "\n") {
		switch {
		case strings.Contains(line, "handed over unrun by the previous owner"):
			t.Errorf("a partition's own line at info: %s", line)
		case strings.Contains(line, `msg="acquired partitions"`):
			if _, n, ok := strings.Cut(line, "fires_handed_unrun="); ok {
				v, _ := strconv.Atoi(strings.Fields(n)[0])
				unrun += v
			}
		}
	}
	if unrun != 2 {
		t.Errorf("the acquired partitions' lines count %d fires handed over unrun, want 2:\n%s", unrun, buf.String())
	}
}

// What a released checkpoint hands over by task id (a retry and a fire
// unrun, a resume after a fire past the mark, the health of a failing
// task) is of the task its owner had, created at or before its applied
// revision: a task deleted and put again under the id before the next
// owner's acquire is another, which takes none of it. It took them all:
// the old task's retry ran the new one, which also inherited its
// failures and skipped its first hour of fires. Here kept's retry runs,
// and again, soon and failed, put again after applied, take nothing.
func TestEngine_HandedOverFiresOfATaskPutAgainSinceTheReleaseDoNotRun(t *testing.T) {
	for _, cached := range []bool{false, true} {
		t.Run(fmt.Sprintf("cached=%t", cached), func(t *testing.T) {
			c := etcdtest.Start(t)
			log := newFireLog()
			one := func(id string) func(*Config) {
				return func(c *Config) { c.Partitions, c.NodeID = 1, id }
			}
			a := startNode(t, c, "", log.handler, one("node-a"))
			reg := a.e.Registry()
			retried := func(id, spec string) *task.Task {
				tk := handlerTask(id, spec)
				tk.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(time.Second), MaxBackoff: task.Duration(time.Second)}
				return tk
			}
			for _, id := range []string{"kept", "again"} {
				putTask(t, reg, retried(id, "0 0 1 1 *")) // yearly: only the hand-over fires them
			}
			putTask(t, reg, handlerTask("soon", "* * * * * *"))
			putTask(t, reg, handlerTask("failed", "0 0 1 1 *"))
			a.stop(t)
			ctx := context.Background()
			at, err := c.Client.Get(ctx, "applied")
			if err != nil {
				t.Fatal(err)
			}
			applied := at.Header.Revision
			for _, tk := range []*task.Task{retried("again", "0 0 1 1 *"), handlerTask("soon", "* * * * * *"), handlerTask("failed", "0 0 1 1 *")} {
				if err := reg.Delete(ctx, tk.ID); err != nil {
					t.Fatal(err)
				}
				putTask(t, reg, tk)
			}
			now := time.Now().UTC().Truncate(time.Second)
			old := now.Add(-10 * time.Second)
			retry := func(id string) pendingFire { return pendingFire{ID: id, At: old, Attempt: 2, Due: now} }
			cp, _ := json.Marshal(checkpoint{Node: "node-a", Watermark: now, Released: true, Applied: applied,
				Pending: []pendingFire{retry("kept"), retry("again")},
				After:   []pendingFire{{ID: "soon", At: now.Add(time.Hour)}},
				Health:  []handedHealth{{ID: "failed", Fails: 3, FailedAt: old, Error: "boom"}},
			})
			if _, err := c.Client.Put(ctx, newKeys(DefaultPrefix).checkpoint(0), string(cp)); err != nil {
				t.Fatal(err)
			}
			dir := ""
			if cached {
				dir = a.dir // its tasks as of its last revision: those put again come with the catch-up
			}
			b := startNode(t, c, dir, log.handler, one("node-b"))
			defer b.stop(t)
			// soon fires every second, unless resumed after the hour; again's
			// retry, when it takes it, is due with kept's.
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				return len(log.forTask("kept")) == 1 && len(log.forTask("soon"))+len(log.forTask("again")) > 0
			})
			if got := log.forTask("again"); len(got) > 0 {
				t.Errorf("again, put again after the release, ran %v: the retry of the task before it", secs(got))
			}
			if len(log.forTask("soon")) == 0 {
				t.Errorf("soon, put again after the release, did not fire: resumed after the hour the task before it fired at")
			}
			if s, ok := b.e.TaskState(ctx, "failed"); !ok {
				t.Errorf("node-b does not own failed")
			} else if s.ConsecutiveFailures != 0 {
				t.Errorf("failed, put again after the release, has %d failures in a row, want none: they were the task before it's", s.ConsecutiveFailures)
			}
		})
	}
}

// A trigger whose key could not be deleted after it fired must not fire
// again when its partition changes hands: the delete is retried.
func TestEngine_TriggerWhoseDeleteFailedFiresOnce(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	cliA := c.NewClient(t)
	faults := injectFaults(cliA)
	a := startNodeOn(t, cliA, "", log.handler, func(c *Config) { c.Partitions = 4 })
	putTask(t, a.e.Registry(), handlerTask("once", "0 0 1 1 *"))
	faults.deletes(triggerKeys)
	if _, err := a.e.Registry().Trigger(context.Background(), "once"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("once")) == 1 })
	time.Sleep(300 * time.Millisecond) // a few failed deletes
	faults.deletes(nil)
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		r, err := a.e.Registry().PendingTriggers(context.Background())
		return err == nil && len(r.Kvs) == 0
	})
	a.stop(t)
	b := startNode(t, c, "", log.handler, func(c *Config) { c.Partitions = 4; c.NodeID = "node-b" })
	time.Sleep(500 * time.Millisecond)
	b.stop(t)
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("the trigger fired again after a hand-over: %v", d)
	}
}

// A node publishes what it prepared in turns, in the order it prepared
// it: prepareWindow at most of those published within prepareHold, the
// next as one is acquired or passes prepareHold. One whose acquire ended
// unlisted (the ring moved it on) leaves the queue, and so does one whose
// prepared report the coordinator took after the acquire's end: serve's
// select takes the two at random, and such a partition stayed published
// as prepared here, so that when the ring gave it to this node again its
// owner let go before this node prepared it.
func TestEngine_PreparedArePublishedInTurns(t *testing.T) {
	window, publish := time.NewTimer(time.Hour), time.NewTimer(time.Hour)
	defer window.Stop()
	defer publish.Stop()
	s := &serving{e: &Engine{log: quietLogger()}, ctx: context.Background(), parts: map[int]*owned{},
		acquiring: map[int]context.CancelFunc{}, desired: map[int]bool{}, unsure: map[int]bool{},
		preparedCh: make(chan int, 1), mine: map[int]time.Time{}, window: window, publish: publish}
	ended := fmt.Errorf("lock: %w", context.Canceled)
	for p := range 3 * prepareWindow {
		s.acquiring[p] = func() {}
		s.unlisted = append(s.unlisted, p)
	}
	// In the future, so that the finishes' own time.Now() finds every
	// one of them published within prepareHold.
	t0 := time.Now().Add(time.Hour)
	listed := func(want ...int) {
		t.Helper()
		if got := slices.Sorted(maps.Keys(s.mine)); !slices.Equal(got, want) {
			t.Fatalf("published %v, want %v", ring.Ranges(got), ring.Ranges(want))
		}
	}
	upTo := func(from, to int) []int {
		var ps []int
		for p := from; p < to; p++ {
			ps = append(ps, p)
		}
		return ps
	}
	s.admit(t0)
	listed(upTo(0, prepareWindow)...)
	s.finish(acquired{p: 0, err: ended}) // acquired or not, it leaves room
	listed(upTo(1, prepareWindow+1)...)
	s.finish(acquired{p: 100, err: ended}) // unlisted, the ring moved it on
	listed(upTo(1, prepareWindow+1)...)
	s.admit(t0.Add(prepareHold)) // all of them published a while ago
	listed(slices.DeleteFunc(upTo(1, 2*prepareWindow+2), func(p int) bool { return p == 100 })...)
	s.preparedCh <- 150
	s.finish(acquired{p: 150, err: ended})
	for len(s.preparedCh) > 0 { // as serve takes it next
		s.prepared(<-s.preparedCh)
	}
	if _, ok := s.mine[150]; ok || slices.Contains(s.unlisted, 150) {
		t.Errorf("partition 150 queued or published after its acquire ended")
	}
}

// Make-before-break: a joining node reads its partitions while their old
// owner still fires them, so however long the read takes, nothing stands
// still. Reads slowed to past the misfire threshold used to misfire every
// task that moved.
func TestEngine_JoinPreparesBeforeTheOldOwnerLetsGo(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	cfg := func(id string) func(*Config) {
		return func(c *Config) { c.NodeID = id; c.Partitions = 8; c.MisfireThreshold = 2 * time.Second }
	}
	a := startNode(t, c, "", log.handler, cfg("node-a"))
	tasks := ids("t", 40)
	for _, id := range tasks {
		putTask(t, a.e.Registry(), handlerTask(id, "* * * * * *"))
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask(tasks[0])) >= 2 })

	cliB := c.NewClient(t)
	injectFaults(cliB).slowRead.Store(int64(3 * time.Second))
	b := startNodeOn(t, cliB, "", log.handler, cfg("node-b"), noWait)
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return b.e.Ready() && b.e.Stats().PartitionsOwned > 0 })
	until := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(2500 * time.Millisecond)
	if repeats := everySecond(t, log, tasks, until); repeats > 0 {
		t.Errorf("%d fires repeated", repeats)
	}
	if m := a.e.Stats().Misfires + b.e.Stats().Misfires; m > 0 {
		t.Errorf("%d misfires: the moved partitions stood still while the new owner read them", m)
	}
	// Each phase is timed once per moved partition, on the node that went
	// through it: the slow read shows in prepare, not in the gap (take).
	moved := uint64(b.e.Stats().PartitionsOwned)
	ha, hb := a.e.Stats().HandOver, b.e.Stats().HandOver
	if ha["release"].Count != moved || hb["take"].Count != moved || hb["lock_wait"].Count != moved {
		t.Errorf("hand-overs timed: release %d on the old owner, lock_wait %d and take %d on the new; want %d each",
			ha["release"].Count, hb["lock_wait"].Count, hb["take"].Count, moved)
	}
	if p := hb["prepare"]; p.Count != moved || p.Sum < 3*float64(moved) {
		t.Errorf("prepare timed %d times for %.1f s in all; want %d, at least 3 s each", p.Count, p.Sum, moved)
	}
	if tk := hb["take"]; tk.Sum >= 3*float64(moved) {
		t.Errorf("take %.1f s for %d partitions: the slow read counted in the gap", tk.Sum, moved)
	}
}

// A joining node publishes the partitions it prepared in turns: hundreds
// prepared at once (a restart from the cache) were all released at once
// by their old owner, and taken together on the new one, each as slow as
// all of them. (The bound is TestEngine_PreparedArePublishedInTurns's: a
// slow machine lists more than prepareWindow once turns pass prepareHold.)
func TestEngine_JoinPublishesWhatItPreparedInTurns(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	// Late fires run, however slow the machine (the race detector beside
	// other tests stood partitions still for over the default 5 s): what
	// is checked is that none repeats and none is lost.
	cfg := func(id string) func(*Config) {
		return func(c *Config) { c.NodeID = id; c.Partitions = 1024; c.MisfireThreshold = time.Minute }
	}
	a := startNode(t, c, "", log.handler, cfg("node-a"))
	tasks := ids("t", 200)
	for _, id := range tasks {
		putTask(t, a.e.Registry(), handlerTask(id, "* * * * * *"))
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask(tasks[0])) >= 2 })

	// node-b's list, from before it starts.
	key := a.e.keys.prepared("node-b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	from, err := c.Client.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	watch := c.Client.Watch(ctx, key, clientv3.WithRev(from.Header.Revision+1))
	most := make(chan int, 1)
	go func() {
		n := 0
		for wr := range watch {
			for _, ev := range wr.Events {
				var ps []int
				if json.Unmarshal(ev.Kv.Value, &ps) == nil {
					n = max(n, len(ps))
				}
			}
		}
		most <- n
	}()
	b := startNode(t, c, "", log.handler, cfg("node-b"))
	etcdtest.WaitFor(t, 60*time.Second, func() bool { return a.e.Ready() && b.e.Ready() })
	until := time.Now().Truncate(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		for _, id := range tasks {
			if !slices.ContainsFunc(log.forTask(id), until.Equal) {
				return false
			}
		}
		return true
	})
	cancel()
	moved := b.e.Stats().PartitionsOwned
	if moved <= prepareWindow {
		t.Fatalf("node-b owns %d partitions; want more than %d, so that turns are needed", moved, prepareWindow)
	}
	if n := <-most; n == 0 || n > moved/2 {
		t.Errorf("node-b listed %d of its %d partitions at most at once; want 1 to half of them", n, moved)
	}
	if repeats := everySecond(t, log, tasks, until); repeats > 0 {
		t.Errorf("%d fires repeated", repeats)
	}
}

// The owner deletes a deleted task's execution history with it.
func TestEngine_DeletedTaskLosesItsHistory(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	a := startNode(t, c, "", log.handler, nil)
	putTask(t, a.e.Registry(), handlerTask("gone", "* * * * * *"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(history(t, a, "gone")) > 0 })
	if err := a.e.Registry().Delete(context.Background(), "gone"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(history(t, a, "gone")) == 0 })
}

// runOfADeletedTask puts tk on n, triggers it, and deletes it while h
// holds the trigger's run, which it returns. tk's schedule should not fire
// it (yearly, say), so that the trigger's is the one run.
func runOfADeletedTask(t *testing.T, n *testNode, h *holder, tk *task.Task) blocked {
	t.Helper()
	putTask(t, n.e.Registry(), tk)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(n, tk.ID) })
	if _, err := n.e.Registry().Trigger(context.Background(), tk.ID); err != nil {
		t.Fatal(err)
	}
	run := h.next(t)
	if err := n.e.Registry().Delete(context.Background(), tk.ID); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !owns(n, tk.ID) })
	return run
}

// It deletes too the record of a run under way at the delete, which the
// run writes when it ends, after the delete took the task's history.
func TestEngine_DeletedTaskLosesTheHistoryOfARunUnderWay(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	h := newHolder(t, "gone")
	a := startNode(t, c, "", h.handler, nil)
	t.Cleanup(h.open) // again: cleanups run last first

	run := runOfADeletedTask(t, a, h, handlerTask("gone", "0 0 0 1 1 *"))
	h.open()
	<-run.ended
	// The worker records the run before it counts it.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return a.e.Stats().Executions["ok"] > 0 })
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(history(t, a, "gone")) == 0 })
}

// So it does when that run ends while its node closes: the dispatch loop
// has stopped, and the pool's drain takes the run's completion (handOnLeft).
// The record the run wrote used to stay, and the deleted task kept a history
// on this node after it restarted.
func TestEngine_DeletedTaskLosesTheHistoryOfARunEndingWhileItsNodeCloses(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	h := newHolder(t, "gone")
	a := startNode(t, c, "", h.handler, nil)
	t.Cleanup(h.open) // again: cleanups run last first

	run := runOfADeletedTask(t, a, h, handlerTask("gone", "0 0 0 1 1 *"))
	closed := closeInBackground(a)
	select {
	case <-a.e.loopDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the dispatch loop did not stop within 30 s of Close")
	}
	h.open()
	<-run.ended
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	if a.e.Stats().Executions["ok"] == 0 {
		t.Fatal("the run was not counted: it did not end in the drain")
	}
	// Close has returned: what the store holds now is what a restart finds.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.store.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	hs, err := a.store.History("gone", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) > 0 {
		t.Errorf("the deleted task kept %d history records after its node closed: %+v", len(hs), hs)
	}
}

// A node that fenced itself (cut off from etcd past its deadline) and takes
// its partitions back under a new session, nobody having fired them in
// between, resumes from the hand-over it kept in memory: nothing repeats,
// even when the fence falls in the middle of a burst cut into batches. It
// used to resume from the last watermark etcd acknowledged, repeating up
// to the bounded lead of its own fires.
func TestEngine_FencedNodeTakingItsPartitionsBackRepeatsNothing(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	proxy := c.NewProxy(t)
	log := newFireLog()
	// Each second's burst is cut into batches and takes most of the
	// second, so that the fence falls in the middle of one.
	slow := func(ctx context.Context, f Fire) error {
		time.Sleep(5 * time.Millisecond)
		return log.handler(ctx, f)
	}
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", slow, func(c *Config) {
		c.Partitions = 4
		c.LeaseTTL = 2 * time.Second
		c.Workers, c.Queue, c.BatchSize = 2, 16, 8
	})
	tasks := ids("t", 300)
	for _, id := range tasks {
		putTask(t, a.e.Registry(), handlerTask(id, "* * * * * *"))
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask(tasks[0])) >= 2 })
	sess := a.e.sess.Load()
	proxy.Cut()
	etcdtest.WaitFor(t, 10*time.Second, sess.Fenced)
	proxy.Restore()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.sess.Load() != sess && a.e.Ready() })
	until := time.Now().Truncate(time.Second).Add(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		got := log.forTask(tasks[0])
		return len(got) > 0 && got[len(got)-1].After(until)
	})
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("%d fires repeated after the node took its partitions back: %v", len(d), d[:min(5, len(d))])
	}
	for _, id := range tasks {
		noGapAllowingLead(t, log, id)
	}
}

// A node waiting for a partition's lock and cut off from etcd still
// closes: waiting for the lock leaves nothing to clean up without a
// deadline. (Mutex.Lock cleaned its queued key up with no deadline, so the
// wait, and Close with it, hung for as long as etcd was out of reach.)
func TestEngine_CloseWhileWaitingForALockAndCutOff(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	// Another session holds partition 0's lock and never lets go.
	lease, err := c.Client.Grant(context.Background(), 60)
	if err != nil {
		t.Fatal(err)
	}
	k := newKeys(DefaultPrefix)
	if _, err := c.Client.Put(context.Background(), fmt.Sprintf("%s/%x", k.lock(0), int64(lease.ID)), "", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	proxy := c.NewProxy(t)
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", nil, func(c *Config) {
		c.Partitions = 2
		c.DrainTimeout = time.Second
	}, noWait)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return a.e.Stats().PartitionsOwned == 1 })
	proxy.Cut()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = a.e.Close()
	}()
	select {
	case <-closed:
	case <-time.After(40 * time.Second):
		a.e = nil // the cleanup would wait for this Close
		t.Fatal("Close hung while the node waited for a lock, cut off from etcd")
	}
	proxy.Restore()
	a.e = nil // closed: the cleanup only closes its store
	_ = a.store.Close()
}

// Done is closed once Close returned, not before.
func TestEngine_DoneAfterClose(t *testing.T) {
	c := etcdtest.Start(t)
	a := startNode(t, c, "", nil, nil)
	e := a.e
	select {
	case <-e.Done():
		t.Fatal("Done before Close")
	default:
	}
	a.stop(t)
	select {
	case <-e.Done():
	default:
		t.Fatal("Done still open after Close")
	}
}

// TestEngine_CollectKeepsAWatermarkARestoredCheckpointNames: collection
// reads the checkpoints, then deletes the watermarks no checkpoint names.
// A failed acquire that puts back, in between, a checkpoint naming a dead
// session must keep that session's watermark: its successor resumes from
// it.
func TestEngine_CollectKeepsAWatermarkARestoredCheckpointNames(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	ctx := context.Background()
	// The node collects once itself, when it is first ready: the test's
	// watermark must come after that collection, which would delete it.
	k := newKeys(DefaultPrefix)
	before := k.watermark("gone-before", "2f")
	if _, err := c.Client.Put(ctx, before, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		t.Fatal(err)
	}
	n := startNodeOn(t, cli, "", nil, nil)
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		resp, err := c.Client.Get(ctx, before)
		return err == nil && len(resp.Kvs) == 0
	})
	wm := k.watermark("gone", "1f")
	if _, err := c.Client.Put(ctx, wm, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		t.Fatal(err)
	}
	restored, _ := json.Marshal(checkpoint{Node: "gone", Session: "1f", Watermark: time.Now().UTC()})
	hook := func(key string) {
		if key == k.checkpoints() {
			faults.afterGet.Store(nil)
			if _, err := c.Client.Put(ctx, k.checkpoint(99), string(restored)); err != nil {
				t.Error(err)
			}
		}
	}
	faults.afterGet.Store(&hook)
	n.e.collectWatermarks(ctx)
	resp, err := c.Client.Get(ctx, wm)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatal("the watermark of a session a restored checkpoint names was collected")
	}
	// Read again with the checkpoint in place, it still stays; once the
	// checkpoint is released, it goes.
	n.e.collectWatermarks(ctx)
	if resp, _ := c.Client.Get(ctx, wm); len(resp.Kvs) == 0 {
		t.Fatal("collected although a checkpoint names it")
	}
	released, _ := json.Marshal(checkpoint{Node: "gone", Session: "1f", Released: true, Watermark: time.Now().UTC()})
	if _, err := c.Client.Put(ctx, k.checkpoint(99), string(released)); err != nil {
		t.Fatal(err)
	}
	// A collection gives up when any checkpoint changed while it ran (the
	// node names its own sessions meanwhile): one of a few goes through.
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		n.e.collectWatermarks(ctx)
		resp, err := c.Client.Get(ctx, wm)
		return err == nil && len(resp.Kvs) == 0
	})
}

// The node's collection of dead sessions' watermarks is tried again when
// a checkpoint changed while it ran, as other nodes' acquires and
// releases make them: tried once, the keys stayed until the next session.
func TestEngine_CollectionThatACheckpointsChangeBeatIsTriedAgain(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	ctx := context.Background()
	k := newKeys(DefaultPrefix)
	gone := k.watermark("gone", "2f")
	if _, err := c.Client.Put(ctx, gone, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		t.Fatal(err)
	}
	released, _ := json.Marshal(checkpoint{Node: "other", Session: "3f", Released: true, Watermark: time.Now().UTC()})
	hook := func(key string) {
		if key == k.checkpoints() {
			faults.afterGet.Store(nil)
			if _, err := c.Client.Put(ctx, k.checkpoint(99), string(released)); err != nil {
				t.Error(err)
			}
		}
	}
	faults.afterGet.Store(&hook)
	startNodeOn(t, cli, "", nil, nil)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return faults.afterGet.Load() == nil })
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		resp, err := c.Client.Get(ctx, gone)
		return err == nil && len(resp.Kvs) == 0
	})
}

// loadAfter loads ids (every second, prof) into a new loop at now as
// acquire does after a release: resuming after hand's mark, each task of
// hand.after after its fire, then running hand's pending fires.
func loadAfter(t *testing.T, now time.Time, tweak func(*Config), prof *profile, ids []string, hand *handOver) *testLoop {
	next := newTestLoop(t, now, tweak)
	var defs []taskDef
	for _, id := range ids {
		h, _ := next.scheds.Intern("* * * * * *", "UTC", id)
		defs = append(defs, taskDef{id: id, hash: xxhash.Sum64String(id), part: 0, sched: h, prof: prof})
	}
	next.handle(&loadCmd{part: 0, resume: hand.mark, handed: handedFrom(hand.after, checkpoint{}), defs: defs, first: true, done: make(chan struct{})})
	next.handle(&takeOverCmd{part: 0, fires: hand.pending})
	return next
}

// A release past the 2000-fire cap lowers its mark so that the next owner
// repeats the queued fires it could not list. When those are misfires'
// catch-up fires, fired past the wheel's time, no task may then resume
// after its catch-up fire: that one ran nowhere and is listed nowhere.
func TestLoop_ReleasePastTheCapResumesNoTaskAfterItsCatchUp(t *testing.T) {
	const n = maxHandOver + 100
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tweak := func(cfg *Config) { cfg.Queue, cfg.BatchSize = 4*n, 4*n }
	tl := newTestLoop(t, base.Add(-time.Second/2), tweak)
	tl.acked.at.Store(base.UnixNano() - int64(tl.cfg.Lead)) // the lead stops the wheel at 12:00:00
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", ids("q", n)...)
	tl.clock.Advance(30*time.Second + time.Second/2) // the 12:00:00 timers misfire: fire_once fires 12:00:30
	tl.dispatchAll()
	rel := tl.releaseNow(0)
	tl.handOverQueued(rel.hand, unrunAll) // the workers did not take them
	hand := rel.hand[0]

	catchUp := base.Add(30 * time.Second)
	next := loadAfter(t, catchUp.Add(time.Second/4), tweak, prof, ids("q", n), hand)
	next.dispatchAll()
	listed := map[string]bool{}
	for _, f := range hand.pending {
		listed[f.ID] = listed[f.ID] || f.At.Equal(catchUp)
	}
	missed := 0
	for _, id := range ids("q", n) {
		if _, r, _ := next.tab.lookup(id); !listed[id] && !(r.lastFire == catchUp.UnixNano() && r.fires > 0) {
			missed++
		}
	}
	if missed > 0 {
		t.Errorf("%d tasks' catch-up fire at %s ran nowhere (mark %s, %d pending, %d after)", missed, catchUp.Format(time.TimeOnly),
			time.Unix(0, hand.mark).UTC().Format(time.StampNano), len(hand.pending), len(hand.after))
	}
}

// A task fired past the mark resumes after that fire on the next owner,
// jitter or not: the release time is what a resume point compares.
func TestLoop_ReleaseHandsOverAJitteredCatchUp(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), nil)
	tl.acked.at.Store(base.UnixNano() - int64(tl.cfg.Lead)) // the lead stops the wheel at 12:00:00
	prof := noopProfile(task.MisfireFireOnce)
	prof.jitter = 900 * time.Millisecond
	var jittered []string
	for _, id := range ids("jit", 50) { // those whose 12:00:30 is released late in its second
		if Delay(id, base.Add(30*time.Second).UnixNano(), 900) > 100*time.Millisecond {
			jittered = append(jittered, id)
		}
	}
	tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", jittered...)
	tl.clock.Advance(30*time.Second + 950*time.Millisecond) // past every 12:00:30 release: fire_once fires 12:00:30
	tl.dispatchAll()
	hand := tl.releaseNow(0).hand[0]
	if len(hand.after) != len(jittered) {
		t.Fatalf("%d of %d tasks listed as fired past the mark", len(hand.after), len(jittered))
	}
	next := loadAfter(t, base.Add(31*time.Second), nil, prof, jittered, hand)
	for _, id := range jittered {
		if _, r, _ := next.tab.lookup(id); r.next <= base.Add(30*time.Second).UnixNano() {
			t.Errorf("%s resumes at %s, at or before its catch-up fire: it fires again", id, time.Unix(0, r.next).UTC().Format(time.TimeOnly))
		}
	}
}

// An after entry does not hide a one-shot: whether it fires depends on
// when it was written against the mark, and the entry is for an earlier
// definition's fire.
func TestLoop_AfterLeavesAOneShotToItsWrittenTime(t *testing.T) {
	now := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, now, nil)
	at := now.Add(-10 * time.Second)
	h, _ := tl.scheds.Intern(atSchedule, "UTC", "x")
	prof := noopProfile(task.MisfireFireOnce)
	prof.win = &window{s: tl.scheds.Get(h), from: at.UnixNano(), to: at.UnixNano(), end: task.EndedAt, once: true, written: now.Add(-time.Second).UnixNano()}
	tl.handle(&loadCmd{part: 0, resume: now.Add(-20 * time.Second).UnixNano(), first: true, done: make(chan struct{}),
		handed: handedTo{after: map[string]int64{"moved": now.Add(-time.Second / 2).UnixNano()}},
		defs:   []taskDef{{id: "moved", hash: xxhash.Sum64String("moved"), part: 0, sched: h, prof: prof}}})
	tl.clock.Advance(time.Second)
	tl.dispatch()
	if got := tl.dispatched(0); len(got) != 1 {
		t.Errorf("dispatched %v, want the one-shot written after the mark", got)
	}
}

// A task handed over as fired past the mark, released again before the new
// owner's wheel reaches that fire (its clock behind the first owner's, or
// its lead), is handed on as such: the third owner does not fire it again.
func TestLoop_AfterIsHandedOnByASecondRelease(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), nil)
	tl.acked.at.Store(base.UnixNano() - int64(tl.cfg.Lead)) // the lead stops the wheel at 12:00:00
	prof := noopProfile(task.MisfireFireOnce)
	rs := ids("r", 5)
	tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", rs...)
	tl.clock.Advance(30*time.Second + time.Second/2) // fire_once fires 12:00:30
	tl.dispatchAll()
	first := tl.releaseNow(0).hand[0]

	second := loadAfter(t, base.Add(29*time.Second+800*time.Millisecond), nil, prof, rs, first)
	hand := second.releaseNow(0).hand[0]
	if len(hand.after) != len(rs) {
		t.Fatalf("the second release lists %d of %d tasks as fired past its mark (%s)", len(hand.after), len(rs),
			time.Unix(0, hand.mark).UTC().Format(time.StampMilli))
	}
	third := loadAfter(t, base.Add(31*time.Second), nil, prof, rs, hand)
	for _, id := range rs {
		if _, r, _ := third.tab.lookup(id); r.next <= base.Add(30*time.Second).UnixNano() {
			t.Errorf("%s resumes at %s on the third owner: its 12:00:30 fires again", id, time.Unix(0, r.next).UTC().Format(time.TimeOnly))
		}
	}
}

// A release etcd refuses stays stuck with the node watermark held at its
// mark; past the lease TTL the node ends its session and successors resume
// from the held watermark. The release had dropped the partition's queued
// fires from the queue (handOverQueued, listed only in the refused
// checkpoint), and workers pass dropped jobs as taken, so the watermark
// reached the mark: the successor resumed after fires that never ran. The
// watermark now carries a resume point for that partition before them
// (holds). Here node-a's only worker is held while tick@2 of both
// partitions waits in its queue; node-b joins, node-a's release of the
// partition that moves is refused, tick@2 of it is dropped as handed over,
// the worker frees, and after the TTL node-a ends its session. node-b takes
// the partition over and must run tick@2, once.
func TestEngine_StuckReleasePastTheTTLRunsTheFiresItDroppedFromTheQueue(t *testing.T) {
	t.Parallel()
	c, clock := limitsStart(t)
	log := &callLog{}
	h := newHolder(t, "slow")
	handler := log.handler(h.handler)
	cliA := c.NewClient(t)
	faults := injectFaults(cliA)
	a := startNodeOn(t, cliA, "", handler, limitsNode(clock, time.Hour, "node-a", func(cfg *Config) {
		cfg.Workers, cfg.DrainTimeout = 1, time.Second
		quietNode(cfg)
	}))
	ticks := map[int]string{}
	for i := 0; len(ticks) < limitsParts; i++ {
		id := fmt.Sprintf("tick-%d", i)
		if _, ok := ticks[partOf(id)]; !ok {
			ticks[partOf(id)] = id
		}
	}
	putTask(t, a.e.Registry(), handlerTask("slow", "0 0 0 1 1 *"))
	for _, id := range ticks {
		putTask(t, a.e.Registry(), handlerTask(id, "* * * * * *"))
		waitNext(t, a, id, limitsAt(1))
	}
	clock.Advance(time.Second)
	for p, id := range ticks {
		etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt(id, limitsAt(1)) })
		waitNamed(t, c, a, p)
	}

	if _, err := a.e.Registry().Trigger(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	h.next(t) // node-a's only worker is busy
	clock.Advance(time.Second)
	for _, id := range ticks {
		waitNext(t, a, id, limitsAt(3)) // tick@2 is queued behind the held worker
	}

	var mu sync.Mutex
	moved := -1
	attempted := make(chan struct{})
	var once sync.Once
	faults.puts(func(key, value string) bool {
		if !releasedCheckpoints(key, value) {
			return false
		}
		once.Do(func() {
			p, _ := strconv.Atoi(key[strings.LastIndex(key, "/")+1:])
			mu.Lock()
			moved = p
			mu.Unlock()
			close(attempted)
		})
		return true
	})
	sessA := a.e.sess.Load()
	b := startNodeOn(t, c.Client, "", handler, limitsNode(clock, time.Hour, "node-b"), noWait)
	select {
	case <-attempted:
	case <-time.After(30 * time.Second):
		t.Fatal("node-a attempted no release")
	}
	h.open() // the worker takes the dropped job: the watermark passes it
	etcdtest.WaitFor(t, 20*time.Second, sessA.Fenced)
	held := "none"
	if r, err := c.Client.Get(context.Background(), newKeys("").watermark("node-a", sessionID(sessA))); err == nil && len(r.Kvs) > 0 {
		held = string(r.Kvs[0].Value)
	}
	faults.puts(nil)
	mu.Lock()
	id := ticks[moved]
	mu.Unlock()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(b, id) })
	clock.Advance(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt(id, limitsAt(3)) })
	stopAndDrain(t, b, a)
	if got := runsAt(log, id, limitsAt(2)); len(got) != 1 {
		t.Errorf("%s@12:00:02 (queued on node-a when its release got stuck) ran on %v; want once; node-a's watermark in etcd: %s",
			id, got, held)
	}
	if got := runsAt(log, id, limitsAt(1)); len(got) != 1 {
		t.Errorf("%s@12:00:01 ran on %v; want once: the resume point is before tick@2 only", id, got)
	}
}

// A watermark value is the time alone, as before, until a release drops
// fires from the queue; then it carries that partition's resume point,
// which only that partition's successor takes, and only when earlier.
func TestWatermark_ValueCarriesResumePoints(t *testing.T) {
	w := time.Date(2026, 3, 1, 12, 0, 10, 0, time.UTC).UnixNano()
	r := w - int64(3*time.Second)
	for _, tc := range []struct {
		value string
		part  int
		want  int64
		ok    bool
	}{
		{encodeWatermark(w, nil, nil, 0, carriedLists{}), 7, w, true},
		{"2026-03-01T12:00:10Z", 7, w, true}, // as written before resume points
		{encodeWatermark(w, map[int]int64{7: r}, nil, 0, carriedLists{}), 7, r, true},
		{encodeWatermark(w, map[int]int64{7: r}, nil, 0, carriedLists{}), 8, w, true},
		{encodeWatermark(w, map[int]int64{7: w + 1}, nil, 0, carriedLists{}), 7, w, true},
		{`{"partitions":{"7":"2026-03-01T12:00:07Z"}}`, 7, 0, false},
		{"garbage", 7, 0, false},
	} {
		v, ok := decodeWatermark([]byte(tc.value))
		if got := v.resume(tc.part); ok != tc.ok || ok && got != tc.want {
			t.Errorf("decodeWatermark(%s) resumes %d at %d, %v; want %d, %v", tc.value, tc.part, got, ok, tc.want, tc.ok)
		}
	}
}

// A watermark value carries the revisions up to which the partitions'
// changes were armed, those that changed since the last value that
// carried them all (its etcd revision named), and a node of the version
// before them reads its time and resume points as ever, as this one reads
// that node's values (no revisions: updated_at decides).
func TestWatermark_ValueCarriesAppliedRevisions(t *testing.T) {
	w := time.Date(2026, 3, 1, 12, 0, 10, 0, time.UTC).UnixNano()
	r := w - int64(3*time.Second)
	// The value as the version before applied revisions read it.
	type before struct {
		At         time.Time         `json:"at"`
		Partitions map[int]time.Time `json:"partitions"`
	}
	for _, tc := range []struct {
		value   string
		part    int
		applied int64 // in the value itself
		base    int64
	}{
		{encodeWatermark(w, nil, map[int]int64{7: 100, 8: 90}, 0, carriedLists{}), 7, 100, 0},
		{encodeWatermark(w, map[int]int64{7: r}, map[int]int64{7: 100}, 0, carriedLists{}), 7, 100, 0},
		{encodeWatermark(w, nil, map[int]int64{8: 120}, 55, carriedLists{}), 7, 0, 55},
		{encodeWatermark(w, nil, map[int]int64{8: 120}, 55, carriedLists{}), 8, 120, 55},
		{encodeWatermark(w, nil, map[int]int64{7: 0}, 55, carriedLists{}), 7, 0, 55}, // no longer armed
		{`{"at":"2026-03-01T12:00:10Z","partitions":{"7":"2026-03-01T12:00:07Z"}}`, 7, 0, 0},
		{"2026-03-01T12:00:10Z", 7, 0, 0},
	} {
		v, ok := decodeWatermark([]byte(tc.value))
		if !ok || v.At.UnixNano() != w || v.Applied[tc.part] != tc.applied || v.Base != tc.base {
			t.Errorf("decodeWatermark(%s) = %+v, %v; want partition %d applied %d, base %d", tc.value, v, ok, tc.part, tc.applied, tc.base)
		}
		if tc.value[0] != '{' {
			continue
		}
		var old before
		if err := json.Unmarshal([]byte(tc.value), &old); err != nil || !old.At.Equal(v.At) || len(old.Partitions) != len(v.Partitions) {
			t.Errorf("the version before reads %s as %+v, %v; want at %v, resume points %v", tc.value, old, err, v.At, v.Partitions)
		}
	}
}

// An etcd slower than the lead (its watermark writes answered in 1.5 s)
// slows firing, but does not stop it: a watermark write given up at the
// lead was never acknowledged, so dispatch stood at the lead for as long
// as etcd stayed slow, while the session, its keep-alives answered, did
// not end: the node neither fired nor fenced. Waited for, each answer
// moves dispatch on by the lead, 1 s every 1.5 s: firing falls behind, and
// the misfire policy folds what falls past the threshold, but nothing
// runs twice.
func TestEngine_EtcdSlowerThanTheLeadStillFires(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	logs := &logbuf.Buffer{}
	n := startNodeOn(t, cli, "", log.handler, func(cfg *Config) {
		cfg.LeaseTTL = 10 * time.Second
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	putTask(t, n.e.Registry(), handlerTask("tick", "* * * * * *"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("tick")) >= 2 })

	faults.slowsPuts(func(key, _ string) bool { return strings.Contains(key, "/watermarks/") }, 1500*time.Millisecond)
	last := func() time.Time { fs := log.forTask("tick"); return fs[len(fs)-1] }
	from := last()
	// 6 s of fires in at most 15 s: before, none came past the first
	// second of the slow writes.
	etcdtest.WaitFor(t, 15*time.Second, func() bool { return !last().Before(from.Add(6 * time.Second)) })
	faults.slowsPuts(nil, 0)
	if n.e.sess.Load().Fenced() {
		t.Error("the session ended: etcd was slow, not gone")
	}
	if !strings.Contains(logs.String(), "etcd took longer than the lead to record the node watermark") {
		t.Errorf("the log does not say why fires run late:\n%s", logs)
	}
	stopAndDrain(t, n)
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("fires repeated: %v", d)
	}
}

// A session that ends while its watermark write waits on a slow etcd
// (longer than the lead, as writes are now waited for) rejoins: the old
// session's write, answered after the new session began, neither ends the
// new session (its lease check fails on the revoked lease, and Lost is
// the old session's) nor lets a fire repeat, and the node fires on once
// etcd is quick again.
func TestEngine_SessionEndedDuringASlowWatermarkWriteRejoins(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	n := startNodeOn(t, cli, "", log.handler, func(c *Config) {
		c.Partitions = 1
		c.LeaseTTL = 10 * time.Second
	})
	putTask(t, n.e.Registry(), handlerTask("tick", "* * * * * *"))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("tick")) >= 2 })
	old := n.e.sess.Load()
	acked := n.e.acked.at.Load()
	faults.slowsPuts(func(key, _ string) bool { return strings.Contains(key, "/watermarks/") }, 3*time.Second)
	time.Sleep(500 * time.Millisecond) // a write of the old session waits
	old.Lost()
	etcdtest.WaitFor(t, 20*time.Second, func() bool { s := n.e.sess.Load(); return s != old && !s.Fenced() })
	faults.slowsPuts(nil, 0)
	etcdtest.WaitFor(t, 20*time.Second, n.e.Ready)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return n.e.acked.at.Load() > acked })
	from := time.Now()
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		fs := log.forTask("tick")
		return fs[len(fs)-1].After(from.Add(time.Second))
	})
	if s := n.e.sess.Load(); s == old || s.Fenced() {
		t.Error("the new session ended")
	}
	stopAndDrain(t, n)
	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("fires repeated: %v", d)
	}
}

// A fire handed over unrun (queued on the previous owner at its release)
// of a task paused by the time the next owner loads it is skipped there,
// recorded so, as a retry due while its task is paused is: the pause was
// written after the release, or before it but not yet seen by the previous
// owner. The next owner ran it: a paused task's schedule fired once more.
// A backfill's fire handed over so still runs (a backfill runs whole).
// The fire skipped was the paused task's last (delete_after_fire): its
// resume deletes it.
func TestLoop_HandedOverFireOfAPausedTaskIsSkipped(t *testing.T) {
	now := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, now, nil)
	h := tl.everySecond(t)
	at := now.Add(-time.Second)
	prof := noopProfile(task.MisfireFireOnce)
	last := noopProfile(task.MisfireFireOnce) // at is its last time
	last.key, last.deleteAfter = "noop/delete-after", true
	last.win = &window{s: tl.scheds.Get(h), from: at.UnixNano(), to: at.UnixNano(), end: task.EndedMaxFires}
	def := func(id string, paused bool) taskDef {
		if id == "paused" {
			return taskDef{id: id, hash: xxhash.Sum64String(id), part: 0, sched: h, prof: last, paused: paused}
		}
		return taskDef{id: id, hash: xxhash.Sum64String(id), part: 0, sched: h, prof: prof}
	}
	tl.handle(&loadCmd{part: 0, resume: now.UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def("paused", true), def("running", false)}})
	tl.handle(&takeOverCmd{part: 0, fires: []pendingFire{{ID: "paused", At: at}, {ID: "running", At: at}}})
	want := []string{fmt.Sprintf("running@%d", at.UnixMilli())}
	if got := tl.dispatched(0); !slices.Equal(got, want) {
		t.Errorf("dispatched %v, want %v: the paused task's fire handed over is skipped", got, want)
	}
	if _, r, _ := tl.tab.lookup("paused"); r.skipped != 1 || r.running != 0 {
		t.Errorf("the paused task's record: %d skipped, %d running; want 1, 0", r.skipped, r.running)
	}
	if n := len(tl.ended); n != 0 {
		t.Fatalf("%d deletions queued while the task is paused, want none", n)
	}
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def("paused", false)}})
	if n := len(tl.ended); n != 1 {
		t.Errorf("%d deletions queued at the resume of the task whose last fire was skipped, want 1", n)
	}
}

// An acquire's hold, written before its session may be named, hands on
// what the released checkpoint before it handed over: should the node
// crash before naming its session, its successor takes the failing
// tasks' health and the paused tasks whose end waits for their resume
// from the hold. The hold listed only the fires, and those went with the
// crash of a node whose predecessor had left gracefully.
func TestHandedFrom_AnAcquireThatDidNotCompleteHandsOnWhatItWasHanded(t *testing.T) {
	failedAt := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	released := (&handOver{mark: failedAt.UnixNano(), applied: 42,
		health:   []handedHealth{{ID: "flaky", Fails: 3, FailedAt: failedAt, Error: "boom"}},
		endWaits: []string{"once"}}).encode("node-a")
	hold, err := json.Marshal(holdCheckpoint("node-b", failedAt.UnixNano(), handingCheckpoint(released), nil, nil, 42))
	if err != nil {
		t.Fatal(err)
	}
	h := handedFrom(nil, handingCheckpoint(hold))
	if e, ok := h.health["flaky"]; !ok || e.Fails != 3 || e.Error != "boom" {
		t.Errorf("health handed on by the hold: %+v, want flaky's 3 failures", h.health)
	}
	if !h.endWaits["once"] {
		t.Errorf("ends handed on by the hold: %v, want once", h.endWaits)
	}
	var named checkpoint
	if err := json.Unmarshal(hold, &named); err != nil {
		t.Fatal(err)
	}
	named.Session = "s1" // the acquire completed: its own session's watermark decides
	b, err := json.Marshal(named)
	if err != nil {
		t.Fatal(err)
	}
	if h := handedFrom(nil, handingCheckpoint(b)); h.health != nil || h.endWaits != nil {
		t.Errorf("a checkpoint that names its session handed on %+v", h)
	}
}

// A node that fenced takes its partition back from the hand-over its
// session kept as from the release it would have written: its acquire's
// hold hands on that hand-over's health and the paused tasks whose end
// waits for their resume, judged by its applied, should the node crash
// before naming its new session.
func TestEngine_ResumeFromAFencedSessionsHandOverHandsOnWhatItKept(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, cli := resumingEngine(t, base)
	e.keepEnded("s1", map[int]*handOver{0: {mark: base.UnixNano(), applied: 42,
		health:   []handedHealth{{ID: "flaky", Fails: 3, FailedAt: base, Error: "boom"}},
		endWaits: []string{"once"}}})
	named, _ := json.Marshal(checkpoint{Node: "node-a", Session: "s1", Watermark: base.Add(-time.Minute)})
	putKey(t, cli, e.keys.checkpoint(0), string(named))
	res, err := e.resume(context.Background(), 0, newDeadMarks())
	if err != nil {
		t.Fatal(err)
	}
	hold, err := json.Marshal(holdCheckpoint("node-a", res.w, res.handing, res.pending, res.after, res.applied))
	if err != nil {
		t.Fatal(err)
	}
	h := handedFrom(nil, handingCheckpoint(hold))
	if e, ok := h.health["flaky"]; !ok || e.Fails != 3 || e.Error != "boom" {
		t.Errorf("health handed on by the hold: %+v, want flaky's 3 failures", h.health)
	}
	if !h.endWaits["once"] || h.endWaitsApplied != 42 {
		t.Errorf("ends handed on by the hold: %v at %d, want once at 42", h.endWaits, h.endWaitsApplied)
	}
}
