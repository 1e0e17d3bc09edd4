package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

func TestEngine_EverySecondNoDuplicateNoGap(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	log := newFireLog()
	n := startNode(t, c, "", log.handler, nil)
	const tasks = 20
	for i := range tasks {
		putTask(t, n.e.Registry(), handlerTask(fmt.Sprintf("every-second-%02d", i), "* * * * * *"))
	}
	etcdtest.WaitFor(t, 15*time.Second, func() bool {
		for i := range tasks {
			if len(log.forTask(fmt.Sprintf("every-second-%02d", i))) < 4 {
				return false
			}
		}
		return true
	})
	end := time.Now()
	n.stop(t)
	if d := log.duplicates(); len(d) > 0 {
		t.Fatalf("duplicate fires: %v", d)
	}
	for i := range tasks {
		id := fmt.Sprintf("every-second-%02d", i)
		noGap(t, log, id)
		firedThrough(t, log, id, end)
	}
}

// TestEngine_EtcdRequestsIndependentOfFireRate checks docs/design.md invariant 5:
// in steady state a node sends etcd the same number of requests over a
// fixed window whether it fires 10 or 5000 times a second (watermark
// writes and keep-alives, nothing per fire). The node's client counts what
// it sends. This is a count, not a speed: the window only has to be the
// same length twice.
func TestEngine_EtcdRequestsIndependentOfFireRate(t *testing.T) {
	if testing.Short() {
		t.Skip("measures two windows of real time")
	}
	t.Parallel()
	c := etcdtest.Start(t)
	rc := &RequestCounter{}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second, DialOptions: rc.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	n := startNodeOn(t, cli, "", nil, func(cfg *Config) { cfg.Requests = rc })
	noop := func(i int) *task.Task {
		return &task.Task{ID: fmt.Sprintf("rate-%04d", i), Schedule: "* * * * * *", Executor: task.Executor{Type: task.ExecutorNoop}}
	}
	const window = 3 * time.Second
	total := func() (sum uint64) {
		for _, k := range rc.Counts() {
			sum += k
		}
		return sum
	}
	// measure lets the node settle with tasks tasks (two whole seconds of
	// fires past their put), then returns its requests and fires over the
	// window. A window in which the node fenced (a keep-alive late on a
	// loaded machine, under the race detector) is not steady state: its
	// rejoin reads and watches again. It is measured again, twice at most.
	measure := func(tasks int) (requests, fires uint64) {
		t.Helper()
		for try := 1; ; try++ {
			settled := nextSecond(time.Now()).Add(2 * time.Second)
			etcdtest.WaitFor(t, 30*time.Second, func() bool {
				s := n.e.Stats()
				return s.Tasks == tasks && !s.Fenced && s.Watermark.After(settled)
			})
			s0 := n.e.Stats()
			c0, r0 := rc.Counts(), total()
			<-time.After(window)
			s1 := n.e.Stats()
			c1, r1 := rc.Counts(), total()
			for k := range c1 {
				c1[k] -= c0[k]
			}
			t.Logf("%d tasks: %d requests and %d fires in %v (%v)", tasks, r1-r0, s1.Fires-s0.Fires, window, c1)
			if s1.Fences == s0.Fences && !s1.Fenced || try == 3 {
				return r1 - r0, s1.Fires - s0.Fires
			}
			t.Logf("the node fenced in the window: measured again")
		}
	}
	const few, many = 10, 5000
	var batch []*task.Task
	for i := range few {
		batch = append(batch, noop(i))
	}
	if res, err := n.e.Registry().PutBatch(context.Background(), batch); err != nil || len(res.Errors) > 0 {
		t.Fatal(err, res.Errors)
	}
	loReq, loFires := measure(few)
	for chunk := range 5 {
		batch = batch[:0]
		for i := few + chunk*1000; i < min(many, few+(chunk+1)*1000); i++ {
			batch = append(batch, noop(i))
		}
		if res, err := n.e.Registry().PutBatch(context.Background(), batch); err != nil || len(res.Errors) > 0 {
			t.Fatal(err, res.Errors)
		}
	}
	hiReq, hiFires := measure(many)

	if hiFires < 100*max(loFires, 1) {
		t.Fatalf("fired %d then %d times in %v: the second window should fire at least 100 times as often", loFires, hiFires, window)
	}
	// Timers tick at their own phase: a window may hold a write or a
	// keep-alive more or less than the other.
	if diff := max(hiReq, loReq) - min(hiReq, loReq); diff > 3+loReq/10 {
		t.Errorf("%d etcd requests at %d fires, %d at %d fires: want equal within %d", loReq, loFires, hiReq, hiFires, 3+loReq/10)
	}
}
