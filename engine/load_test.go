package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// The partitions prepared from the cache share reads of etcd's revision;
// a cache synced past the last read is checked with a new one, and a
// member whose applied revision lags behind the cache is not taken at its
// word: the cluster's revision decides.
func TestRevisions_SharedReadsAndLaggingMembers(t *testing.T) {
	var applied, current int64
	var reads []string
	readApplied := func(context.Context) (int64, error) { reads = append(reads, "applied"); return applied, nil }
	readCurrent := func(context.Context) (int64, error) { reads = append(reads, "current"); return current, nil }
	r := newRevisions()
	for _, step := range []struct {
		name             string
		applied, current int64
		cached, want     int64
		wantReads        int // reads made by this step
		wantCurrentAsked bool
	}{
		{name: "first read", applied: 10, current: 10, cached: 5, want: 10, wantReads: 1},
		{name: "shared", applied: 99, current: 99, cached: 8, want: 10, wantReads: 0},
		{name: "cache past the last read", applied: 12, current: 12, cached: 12, want: 12, wantReads: 1},
		{name: "lagging member", applied: 13, current: 20, cached: 15, want: 20, wantReads: 2, wantCurrentAsked: true},
		{name: "ahead of etcd", applied: 21, current: 21, cached: 30, want: 21, wantReads: 2, wantCurrentAsked: true},
	} {
		applied, current, reads = step.applied, step.current, nil
		got, err := r.notAhead(context.Background(), step.cached, readApplied, readCurrent)
		if err != nil || got != step.want || len(reads) != step.wantReads {
			t.Errorf("%s: notAhead(%d) = %d, %v after reads %v; want %d after %d reads", step.name, step.cached, got, err, reads, step.want, step.wantReads)
		}
		if asked := len(reads) > 0 && reads[len(reads)-1] == "current"; asked != step.wantCurrentAsked {
			t.Errorf("%s: reads %v, want the cluster's revision asked: %v", step.name, reads, step.wantCurrentAsked)
		}
	}
}

// A pause and its resume that one watch delivery brings reach the loop as
// a pause, then a resume: a delete_after_fire task whose last fire ended
// (handed to the deleter, whose delete, conditioned on the version it
// read, the pause beats) is deleted at its resume, as when they come
// apart. apply kept the last event of a key: the resume alone, a write
// that is not a pause, so an edit, and the task stayed, ended, for good.
func TestEngine_ApplyHandsAPauseAndItsResumeDeliveredTogetherInOrder(t *testing.T) {
	at := newApplyTest(t, nil)
	ctx := context.Background()
	var events []*clientv3.Event
	for _, paused := range []bool{true, false} {
		if _, err := at.reg.SetPaused(ctx, "t", paused); err != nil {
			t.Fatal(err)
		}
		events = append(events, &clientv3.Event{Type: mvccpb.PUT, Kv: at.version(t)})
	}
	tl := at.tl
	tl.clock.Advance(time.Second)
	tl.dispatchAll()
	tl.end(tl.takeQueued(), statusOK)
	if n := len(tl.ended); n != 1 {
		t.Fatalf("%d deletions queued once t's fire ended, want 1", n)
	}
	<-tl.ended // the deleter's, which the pause beats
	at.apply(t, events)
	if n := len(tl.ended); n != 1 {
		t.Errorf("%d deletions queued at t's resume, want 1: its last fire ended while it was paused", n)
	}
}

// A delete and a put again that one watch delivery brings delete the
// history of the task deleted, as apart: apply kept the put alone, and
// the new task showed the executions of the one before.
func TestEngine_ApplyDeletesTheHistoryOfATaskPutAgainInTheSameDelivery(t *testing.T) {
	at, st := deletedWithHistory(t)
	deleted, err := at.c.Client.Get(context.Background(), "deleted")
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, at.reg, at.task)
	at.apply(t, []*clientv3.Event{
		{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: at.put.Key, ModRevision: deleted.Header.Revision}},
		{Type: mvccpb.PUT, Kv: at.version(t)},
	})
	noHistory(t, st)
}

// deletedWithHistory is an applyTest whose t has an execution recorded in
// st, and was deleted from etcd since.
func deletedWithHistory(t *testing.T) (*applyTest, *store.Store) {
	t.Helper()
	st, err := store.Open(store.DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	at := newApplyTest(t, st)
	ctx := context.Background()
	st.Record(task.Execution{TaskID: "t", ScheduledAt: at.base, Attempt: 1, Node: "loop", Status: task.ExecutionOK})
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := at.reg.Delete(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	return at, st
}

// noHistory checks that st holds no execution of t, put again.
func noHistory(t *testing.T, st *store.Store) {
	t.Helper()
	if h, err := st.History("t", 10); err != nil || len(h) != 0 {
		t.Errorf("t put again has the history %+v (%v), want none: it was the deleted task's", h, err)
	}
}

// A put again whose delete the watch did not bring (a reload after a
// compaction: a replace) deletes the history of the task deleted too: the
// new task showed the deleted one's records.
func TestEngine_ApplyDeletesTheHistoryOfATaskPutAgainWithoutItsDelete(t *testing.T) {
	at, st := deletedWithHistory(t)
	at.tl.history = st
	putTask(t, at.reg, at.task)
	at.apply(t, []*clientv3.Event{{Type: mvccpb.PUT, Kv: at.version(t)}})
	at.tl.deletes.Wait()
	noHistory(t, st)
}

// applyTest is a delete_after_fire one-shot t, at base+1s, written to
// etcd, and an Engine whose apply hands its commands to tl, a loop that
// holds t as put (at its revision).
type applyTest struct {
	c    *etcdtest.Cluster
	reg  *registry.Registry
	task *task.Task
	put  *mvccpb.KeyValue
	base time.Time
	tl   *testLoop
	e    *Engine
}

func newApplyTest(t *testing.T, st *store.Store) *applyTest {
	t.Helper()
	at := &applyTest{c: etcdtest.Start(t), base: time.Now().UTC().Truncate(time.Second).Add(time.Minute)}
	at.reg = directRegistry(t, at.c)
	at.task = &task.Task{ID: "t", Schedule: "@at " + at.base.Add(time.Second).Format(time.RFC3339), DeleteAfterFire: true,
		Executor: task.Executor{Type: task.ExecutorNoop}}
	putTask(t, at.reg, at.task)
	at.put = at.version(t)
	at.tl = newTestLoop(t, at.base, nil)
	at.e = &Engine{cfg: at.tl.cfg, scheds: at.tl.scheds, execs: &executors{}, reg: at.reg, log: quietLogger(), loop: at.tl.loop,
		store: st, uncached: make([]atomic.Bool, at.tl.cfg.Partitions)}
	def, err := at.e.decoder().def("t", at.put.Value)
	if err != nil {
		t.Fatal(err)
	}
	def.createRev = at.put.CreateRevision
	at.tl.handle(&loadCmd{part: def.part, resume: at.base.UnixNano(), rev: at.put.ModRevision, created: at.put.CreateRevision,
		defs: []taskDef{def}, first: true, done: make(chan struct{})})
	return at
}

// version reads t as etcd holds it.
func (at *applyTest) version(t *testing.T) *mvccpb.KeyValue {
	t.Helper()
	resp, err := at.c.Client.Get(context.Background(), DefaultPrefix+"/tasks/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read t: %v, %d keys", err, len(resp.Kvs))
	}
	return resp.Kvs[0]
}

// apply hands events, one watch delivery of t's partition, to apply, and
// runs the commands it sends on the loop meanwhile, as the loop's
// goroutine does.
func (at *applyTest) apply(t *testing.T, events []*clientv3.Event) {
	t.Helper()
	done := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			select {
			case c := <-at.tl.cmds:
				at.tl.handle(c)
			case <-done:
				for len(at.tl.cmds) > 0 {
					at.tl.handle(<-at.tl.cmds)
				}
				return
			}
		}
	}()
	err := at.e.apply(context.Background(), int(xxhash.Sum64String("t")%uint64(at.tl.cfg.Partitions)), events)
	close(done)
	<-served
	if err != nil {
		t.Fatal(err)
	}
}

// A run of events apply hands the loop is every change of the partition
// up to its revision, and none after: a key's second event within a
// transaction's events ends the run before them. Ended after some, a run
// handed a task the transaction created as of the revision before its
// creation, and the task's next write, in the run after, was taken for a
// put again that hides a delete (events): its record went, with the retry
// of its attempt under way.
func TestEngine_ApplyEndsARunBeforeATransactionsEvents(t *testing.T) {
	at := newApplyTest(t, nil)
	tl := at.tl
	ctx := context.Background()
	var id string // a task of t's partition
	for _, c := range []string{"a", "b", "c", "d", "e", "f"} {
		if xxhash.Sum64String(c)%2 == xxhash.Sum64String("t")%2 {
			id = c
			break
		}
	}
	putTask(t, at.reg, &task.Task{ID: id, Schedule: "@at " + at.base.Add(time.Second).Format(time.RFC3339),
		Retry:    task.Retry{MaxAttempts: 2, Backoff: task.Duration(time.Minute), MaxBackoff: task.Duration(time.Minute)},
		Executor: task.Executor{Type: task.ExecutorNoop}})
	resp, err := at.c.Client.Get(ctx, DefaultPrefix+"/tasks/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var a *mvccpb.KeyValue
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(string(kv.Key), "/"+id) {
			a = kv
		}
	}
	if a == nil {
		t.Fatalf("%s is not in etcd", id)
	}
	// t written at r-1; id created and t written again by one transaction
	// at r; id written again at r+1: one delivery.
	r := at.put.ModRevision + 10
	put := func(of *mvccpb.KeyValue, mod, created int64) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: of.Key, Value: of.Value, ModRevision: mod, CreateRevision: created}}
	}
	events := []*clientv3.Event{put(at.put, r-1, at.put.CreateRevision), put(a, r, r), put(at.put, r, at.put.CreateRevision), put(a, r+1, r)}

	// The loop's goroutine, which fires id's attempt once id is armed.
	var attempt job
	done := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		handle := func(c command) {
			tl.handle(c)
			if _, _, ok := tl.tab.lookup(id); ok && attempt.id == "" {
				tl.clock.Advance(time.Second)
				tl.dispatchAll()
				tl.pool.mu.Lock()
				for i := range tl.pool.queued() {
					if j := tl.pool.at(i); j.id == id {
						attempt = *j
					}
				}
				tl.pool.mu.Unlock()
				tl.pool.reset()
			}
		}
		for {
			select {
			case c := <-tl.cmds:
				handle(c)
			case <-done:
				for len(tl.cmds) > 0 {
					handle(<-tl.cmds)
				}
				return
			}
		}
	}()
	err = at.e.apply(ctx, int(xxhash.Sum64String("t")%uint64(tl.cfg.Partitions)), events)
	close(done)
	<-served
	if err != nil {
		t.Fatal(err)
	}
	if attempt.id == "" {
		t.Fatalf("%s's attempt was not dispatched", id)
	}
	tl.end(attempt, statusFailed)
	tl.clock.Advance(2 * time.Minute)
	tl.dispatchAll()
	retried := false
	tl.pool.mu.Lock()
	for i := range tl.pool.queued() {
		if j := tl.pool.at(i); j.id == id && j.attempt == 2 {
			retried = true
		}
	}
	tl.pool.mu.Unlock()
	for _, j := range tl.unpushed {
		retried = retried || j.id == id && j.attempt == 2
	}
	if !retried {
		t.Errorf("%s's failed attempt was not retried: its write after its creation was taken for a put again", id)
	}
}
