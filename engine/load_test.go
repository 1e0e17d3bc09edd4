package engine

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
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
	c := etcdtest.Start(t)
	reg := directRegistry(t, c)
	ctx := context.Background()
	base := time.Now().UTC().Truncate(time.Second).Add(time.Minute)
	tk := &task.Task{ID: "t", Schedule: "@at " + base.Add(time.Second).Format(time.RFC3339), DeleteAfterFire: true,
		Executor: task.Executor{Type: task.ExecutorNoop}}
	putTask(t, reg, tk)
	version := func() *mvccpb.KeyValue {
		t.Helper()
		resp, err := c.Client.Get(ctx, DefaultPrefix+"/tasks/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("read t: %v, %d keys", err, len(resp.Kvs))
		}
		return resp.Kvs[0]
	}
	put := version()
	var events []*clientv3.Event
	for _, paused := range []bool{true, false} {
		if _, err := reg.SetPaused(ctx, "t", paused); err != nil {
			t.Fatal(err)
		}
		events = append(events, &clientv3.Event{Type: mvccpb.PUT, Kv: version()})
	}

	tl := newTestLoop(t, base, nil)
	e := &Engine{cfg: tl.cfg, scheds: tl.scheds, execs: &executors{}, reg: reg, log: quietLogger(), loop: tl.loop}
	def, err := e.decoder().def("t", put.Value)
	if err != nil {
		t.Fatal(err)
	}
	tl.handle(&loadCmd{part: def.part, resume: base.UnixNano(), rev: put.ModRevision, created: put.CreateRevision, defs: []taskDef{def}, first: true, done: make(chan struct{})})
	tl.clock.Advance(time.Second)
	tl.dispatchAll()
	tl.end(tl.takeQueued(), statusOK)
	if n := len(tl.ended); n != 1 {
		t.Fatalf("%d deletions queued once t's fire ended, want 1", n)
	}
	<-tl.ended // the deleter's, which the pause beats

	if err := e.apply(ctx, def.part, events); err != nil {
		t.Fatal(err)
	}
	for len(tl.cmds) > 0 {
		tl.handle(<-tl.cmds)
	}
	if n := len(tl.ended); n != 1 {
		t.Errorf("%d deletions queued at t's resume, want 1: its last fire ended while it was paused", n)
	}
}
