package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardcron/shardcron/task"
)

// putChunk is how many tasks one PutBatch call writes.
const putChunk = 5000

// putWriters is how many PutBatch calls run at once.
const putWriters = 4

// putTasks writes tasks [0, n) to etcd through the registry, exec giving
// each its executor, and reports progress every few seconds.
func (c *cluster) putTasks(ctx context.Context, n int, spec string, exec func(i int) task.Executor) error {
	return c.writeTasks(ctx, n, func(i int) *task.Task {
		return &task.Task{ID: taskID(i), Schedule: spec, Executor: exec(i)}
	})
}

// writeTasks writes tasks [0, n), newTask giving task i, to etcd through the
// registry, and reports progress every few seconds.
func (c *cluster) writeTasks(ctx context.Context, n int, newTask func(i int) *task.Task) error {
	start := time.Now()
	var next, done atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, putWriters)
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Fprintf(c.cfg.Progress, "bench: wrote %d of %d tasks to etcd (%.0f/s)\n",
					done.Load(), n, float64(done.Load())/time.Since(start).Seconds())
			}
		}
	}()
	defer close(stop)
	for range putWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := make([]*task.Task, 0, putChunk)
			for {
				lo := int(next.Add(putChunk)) - putChunk
				if lo >= n {
					return
				}
				hi := min(lo+putChunk, n)
				batch = batch[:0]
				for i := lo; i < hi; i++ {
					batch = append(batch, newTask(i))
				}
				res, err := c.reg.PutBatch(ctx, batch)
				if err == nil && len(res.Errors) > 0 {
					err = fmt.Errorf("task %s: %s", batch[res.Errors[0].Index].ID, res.Errors[0].Error)
				}
				if err != nil {
					errc <- fmt.Errorf("bench: write tasks: %w", err)
					return
				}
				done.Add(int64(hi - lo))
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	fmt.Fprintf(c.cfg.Progress, "bench: wrote %d tasks to etcd in %v\n", n, time.Since(start).Round(time.Millisecond))
	return nil
}

// executorFor returns the executor of task i for the configured executor:
// keyed tasks post to url when it is set (the http executor, or node
// processes), else call the recording handler.
func executorFor(kind, url string, slot []int32) func(i int) task.Executor {
	return func(i int) task.Executor {
		keyed := kind == ExecHTTP || kind == ExecHandler || (slot != nil && slot[i] >= 0)
		switch {
		case keyed && url != "":
			return task.Executor{Type: task.ExecutorHTTP, URL: url}
		case keyed:
			return task.Executor{Type: task.ExecutorHandler, Name: handlerName}
		default:
			return task.Executor{Type: task.ExecutorNoop}
		}
	}
}
