package engine

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"
)

// A run elsewhere (a marker a former owner wrote at its release) counts as
// the task's run in flight: buffer_one holds its fire until the marker
// goes, replace deletes the marker and fires at once, and a release of the
// partition does not wait for it (it is not this node's: its marker stays
// for the next owner).
func TestLoop_RunElsewhereKeepsFiresApartAndIsNotWaitedFor(t *testing.T) {
	tl := newTestLoop(t, time.Date(2026, 1, 1, 12, 0, 0, 500e6, time.UTC), nil)
	var unmarked []string
	tl.unmark = func(runs []elsewhereRun) {
		for _, r := range runs {
			unmarked = append(unmarked, r.key)
		}
	}
	load := func(part int, id string, p task.ConcurrencyPolicy, marker string) {
		t.Helper()
		prof := noopProfile(task.MisfireFireOnce)
		prof.key, prof.concurrency = "elsewhere/"+string(p), p
		h, err := tl.scheds.Intern("* * * * * *", "UTC", id)
		if err != nil {
			t.Fatal(err)
		}
		tl.handle(&loadCmd{part: part, resume: tl.clock.Now().UnixNano(), first: true, done: make(chan struct{}),
			handed: handedTo{elsewhere: map[string][]elsewhereRun{id: {{key: marker}}}},
			defs:   []taskDef{{id: id, hash: xxhash.Sum64String(id), part: part, sched: h, prof: prof}}})
	}
	load(0, "buffered", task.ConcurrencyBufferOne, "m/buffered")
	load(1, "replaced", task.ConcurrencyReplace, "m/replaced")
	tl.clock.Advance(time.Second)
	tl.dispatch()
	if got := tl.dispatched(0); len(got) != 0 {
		t.Errorf("buffer_one fired %v beside its run elsewhere", got)
	}
	if n := tl.stats.runsElsewhere.Load(); n != 1 {
		t.Errorf("%d runs elsewhere counted once replace's was canceled, want buffered's", n)
	}
	if got, want := tl.dispatched(1), []string{"replaced@1767268801000"}; !slices.Equal(got, want) {
		t.Errorf("replace dispatched %v, want %v", got, want)
	}
	if !slices.Equal(unmarked, []string{"m/replaced"}) {
		t.Errorf("replace deleted markers %v, want its run elsewhere's", unmarked)
	}
	// A marker gone that the loop does not hold (another task's, or one
	// replaced) changes nothing.
	tl.handle(&elsewhereEndedCmd{part: 1, id: "replaced", key: "m/replaced"})
	tl.handle(&elsewhereEndedCmd{part: 0, id: "buffered", key: "m/other"})
	if got := tl.dispatched(0); len(got) != 0 {
		t.Errorf("buffer_one fired %v on another marker's end", got)
	}
	tl.handle(&elsewhereEndedCmd{part: 0, id: "buffered", key: "m/buffered"})
	if got, want := tl.dispatched(0), []string{"buffered@1767268801000"}; !slices.Equal(got, want) {
		t.Errorf("buffer_one dispatched %v once its run elsewhere ended, want %v", got, want)
	}

	load(0, "forbid", task.ConcurrencyForbid, "m/forbid")
	if n := tl.stats.runsElsewhere.Load(); n != 1 {
		t.Errorf("%d runs elsewhere counted, want forbid's", n)
	}
	// buffered's own fire, dispatched, is this node's to wait for; forbid's
	// run elsewhere is not.
	if rel := tl.releaseNow(0); rel.running == nil || rel.running.n != 1 || tl.pool.leaving.len() != 1 {
		t.Errorf("the release waits for %+v of %d tasks, want buffered's one attempt", rel.running, tl.pool.leaving.len())
	}
	if n := tl.stats.runsElsewhere.Load(); n != 0 {
		t.Errorf("%d runs elsewhere counted after the release, want none", n)
	}
}

// A replace fire marks replaced, rather than deletes, the marker of a run
// elsewhere that holds fires of the task's backfill: they run on outside
// the policy, and count against the backfill's concurrency until the
// marker goes; the run no longer counts as the task's. One read replaced
// counts only its backfill's fires too, and a replace fire leaves it.
func TestLoop_ReplaceKeepsTheBackfillCountOfARunElsewhere(t *testing.T) {
	tl := newTestLoop(t, time.Date(2026, 1, 1, 12, 0, 0, 500e6, time.UTC), nil)
	var unmarked []elsewhereRun
	tl.unmark = func(runs []elsewhereRun) { unmarked = append(unmarked, runs...) }
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.concurrency = "elsewhere/replace", task.ConcurrencyReplace
	load := func(part int, id string, runs ...elsewhereRun) {
		t.Helper()
		h, err := tl.scheds.Intern("* * * * * *", "UTC", id)
		if err != nil {
			t.Fatal(err)
		}
		tl.handle(&loadCmd{part: part, resume: tl.clock.Now().UnixNano(), first: true, done: make(chan struct{}),
			handed: handedTo{elsewhere: map[string][]elsewhereRun{id: runs}},
			defs:   []taskDef{{id: id, hash: xxhash.Sum64String(id), part: part, sched: h, prof: prof}}})
	}
	load(0, "mixed", elsewhereRun{key: "m/plain"}, elsewhereRun{key: "m/backfill", node: "node-a", backfill: 2})
	load(1, "read", elsewhereRun{key: "m/read", backfill: 1, replaced: true})
	counts := func(id string) (running, backfill int) {
		i, r, ok := tl.tab.lookup(id)
		if !ok {
			t.Fatalf("%s not loaded", id)
		}
		return tl.runningHere(i, r), tl.backfillElsewhere(i)
	}
	if _, n := counts("read"); n != 1 || tl.stats.runsElsewhere.Load() != 2 {
		t.Errorf("a marker read replaced: %d fires of its backfill, %d runs elsewhere; want 1, and mixed's 2", n, tl.stats.runsElsewhere.Load())
	}
	tl.clock.Advance(time.Second)
	tl.dispatch()
	for p, want := range []string{"mixed@1767268801000", "read@1767268801000"} {
		if got := tl.dispatched(p); !slices.Equal(got, []string{want}) {
			t.Errorf("partition %d dispatched %v, want %v beside the runs elsewhere", p, got, want)
		}
	}
	want := []elsewhereRun{{key: "m/plain"}, {key: "m/backfill", node: "node-a", backfill: 2, replaced: true}}
	if !slices.Equal(unmarked, want) {
		t.Errorf("the replace fires unmarked %+v, want %+v: the plain run's deleted, the other marked replaced", unmarked, want)
	}
	for id, want := range map[string]int{"mixed": 2, "read": 1} {
		if running, n := counts(id); running != 1 || n != want {
			t.Errorf("%s after the replace: %d runs here, %d fires of its backfill elsewhere; want its fire, and %d", id, running, n, want)
		}
	}
	if n := tl.stats.runsElsewhere.Load(); n != 0 {
		t.Errorf("%d runs elsewhere counted after the replace, want none", n)
	}
	tl.handle(&elsewhereEndedCmd{part: 0, id: "mixed", key: "m/backfill"})
	if running, n := counts("mixed"); running != 1 || n != 0 {
		t.Errorf("once the replaced marker went: %d runs here, %d fires of the backfill elsewhere; want 1 and 0", running, n)
	}
}

// markedAtClose is node-a closing while its runs of buffered (buffer_one)
// and slow (allow) of 12:00:01 go on, held, past the release, and node-b,
// which took the partitions over, with buffered's fire of 12:00:02
// waiting behind the run's marker.
type markedAtClose struct {
	hx, hy *holder // buffered's calls, slow's
	run    blocked // node-a's run of buffered
	faults *faultKV
	closed <-chan error
}

func startMarkedAtClose(t *testing.T) *markedAtClose {
	c, clock := limitsStart(t)
	m := &markedAtClose{hx: newHolder(t), hy: newHolder(t)}
	handler := func(ctx context.Context, f Fire) error {
		if m.hx.ids[f.TaskID] {
			return m.hx.handler(ctx, f)
		}
		return m.hy.handler(ctx, f)
	}
	start := func(id string, cli *clientv3.Client) *testNode {
		n := startNodeOn(t, cli, "", handler, limitsNode(clock, time.Hour, id, func(cfg *Config) {
			cfg.Partitions = limitsPolicyParts
			cfg.DrainTimeout = time.Minute // slow's held run outlasts the test's waits
		}))
		t.Cleanup(m.hx.open) // again: cleanups run last first
		t.Cleanup(m.hy.open)
		return n
	}
	cli := c.NewClient(t)
	m.faults = injectFaults(cli)
	a, b := start("node-a", cli), start("node-b", c.NewClient(t))
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return a.e.Stats().PartitionsOwned+b.e.Stats().PartitionsOwned == limitsPolicyParts
	})
	// ofA is a task id of node-a's partitions.
	ofA := func(name string) string {
		for i := 0; ; i++ {
			if id := fmt.Sprintf("%s-%d", name, i); a.e.owned[ring.Partition(id, limitsPolicyParts)].Load() {
				return id
			}
		}
	}
	buffered, slow := ofA("buffered"), ofA("slow")
	m.hx.ids[buffered], m.hy.ids[slow] = true, true
	for id, p := range map[string]task.ConcurrencyPolicy{buffered: task.ConcurrencyBufferOne, slow: task.ConcurrencyAllow} {
		tk := handlerTask(id, "* * * * * *")
		tk.Concurrency = p
		putTask(t, a.e.Registry(), tk)
		waitNext(t, a, id, limitsAt(1))
	}
	clock.Advance(time.Second)
	m.run = m.hx.next(t)
	m.hy.next(t)
	m.closed = closeInBackground(a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(b, buffered) })
	waitNext(t, b, buffered, limitsAt(2))
	clock.Advance(time.Second)
	select {
	case r := <-m.hx.started:
		t.Fatalf("started %s@%s on %s beside node-a's run of 12:00:01", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	case <-time.After(700 * time.Millisecond):
	}
	return m
}

// bufferedStarts checks that node-b starts buffered's fire of 12:00:02
// (within 10 s), while slow's run still holds node-a's Close, then lets
// node-a close.
func (m *markedAtClose) bufferedStarts(t *testing.T) {
	t.Helper()
	if r := m.hx.next(t); r.Node != "node-b" || !r.ScheduledAt.Equal(limitsAt(2)) {
		t.Errorf("started %s@%s on %s, want buffered's fire of 12:00:02 on node-b", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	m.hy.open()
	if err := <-m.closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
}

// A run past its release that ends while its node still closes (draining
// another run) has its marker deleted then, not with the node's lease at
// the end of Close: the next owner's fire buffered behind it starts when
// it ends.
func TestEngine_MarkerGoesWhenItsRunEndsWhileItsNodeStillCloses(t *testing.T) {
	m := startMarkedAtClose(t)
	m.hx.open() // node-a's run of buffered ends; slow's still holds its Close
	m.bufferedStarts(t)
}

// A marker whose delete etcd refuses when its run ends is deleted once
// etcd takes it again, not left for the node's lease, which a node that
// lives on keeps: its task's fires would stay held (buffer_one) or
// skipped (forbid) for good.
func TestEngine_MarkerWhoseDeleteFailedGoesOnceEtcdTakesIt(t *testing.T) {
	m := startMarkedAtClose(t)
	refused := refuseMarkerDeletes(m.faults)
	m.hx.open()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return refused.Load() > 0 })
	m.faults.deletes(nil)
	m.bufferedStarts(t)
}

// refuseMarkerDeletes has f fail, from now on, every delete of a marker
// of a run elsewhere, and returns how many it failed.
func refuseMarkerDeletes(f *faultKV) *atomic.Int32 {
	var refused atomic.Int32
	f.deletes(func(key string) bool {
		if strings.Contains(key, "/running/") {
			refused.Add(1)
			return true
		}
		return false
	})
	return &refused
}

// markerThere reports whether etcd holds r's marker.
func markerThere(t *testing.T, e *Engine, r *markedRun) bool {
	t.Helper()
	resp, err := e.cli.Get(context.Background(), r.key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// Two runs of one task on one node, each past a release of the same
// partition (the node took it again in between, and ran the task there
// beside its run elsewhere: a backfill's fire, or after an edit to
// allow), keep a marker each: the first run's end leaves the second's.
func TestEngine_TwoRunsOfATaskOnANodeKeepAMarkerEach(t *testing.T) {
	c := etcdtest.Start(t)
	e := startNode(t, c, "", nil, nil).e
	set := e.markersOf(e.sess.Load())
	first, second := set.run(3, "x", 1, 4), set.run(3, "x", 2, 4)
	ctx := context.Background()
	n1, _ := set.put(ctx, []*markedRun{first})
	n2, _ := set.put(ctx, []*markedRun{second})
	if n1+n2 != 2 {
		t.Fatalf("%d markers written, want 2", n1+n2)
	}
	there := func(r *markedRun) bool { return markerThere(t, e, r) }
	set.ended(first)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !there(first) })
	if !there(second) {
		t.Fatalf("x's second run lost its marker when its first run ended")
	}
	set.ended(second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !there(second) })
}

// A run's marker stays until the retries its run handed on through etcd
// are written there, ended or not the run: the next owner then counts the
// marker or the retry (a backfill's fire among them, against the
// backfill's concurrency), never neither; deleted at once, it could see
// neither for a while, and its runner started a fire beside the retry.
// One whose run ended before its put, with such a write under way, is
// put all the same.
func TestEngine_MarkerStaysUntilTheRetriesItsRunHandedOnAreWritten(t *testing.T) {
	c := etcdtest.Start(t)
	e := startNode(t, c, "", nil, nil).e
	set := e.markersOf(e.sess.Load())
	ctx := context.Background()
	there := func(r *markedRun) bool { return markerThere(t, e, r) }
	asked := func(r *markedRun) bool {
		set.mu.Lock()
		defer set.mu.Unlock()
		return slices.Contains(set.dead, r.key) || set.deleting
	}
	run := set.run(3, "x", 1, 4)
	if n, _ := set.put(ctx, []*markedRun{run}); n != 1 {
		t.Fatalf("%d markers written, want 1", n)
	}
	set.handingOn(run)
	set.ended(run)
	if asked(run) || !there(run) {
		t.Fatal("the marker went when its run ended, before the retry it handed on was written")
	}
	set.handedOn(run)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !there(run) })

	late := set.run(3, "y", 2, 4)
	set.handingOn(late)
	set.ended(late)
	if n, _ := set.put(ctx, []*markedRun{late}); n != 1 || !there(late) {
		t.Fatalf("%d markers written of a run that ended with a retry's write under way, want 1", n)
	}
	set.handedOn(late)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return !there(late) })
}

// The retry a marked run hands on through etcd (its attempt failed past
// its graceful release's seal) holds the run's marker until the chain
// writer wrote it: the attempt's end alone no longer deletes it.
func TestLoop_RetryHandedOnThroughEtcdHoldsItsRunsMarker(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, at, nil)
	prof := retryingProfile()
	prof.key, prof.concurrency = "noop/retry3/forbid", task.ConcurrencyForbid
	tl.add(t, 0, at, prof, "0 0 0 1 1 *", "flaky")
	tl.handle(&takeOverCmd{part: 0, fires: []pendingFire{{ID: "flaky", At: at.Add(-time.Minute)}}})
	tl.dispatchAll()
	j := tl.takeQueued() // a worker runs it past the release
	rel := tl.releaseNow(0)
	c := &sealCmd{rel: rel, queued: unrunNone, late: true, reply: make(chan struct{}, 1)}
	tl.handle(c)
	<-c.reply
	// watching, deleting: no goroutine watches or deletes here, and dead
	// shows what would go.
	set := &markers{e: &Engine{keys: newKeys("")}, runs: map[string]*markedRun{}, watching: true, deleting: true}
	marks := tl.pool.leaving.mark(rel.running, set)
	if len(marks) != 1 {
		t.Fatalf("marked %d runs, want flaky's", len(marks))
	}
	set.written(marks, 7)
	tl.end(j, statusFailed)
	fs := tl.pool.chains.take()
	if len(fs) != 1 || fs[0].retry == nil || fs[0].written == nil {
		t.Fatalf("handed on %+v, want flaky's retry, told when written", fs)
	}
	if len(set.dead) != 0 {
		t.Fatalf("the marker goes (%v) before etcd has the retry its run handed on", set.dead)
	}
	fs[0].written()
	if !slices.Equal(set.dead, []string{marks[0].key}) {
		t.Errorf("markers to delete %v once the retry was written, want the run's", set.dead)
	}
}

// A marker put whose answer etcd lost (it took the put, the node saw an
// error), and whose tries after it etcd refused, is deleted when its run
// ends: the node does not know it was written, and left, it would hold
// its task on the next owner until the node's session ends. While the
// run goes on it stays: its release waits for it (retryStuck), and a put
// again is the same key.
func TestEngine_MarkerWhosePutWentUnansweredIsDeletedWhenItsRunEnds(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	e := startNodeOn(t, cli, "", nil, nil).e
	set := e.markersOf(e.sess.Load())
	r := set.run(3, "x", 1, 4)
	markers := func(key, _ string) bool { return strings.Contains(key, "/running/") }
	faults.answersLostOnce(func(key, value string) bool {
		if !markers(key, value) {
			return false
		}
		faults.puts(markers) // the tries after it
		return true
	})
	if n, refused := set.put(context.Background(), []*markedRun{r}); n != 0 || len(refused) != 1 {
		t.Fatalf("%d markers written, %d refused, want the put refused", n, len(refused))
	}
	// Etcd took the first put: the marker is there, and stays while its
	// run goes on (no delete under way, nor queued).
	set.mu.Lock()
	deleting := set.deleting || len(set.dead) > 0
	set.mu.Unlock()
	resp, err := c.Client.Get(context.Background(), r.key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 1 || deleting {
		t.Fatalf("before its run ended: %d markers in etcd, a delete under way %v; want etcd's one, kept", resp.Count, deleting)
	}
	set.ended(r)
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		resp, err := c.Client.Get(context.Background(), r.key, clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
}

// Markers cost a watch, not a goroutine and a watch each: a rolling
// restart of a fleet with many long runs that keep their fires apart
// marks tens of thousands. Here 10 000 markers over 16 partitions, put,
// watched by the node that wrote them (one watch) and by the partitions'
// owner (one a partition), then their runs end: the goroutines of the
// engine's that watch or delete markers are those watches, and every
// marker goes. (Counted by their stacks: the process's count moves with
// what earlier tests leave winding down.)
func TestEngine_TenThousandMarkersTakeAWatchNotAGoroutineEach(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, "", nil, nil)
	e := n.e
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	set := e.markersOf(e.sess.Load())
	const count, parts = 10_000, 16
	runs := make([]*markedRun, count)
	for i := range runs {
		runs[i] = set.run(i%parts, fmt.Sprintf("t-%05d", i), uint32(i), 1)
	}
	start := time.Now()
	if w, _ := set.put(ctx, runs); w != count {
		t.Fatalf("%d markers written, want %d", w, count)
	}
	for p := range parts {
		away, rev, err := e.readElsewhere(ctx, p)
		if err != nil || len(away) != count/parts {
			t.Fatalf("partition %d: %d tasks marked (err %v), want %d", p, len(away), err, count/parts)
		}
		go e.watchElsewhere(ctx, p, away, rev)
	}
	put := time.Since(start)
	if g := markerGoroutines(); g == 0 || g > parts+1 {
		t.Errorf("%d goroutines watch or delete %d markers, want one a partition and one for the writer", g, count)
	}
	start = time.Now()
	for _, r := range runs {
		set.ended(r)
	}
	left := func() int64 {
		resp, err := e.cli.Get(ctx, e.keys.prefix+"/running/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return left() == 0 })
	t.Logf("%d markers: put and read in %v, deleted in %v", count, put.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	// Both sides' watches end with their last marker.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return markerGoroutines() == 0 })
}

// markerGoroutines counts the goroutines in the engine's code that watches
// or deletes markers.
func markerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "engine.(*Engine).watchDeletes") || strings.Contains(g, "engine.(*markers).deleteDead") {
			count++
		}
	}
	return count
}

// A release whose markers etcd refuses does not commit until etcd takes
// them: its partition's lock, still the node's, keeps the next owner out,
// and the run goes on. It canceled the run, for a fire lost (a cancel is
// final: no retry), though the lock kept everyone out while the release
// stayed stuck, and though a release that then committed could have
// marked it. Here forbid's fire of 12:00:01 runs on node-a (held) when
// node-b joins and takes its partition, etcd refuses node-a's marker
// puts, then takes them again: node-b takes the partition once node-a's
// release has marked the run, which goes on, and skips forbid's fire of
// 12:00:02 beside it.
func TestEngine_ReleaseWaitsUntilEtcdTakesItsMarkers(t *testing.T) {
	c, clock := limitsStart(t)
	const parts = joinParts
	id := idIn("forbid", joinAssignment(t).Owned("node-b")[0], parts)
	h := newHolder(t, id)
	node := func(id string) func(*Config) {
		return limitsNode(clock, time.Hour, id, func(cfg *Config) { cfg.Partitions, cfg.DrainTimeout = parts, time.Minute })
	}
	cliA := c.NewClient(t)
	faults := injectFaults(cliA)
	a := startNodeOn(t, cliA, "", h.handler, node("node-a"))
	tk := handlerTask(id, "* * * * * *")
	tk.Concurrency = task.ConcurrencyForbid
	putTask(t, a.e.Registry(), tk)
	waitNext(t, a, id, limitsAt(1))
	clock.Advance(time.Second)
	run := h.next(t)
	var refused atomic.Int32
	faults.puts(func(key, _ string) bool {
		if strings.Contains(key, "/running/") {
			refused.Add(1)
			return true
		}
		return false
	})
	b := startNodeOn(t, c.NewClient(t), "", h.handler, node("node-b"), noWait)
	t.Cleanup(h.open) // again: cleanups run last first
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return refused.Load() >= markerTries })
	faults.puts(nil)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return owns(b, id) })
	if !run.running() {
		t.Fatalf("node-a's run of 12:00:01 ended at the release (%v), want it marked once etcd took the marker", context.Cause(run.ctx))
	}
	if n := a.e.Stats().RunsMarked; n != 1 {
		t.Errorf("node-a marked %d runs, want 1", n)
	}
	if n := b.e.Stats().RunsElsewhere; n != 1 {
		t.Errorf("node-b counts %d runs elsewhere, want node-a's", n)
	}
	waitNext(t, b, id, limitsAt(2))
	clock.Advance(time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return taskState(t, b, id).Skipped == 1 })
	select {
	case r := <-h.started:
		t.Fatalf("started %s@%s on %s beside node-a's run of 12:00:01", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	default:
	}
	h.open()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return b.e.Stats().RunsElsewhere == 0 })
	b.stop(t)
	a.stop(t)
}

// A retry of an earlier fire, waiting for its backoff at the release,
// while a later fire of its task (forbid) runs on past it, is skipped by
// the next owner when it comes due while that run's marker stands, as
// its former owner would have skipped it beside its own run: it is not
// the run's own retry (that one is handed on through etcd once the run
// failed, after the release), which runs whatever its marker. It ran
// beside the run elsewhere.
func TestLoop_HandedRetryOfAnEarlierFireWaitsForTheRunElsewhere(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prof := retryingProfile()
	prof.key, prof.concurrency = "noop/retry3/forbid", task.ConcurrencyForbid
	a := newTestLoop(t, base.Add(-time.Second/2), nil)
	a.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", "fb")
	a.clock.Advance(time.Second/2 + time.Millisecond)
	a.dispatch()
	a.failFirstQueued() // 12:00:00 fails: its retry waits 10 s
	a.clock.Advance(time.Second)
	a.dispatch()
	if got, want := a.dispatched(0), []string{fmt.Sprintf("fb@%d", base.Add(time.Second).UnixMilli())}; !slices.Equal(got, want) {
		t.Fatalf("dispatched %v, want %v", got, want)
	}
	a.takeQueued() // 12:00:01 runs on past the release
	rel := a.releaseNow(0)
	if rel.running == nil || rel.running.n != 1 {
		t.Fatalf("the release waits for %+v, want the run of 12:00:01", rel.running)
	}
	var pending []pendingFire
	for _, f := range rel.hand[0].pending {
		if f.Attempt > 1 {
			pending = append(pending, f)
		}
	}
	if len(pending) != 1 {
		t.Fatalf("the release hands over %+v, want the retry of 12:00:00", rel.hand[0].pending)
	}

	b := newTestLoop(t, a.clock.Now(), nil)
	h, err := b.scheds.Intern("* * * * * *", "UTC", "fb")
	if err != nil {
		t.Fatal(err)
	}
	b.handle(&loadCmd{part: 0, resume: rel.hand[0].mark, first: true, done: make(chan struct{}),
		handed: handedTo{elsewhere: map[string][]elsewhereRun{"fb": {{key: "m/fb"}}}},
		defs:   []taskDef{{id: "fb", hash: xxhash.Sum64String("fb"), part: 0, sched: h, prof: prof}}})
	b.handle(&takeOverCmd{part: 0, fires: rel.hand[0].pending})
	b.clock.Advance(pending[0].Due.Sub(b.clock.Now()) + time.Millisecond)
	b.dispatchAll()
	if got := b.dispatched(0); len(got) != 0 {
		t.Errorf("dispatched %v beside the run of 12:00:01 elsewhere", got)
	}
	// The run of 12:00:01 fails: its retry, handed on through etcd, runs
	// though its marker's delete has not come yet.
	own := base.Add(time.Second)
	b.putRetry(0, "fb", own.Add(time.Millisecond), 1, registry.Retry{Attempt: 2, Due: b.clock.Now(), At: own})
	b.clock.Advance(time.Millisecond)
	b.dispatchAll()
	if got, want := b.dispatched(0), []string{fmt.Sprintf("fb@%d", own.UnixMilli())}; !slices.Equal(got, want) {
		t.Errorf("dispatched %v, want the retry of the run elsewhere's own fire %v", got, want)
	}
}

// A replace fire on the next owner deletes the marker of the run it
// replaces, whose node then cancels the run: a delete etcd refuses is
// tried again while the node's session lives. Given up after 15 s (the
// ninth try would have come at 16.3 s), the marker stayed, and the run
// went on beside the fire that replaced it until it ended.
func TestEngine_ReplaceFireDeletesAMarkerOnceEtcdTakesIt(t *testing.T) {
	t.Parallel() // most of it waits for etcd's refusals to outlast 15 s
	hp := startHeldPolicies(t, task.ConcurrencyReplace)
	var id string
	for id = range hp.ids {
	}
	refused := refuseMarkerDeletes(hp.bKV)
	closed := closeInBackground(hp.a)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(hp.b, id) })
	waitNext(t, hp.b, id, limitsAt(2))
	hp.clock.Advance(time.Second)
	if r := hp.h.next(t); r.Node != "node-b" || !r.ScheduledAt.Equal(limitsAt(2)) {
		t.Fatalf("started %s@%s on %s, want the replace fire of 12:00:02 on node-b", r.TaskID, r.ScheduledAt.Format(time.TimeOnly), r.Node)
	}
	etcdtest.WaitFor(t, 40*time.Second, func() bool { return refused.Load() >= 9 })
	if !hp.old[id].running() {
		t.Fatal("node-a's run of 12:00:01 ended while its marker stood: the test proves nothing")
	}
	hp.bKV.deletes(nil)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return !hp.old[id].running() })
	if err := <-closed; err != nil {
		t.Errorf("close node-a: %v", err)
	}
}
