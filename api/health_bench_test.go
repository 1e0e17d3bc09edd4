package api

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// BenchmarkListByStatus measures GET /v1/tasks?status=failing end to end on
// one node: the owner's scan of its tasks, the etcd read of the page's
// tasks, the JSON answer. The node holds n tasks (100 000; set
// SHARDCRON_BENCH_TASKS for more), one in a hundred failing; every other
// task is labelled team=x. One op is one page of 1000. For comparison, a
// page of 1000 without a filter, with and without states.
func BenchmarkListByStatus(b *testing.B) {
	n := 100_000
	if v := os.Getenv("SHARDCRON_BENCH_TASKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1000 {
			b.Fatalf("SHARDCRON_BENCH_TASKS=%q: want a number of tasks, at least 1000", v)
		}
	}
	c := etcdtest.Start(b)
	node := startNode(b, c, nodeOptions{id: "node-1"})
	node.e.Handle("fail", func(context.Context, engine.Fire) error { return errors.New("boom") })
	ctx := context.Background()
	reg := node.e.Registry()
	batch := make([]*task.Task, 0, 10_000)
	for i := range n {
		task := handlerTask(fmt.Sprintf("t/%07d", i), "0 0 0 1 1 *")
		task.Labels = map[string]string{}
		if i%100 == 0 {
			task.Executor.Name = "fail"
			task.Labels["fail"] = "1"
		}
		if i%2 == 0 {
			task.Labels["team"] = "x"
		}
		if batch = append(batch, task); len(batch) == cap(batch) || i == n-1 {
			if res, err := reg.PutBatch(ctx, batch); err != nil || len(res.Errors) > 0 {
				b.Fatalf("put: %v %v", err, res.Errors)
			}
			batch = batch[:0]
		}
	}
	etcdtest.WaitFor(b, 5*time.Minute, func() bool { return node.e.Stats().Tasks == n })
	if _, err := reg.Bulk(ctx, task.BulkTrigger, task.Selector{Labels: map[string]string{"fail": "1"}}); err != nil {
		b.Fatal(err)
	}
	etcdtest.WaitFor(b, 5*time.Minute, func() bool {
		ms, _, _, err := node.e.Query(ctx, task.StatusQuery{Status: task.StatusFailing, Limit: n / 100})
		return err == nil && len(ms) == n/100
	})
	for _, bc := range []struct {
		name string
		opts client.ListOptions
	}{
		{"status=failing", client.ListOptions{Status: "failing", Limit: 1000}},
		{"status=failing/label=team=x", client.ListOptions{Status: "failing", Labels: map[string]string{"team": "x"}, Limit: 1000}},
		{"no-filter", client.ListOptions{Limit: 1000}},
		{"no-filter/state", client.ListOptions{Limit: 1000, State: true}},
	} {
		b.Run(fmt.Sprintf("tasks=%d/%s", n, bc.name), func(b *testing.B) {
			var got int
			for range b.N {
				tasks, _, err := node.c.ListTasks(ctx, bc.opts)
				if err != nil {
					b.Fatal(err)
				}
				got = len(tasks)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
			b.ReportMetric(float64(got), "tasks")
		})
	}
}
