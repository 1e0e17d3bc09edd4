package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A chained fire's trigger has the key "<target>@<source's scheduled ms>":
// every ended fire of a source triggers its on_success or on_failure target
// exactly once, with that key, while the sources' partitions move between
// nodes (a join and a graceful leave).
func TestEngine_ChainsNeitherRepeatNorMissAcrossAHandOver(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	h := func(ctx context.Context, f Fire) error {
		_ = log.handler(ctx, f)
		if strings.HasPrefix(f.TaskID, "src-") && f.ScheduledAt.Unix()%2 == 1 {
			return errors.New("odd second")
		}
		return nil
	}
	node := func(id string) func(*Config) {
		return func(cfg *Config) {
			cfg.NodeID = id
			cfg.Partitions = 16
			cfg.DrainTimeout = time.Second
			cfg.MisfireThreshold = time.Minute
		}
	}
	a := startNode(t, c, "", h, node("node-a"))
	reg := a.e.Registry()
	const sources = 12
	for i := range sources {
		// The targets never fire by their schedule within the test.
		putTask(t, reg, handlerTask(fmt.Sprintf("ok-%02d", i), "0 0 1 1 *"))
		putTask(t, reg, handlerTask(fmt.Sprintf("bad-%02d", i), "0 0 1 1 *"))
		src := handlerTask(fmt.Sprintf("src-%02d", i), "* * * * * *")
		src.OnSuccess = []string{fmt.Sprintf("ok-%02d", i)}
		src.OnFailure = []string{fmt.Sprintf("bad-%02d", i)}
		putTask(t, reg, src)
	}
	settle := func() {
		t.Helper()
		n := len(log.forTask("src-00"))
		etcdtest.WaitFor(t, 20*time.Second, func() bool { return len(log.forTask("src-00")) >= n+3 })
	}
	settle()
	b := startNode(t, c, "", h, node("node-b"))
	settle()
	a.stop(t) // a graceful leave: its partitions go to b
	settle()
	to := time.Now().Add(-2 * time.Second)
	// Every source fire up to to has ended: its chain trigger comes within
	// a watch delivery.
	targetOf := func(i int, at time.Time) string {
		if at.Unix()%2 == 1 {
			return fmt.Sprintf("bad-%02d", i)
		}
		return fmt.Sprintf("ok-%02d", i)
	}
	missing := func() []string {
		var out []string
		for i := range sources {
			for _, at := range log.forTask(fmt.Sprintf("src-%02d", i)) {
				if at.After(to) {
					continue
				}
				key := fmt.Sprintf("%s@%d", targetOf(i, at), at.UnixMilli())
				log.mu.Lock()
				n := log.seen[key]
				log.mu.Unlock()
				if n == 0 {
					out = append(out, key)
				}
			}
		}
		return out
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return len(missing()) == 0 })
	b.stop(t)

	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("%d fires repeated, e.g. %v", len(d), d[:min(5, len(d))])
	}
	for i := range sources {
		src := map[int64]bool{}
		for _, at := range log.forTask(fmt.Sprintf("src-%02d", i)) {
			src[at.UnixMilli()] = true
		}
		for _, id := range []string{fmt.Sprintf("ok-%02d", i), fmt.Sprintf("bad-%02d", i)} {
			for _, at := range log.forTask(id) {
				if !src[at.UnixMilli()] || targetOf(i, at) != id {
					t.Errorf("%s fired at %s, which no fire of src-%02d ending so asked for", id, at.Format("15:04:05.000"), i)
				}
			}
		}
	}
	everySecond(t, log, []string{"src-00", "src-05", "src-11"}, to)
}

// A trigger's override replaces the handler payload of that one fire, and
// its retries; the task's next fires have their own payload again.
func TestEngine_TriggerOverrideReachesTheHandler(t *testing.T) {
	c := etcdtest.Start(t)
	log := newFireLog()
	n := startNode(t, c, "", log.handler, nil)
	reg := n.e.Registry()
	tk := handlerTask("over", "0 0 1 1 *")
	tk.Executor.Payload = []byte(`{"own":true}`)
	putTask(t, reg, tk)
	ctx := context.Background()
	if _, err := reg.TriggerWith(ctx, "over", &task.Override{Payload: []byte(` {"once": 1} `)}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.TriggerWith(ctx, "over", &task.Override{Body: new(string)}); err == nil {
		t.Error("a body override of a handler task was accepted")
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("over")) == 1 })
	if _, err := reg.Trigger(ctx, "over"); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.forTask("over")) == 2 })
	log.mu.Lock()
	got := []string{string(log.fires[0].Payload), string(log.fires[1].Payload)}
	log.mu.Unlock()
	if got[0] != `{"once":1}` || got[1] != `{"own":true}` {
		t.Errorf("payloads %q, want the override then the task's own", got)
	}
}

// A trigger that waits behind a running fire (buffer_one) keeps its
// override for when it runs.
func TestEngine_BufferedTriggerKeepsItsOverride(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, "", nil, nil)
	g := newGate(t)
	n.e.Handle("slow", g.handler)
	tk := handlerTask("slow", "0 0 1 1 *") // yearly: only triggers fire it
	tk.Executor.Name, tk.Executor.Payload = "slow", []byte(`{"own":true}`)
	tk.Concurrency = task.ConcurrencyBufferOne
	reg := n.e.Registry()
	putTask(t, reg, tk)
	ctx := context.Background()
	if _, err := reg.Trigger(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	if f := g.next(t); string(f.Payload) != `{"own":true}` {
		t.Fatalf("first fire's payload %s", f.Payload)
	}
	if _, err := reg.TriggerWith(ctx, "slow", &task.Override{Payload: []byte(`{"once":1}`)}); err != nil {
		t.Fatal(err)
	}
	// Taken and buffered behind the running fire.
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return inLoop(t, n, func(l *loop) bool { return len(l.pending) == 1 })
	})
	g.releaseOne(t)
	if f := g.next(t); string(f.Payload) != `{"once":1}` {
		t.Errorf("the buffered trigger ran with the payload %s, want its override", f.Payload)
	}
	g.open()
}

// The registry refuses a chain that closes a cycle, naming it, and a
// missing target unless allowed; the write leaves etcd as it was.
func TestRegistry_ChainsRefuseCyclesAndMissingTargets(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, "", nil, nil)
	reg := n.e.Registry()
	ctx := context.Background()
	x := handlerTask("x", "@hourly")
	x.OnSuccess = []string{"y"}
	if _, err := reg.Put(ctx, x, registry.PutOptions{}); err == nil || !strings.Contains(err.Error(), `task "y" does not exist`) {
		t.Fatalf("missing target: %v", err)
	}
	putTask(t, reg, handlerTask("z", "@hourly"))
	if _, err := reg.Put(ctx, x, registry.PutOptions{AllowMissingTargets: true}); err != nil {
		t.Fatal(err)
	}
	y := handlerTask("y", "@hourly")
	y.OnFailure = []string{"z"}
	putTask(t, reg, y)
	z := handlerTask("z", "@hourly")
	z.OnSuccess = []string{"x"}
	_, err := reg.Put(ctx, z, registry.PutOptions{})
	var ve *task.ValidationError
	if !errors.As(err, &ve) || ve.Field != "on_success" || !strings.Contains(err.Error(), `"z" -> "x" -> "y" -> "z"`) {
		t.Fatalf("cycle: %v", err)
	}
	got, err := reg.Get(ctx, "z")
	if err != nil || len(got.OnSuccess) != 0 {
		t.Errorf("the refused put changed z: %+v, %v", got, err)
	}
}

// While etcd refuses the trigger writes, the queue of ended fires stops at
// its bound: past it their triggers are dropped and counted, with one log
// line per episode, and once the writer took the queue it takes fires
// again.
func TestChainQueue_DropsPastItsBound(t *testing.T) {
	var logs strings.Builder
	q := newChainQueue(slog.New(slog.NewTextHandler(&logs, nil)))
	q.max = 3
	for i := range 5 {
		q.add(chainFire{from: fmt.Sprint("t", i), targets: []string{"next"}})
	}
	if n := q.dropped.Load(); n != 2 {
		t.Errorf("dropped %d, want 2", n)
	}
	if got := q.take(); len(got) != 3 || got[0].from != "t0" || got[2].from != "t2" {
		t.Errorf("queued %v, want the first 3", got)
	}
	if n := strings.Count(logs.String(), "chain trigger queue full"); n != 1 {
		t.Errorf("logged the full queue %d times, want once:\n%s", n, logs.String())
	}
	q.add(chainFire{from: "t5", targets: []string{"next"}})
	if got := q.take(); len(got) != 1 || q.dropped.Load() != 2 {
		t.Errorf("after the writer took the queue: queued %v, dropped %d; want t5 queued, still 2 dropped", got, q.dropped.Load())
	}
}

// A retry handed on through etcd (leavers) shares the chain writer's
// queue, but is not dropped with the chain triggers past its bound: it was
// the fire's only record, and lost. The retries are bounded by the
// attempts under way at a release (the workers).
func TestChainQueue_KeepsRetriesPastItsBound(t *testing.T) {
	q := newChainQueue(slog.New(slog.DiscardHandler))
	q.max = 1
	q.add(chainFire{from: "t0", targets: []string{"next"}})
	q.add(chainFire{from: "flaky", retry: &registry.Retry{Attempt: 2}})
	q.add(chainFire{from: "t1", targets: []string{"next"}})
	if got := q.take(); len(got) != 2 || got[1].retry == nil || q.dropped.Load() != 1 {
		t.Errorf("queued %v, dropped %d; want t0 and flaky's retry, t1 dropped", got, q.dropped.Load())
	}
}

// A chain whose target does not exist is logged once every missingEvery,
// with the triggers skipped since, not at every fire.
func TestMissingTargets_LoggedOncePerInterval(t *testing.T) {
	var logs strings.Builder
	m := missingTargets{log: slog.New(slog.NewTextHandler(&logs, nil)), max: missingMax}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 600 { // a task firing every second for ten minutes
		at := t0.Add(time.Duration(i) * time.Second)
		m.skipped(at, "every-second", "gone", at)
	}
	m.skipped(t0, "other", "gone", t0)
	if n := strings.Count(logs.String(), "a chain target does not exist"); n != 2 {
		t.Fatalf("logged %d times in the first interval, want once per chain:\n%s", n, logs.String())
	}
	logs.Reset()
	at := t0.Add(missingEvery)
	m.skipped(at, "every-second", "gone", at)
	if !strings.Contains(logs.String(), "task=every-second target=gone") || !strings.Contains(logs.String(), "skipped=600") {
		t.Errorf("the next interval's line, want the 599 skipped since and this one:\n%s", logs.String())
	}
}

// Past its bound, missingTargets logs a chain it cannot remember at every
// skip, and once an interval has passed it forgets the chains logged that
// long ago to make room.
func TestMissingTargets_Bounded(t *testing.T) {
	var logs strings.Builder
	m := missingTargets{log: slog.New(slog.NewTextHandler(&logs, nil)), max: 2}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	count := func() int { n := strings.Count(logs.String(), "target=gone"); logs.Reset(); return n }
	m.skipped(t0, "a", "gone", t0)
	m.skipped(t0, "b", "gone", t0)
	m.skipped(t0, "c", "gone", t0)
	m.skipped(t0, "c", "gone", t0)
	if n := count(); n != 4 || len(m.chain) != 2 {
		t.Fatalf("%d lines, %d chains remembered; want a, b once and c at each skip (4), 2 remembered", n, len(m.chain))
	}
	later := t0.Add(missingEvery)
	m.skipped(later, "c", "gone", later)
	m.skipped(later, "c", "gone", later)
	if n := count(); n != 1 || m.chain[[2]string{"c", "gone"}] == nil {
		t.Errorf("after an interval: %d lines for c, want 1 (a and b forgotten, c remembered): %v", n, m.chain)
	}
}

// The chain writer tells missingTargets of a target the registry does not
// hold, rather than logging each trigger itself.
func TestEngine_MissingChainTargetLoggedOnce(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, "", nil, nil)
	var logs strings.Builder
	m := missingTargets{log: slog.New(slog.NewTextHandler(&logs, nil)), max: missingMax}
	var fs []chainFire
	for i := range 3 {
		fs = append(fs, chainFire{from: "x", sched: time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC).UnixNano(), targets: []string{"gone"}})
	}
	n.e.triggerChains(context.Background(), fs, &m)
	if got := strings.Count(logs.String(), "a chain target does not exist"); got != 1 {
		t.Errorf("%d lines for 3 triggers of a missing target, want 1:\n%s", got, logs.String())
	}
	if got := m.chain[[2]string{"x", "gone"}]; got == nil || got.skipped != 2 {
		t.Errorf("remembered %+v, want 2 skipped since the line", got)
	}
}

// The chain writer gives up on etcd out of reach once the node closes:
// Close waits for it, and it waits etcdTimeout at most for its last
// writes, as the trigger deleter does. Its writes had no deadline: here a
// fire of src ends while node-a is cut off from etcd (a blackhole, where
// requests hang until their deadline), and Close never returned while the
// cut lasted.
func TestEngine_CloseCutOffFromEtcdDoesNotWaitForeverForAChainWrite(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	h := newHolder(t, "src")
	proxy := c.NewProxy(t)
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", h.handler, func(cfg *Config) {
		cfg.NodeID, cfg.Partitions, cfg.DrainTimeout = "node-a", 4, time.Second
		cfg.Logger = quietLogger()
	})
	t.Cleanup(h.open)
	reg := a.e.Registry()
	putTask(t, reg, handlerTask("target", "0 0 0 1 1 *")) // yearly: only triggers fire them
	src := handlerTask("src", "0 0 0 1 1 *")
	src.OnSuccess = []string{"target"}
	putTask(t, reg, src)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return owns(a, "src") })
	if _, err := reg.Trigger(context.Background(), "src"); err != nil {
		t.Fatal(err)
	}
	h.next(t)
	crash(t, a, proxy) // cut off: node-a fences
	h.open()           // src's fire ends: its chain's trigger waits for etcd
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		q := a.e.pool.chains
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.q) == 0
	})
	time.Sleep(100 * time.Millisecond) // the writer is in its write
	start := time.Now()
	closed := closeInBackground(a)
	select {
	case err := <-closed:
		_ = err // etcd is out of reach: the lease is not revoked
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("Close took %v", d)
		}
	case <-time.After(40 * time.Second):
		proxy.Restore() // let it end
		<-closed
		t.Fatalf("Close did not return within 40 s of etcd out of reach: the chain writer waited for its write")
	}
	_ = a.store.Close()
	a.e = nil
	// What was not written is lost, as in a crash: no owner will fire it
	// (design.md, "Backfills and chains").
	resp, err := c.Client.Get(context.Background(), DefaultPrefix+"/triggers/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(string(kv.Key), "/target") {
			t.Errorf("the chain's trigger %s is in etcd: the doc says it is lost", kv.Key)
		}
	}
}

// Close gives the chain writer's last writes etcdTimeout once the workers
// drained, the write under way then included. A retry handed on through
// etcd whose write was under way as they drained (the stop's retries are
// queued at its very end, Hurry's first of all, and wake the writer) and
// that etcd refused once, a leader change, was given up at once, its fire
// lost, though etcd took the next write: one queued a moment later was
// tried for the whole etcdTimeout. Here etcd refuses the retry's first
// write, and the workers drain while it is under way. Once written, the
// retry tells its run's marker, which waits for it (markers.handedOn).
func TestEngine_ChainWriteUnderWayAsTheWorkersDrainIsTriedAgain(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	cli := c.NewClient(t)
	faults := injectFaults(cli)
	ctx := context.Background()
	reg, err := registry.OpenRegistry(ctx, cli, DefaultPrefix, 4)
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, handlerTask("flaky", "0 0 0 1 1 *"))
	e := &Engine{log: quietLogger(), reg: reg}
	drained := make(chan struct{})
	refused := false
	faults.puts(func(key, _ string) bool {
		if !strings.Contains(key, "/triggers/") || refused {
			return false
		}
		refused = true
		close(drained) // the workers drain while the write is under way
		return true
	})
	q := newChainQueue(quietLogger())
	var told atomic.Bool
	q.add(chainFire{from: "flaky", sched: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(),
		retry: &registry.Retry{Attempt: 2, Due: time.Now()}, written: func() { told.Store(true) }})
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.writeChains(q, drained)
	}()
	select {
	case <-done:
	case <-time.After(2 * etcdTimeout):
		t.Fatal("the chain writer did not end within twice etcdTimeout of the drain")
	}
	if !refused {
		t.Fatal("the retry's write was not refused")
	}
	if n, err := reg.PendingTriggerCount(ctx); err != nil || n != 1 {
		t.Errorf("%d trigger keys (%v) once the writer ended, want the retry's", n, err)
	}
	if !told.Load() {
		t.Error("the writer did not tell the retry's marker that it was written")
	}
}
