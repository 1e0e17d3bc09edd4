package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardcron/shardcron/api/client"
)

// The batch size of 'shardcron import' and how many batches it sends at
// once (its defaults).
const (
	importBatch    = 1000
	importInFlight = 4
)

// runImport posts cfg.Tasks tasks as JSON Lines to a node's batch API,
// importInFlight batches at once, as 'shardcron import' does.
func runImport(ctx context.Context, cfg Config) (*Result, error) {
	c, err := startCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.close() }()
	n, err := c.addNode(ctx, false)
	if err != nil {
		return nil, err
	}
	url, stop, err := c.serveAPI(n)
	if err != nil {
		return nil, err
	}
	defer stop()
	cl := client.NewClient(url, "")

	a, ca := snapshot(), c.counters()
	last := time.Now()
	los := make(chan int)
	errs := make(chan error, importInFlight)
	var (
		wg      sync.WaitGroup
		written atomic.Int64 // tasks whose batch the API took without an error
	)
	for range importInFlight {
		wg.Go(func() {
			var body []byte
			for lo := range los {
				body = body[:0]
				hi := min(lo+importBatch, cfg.Tasks)
				for i := lo; i < hi; i++ {
					body = fmt.Appendf(body, `{"id":%q,"schedule":%q,"executor":{"type":"noop"}}`+"\n", taskID(i), cfg.Schedule)
				}
				res, err := cl.PutBatch(ctx, body)
				if err == nil && len(res.Errors) > 0 {
					err = errors.New(res.Errors[0].Error)
				}
				if err != nil {
					errs <- fmt.Errorf("bench: import batch at task %d: %w", lo, err)
					return
				}
				written.Add(int64(hi - lo))
			}
		})
	}
	var ierr error
send:
	for lo := 0; lo < cfg.Tasks; lo += importBatch {
		select {
		case los <- lo:
		case ierr = <-errs:
			break send
		}
		if time.Since(last) > 5*time.Second {
			last = time.Now()
			fmt.Fprintf(cfg.Progress, "bench: imported %d of %d tasks\n", written.Load(), cfg.Tasks)
		}
	}
	close(los)
	wg.Wait()
	if ierr == nil && len(errs) > 0 {
		ierr = <-errs
	}
	if ierr != nil {
		return nil, ierr
	}
	b, cb := snapshot(), c.counters()
	r := &Result{Scenario: Import, Tasks: cfg.Tasks, DurationS: b.at.Sub(a.at).Seconds()}
	r.TasksPerSec = float64(cfg.Tasks) / r.DurationS
	r.setUse(cfg.Procs, a, b, ca, cb)
	return r, nil
}

// runRestart starts a node with a Badger cache, lets it load every task,
// stops it gracefully and starts it again: the second start loads from its
// cache. It reports the time from the second start to ready and to the
// first fire, and the stop's.
func runRestart(ctx context.Context, cfg Config) (*Result, error) {
	c, err := startCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.close() }()
	c.rec = newRecorder(cfg.Tasks, cfg.Partitions, 1, time.Now().Truncate(time.Second),
		int(readyTimeout(cfg)/time.Second)*3, probeSlots(cfg.Tasks, cfg.Partitions, cfg.Partitions))
	slot := c.rec.slot
	url := ""
	if cfg.Procs {
		// A node process posts its probes' fires to the receiver.
		recv, err := startReceiver(c.rec)
		if err != nil {
			return nil, err
		}
		defer recv.close()
		url = recv.url
	}
	if err := c.putTasks(ctx, cfg.Tasks, cfg.Schedule, executorFor(ExecNoop, url, slot)); err != nil {
		return nil, err
	}
	n, err := c.addNode(ctx, true)
	if err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, cfg.Tasks, readyTimeout(cfg)); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "bench: cold start done; restarting\n")
	stop := time.Now()
	if err := n.close(); err != nil {
		return nil, fmt.Errorf("bench: stop node: %w", err)
	}
	start := time.Now()
	c.rec.markEvent(start)
	if _, err := c.startNode(ctx, 0, true); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, cfg.Tasks, readyTimeout(cfg)); err != nil {
		return nil, err
	}
	r := &Result{Scenario: Restart, Tasks: cfg.Tasks, Nodes: 1, ReadyMs: ms(int64(time.Since(start))), StopMs: ms(int64(start.Sub(stop))), Procs: cfg.Procs}
	// The first fire after the restart: at most one schedule period after
	// ready.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if f := c.rec.firstAfterEvent(); f > 0 {
			r.FirstFireMs = ms(f - start.UnixNano())
			break
		}
		if err := sleepUntil(ctx, time.Now().Add(5*time.Millisecond)); err != nil {
			return nil, err
		}
	}
	r.RSSBytes = rss()
	if cfg.Procs {
		r.RSSBytes = c.counters().rss
	}
	return r, nil
}
