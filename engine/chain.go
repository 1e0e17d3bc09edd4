package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
	"golang.org/x/sync/errgroup"
)

// Chains: when a fire ends after its last attempt, the worker that ran it
// queues its task's on_success (it succeeded) or on_failure (it failed or
// timed out) targets here, and the chain writer triggers each through the
// registry's trigger path with the fire's scheduled time, so that the
// target's fire has the idempotency key "<target>@<scheduled ms of the
// fire that ended>". The same fire ending twice (a repeat after a crash)
// triggers the same keys: receivers deduplicate them, and two trigger
// writes of one target and time are one etcd key, which its owner fires
// once. A trigger of the target at that time that is another fire (with
// an override, or a retry handed on) keeps its key: the chain's takes
// a millisecond after it (registry.TriggerAt).
//
// The queue lives in memory: a crash between a fire's end and its
// triggers' writes loses them. Close writes what is queued once the
// workers are drained. It is bounded (chainQueueMax): while etcd refuses
// the writes (out of reach, or its NOSPACE alarm, through which the node
// fires on) a fleet of chained tasks would otherwise grow it without end;
// past the bound the ended fires' triggers are dropped and counted
// (Stats.ChainsDropped).

// chainFire is the ended fire of a task with targets to trigger, or the
// failed attempt of a task whose retry goes to etcd (leavers.retry): the
// writer writes that retry as a trigger of the task itself.
type chainFire struct {
	from    string // the task whose fire ended
	sched   int64  // its scheduled time, unix ns
	targets []string
	retry   *registry.Retry // the retry to write; nil: none
	over    *task.Override  // the retry's override
	created int64           // the retry's: its task was created at or before it (leaver.created)
	// written, when not nil, is told once the retry's write ended (etcd
	// took it, or it was given up): its run's marker waits for it
	// (markers.handedOn).
	written func()
}

// chainQueueMax bounds the ended fires waiting for their triggers to be
// written: at about 100 bytes each (the struct and a target's id), some
// 6.5 MiB at most.
const chainQueueMax = 1 << 16

// chainQueue is the queue of chain triggers to write; safe for concurrent
// use by the workers and the writer.
type chainQueue struct {
	mu      sync.Mutex // guards q and full
	q       []chainFire
	max     int
	full    bool          // dropping since the queue last had room, for one log line per episode
	dropped atomic.Uint64 // ended fires whose triggers were dropped on a full queue
	wake    chan struct{} // signalled when q becomes non-empty
	log     *slog.Logger
}

func newChainQueue(log *slog.Logger) *chainQueue {
	return &chainQueue{max: chainQueueMax, wake: make(chan struct{}, 1), log: log}
}

// add queues f's triggers, or drops them when the queue is full. A retry
// is queued past the bound: the trigger is its only record, and retries
// are few (the attempts under way at a release).
func (c *chainQueue) add(f chainFire) {
	c.mu.Lock()
	if len(c.q) >= c.max && f.retry == nil {
		first := !c.full
		c.full = true
		c.mu.Unlock()
		c.dropped.Add(1)
		if first {
			c.log.Warn("chain trigger queue full (etcd refuses or is slow to take them); dropping the triggers of ended fires until it has room",
				"queued", c.max, "task", f.from)
		}
		return
	}
	if len(c.q) < c.max {
		c.full = false
	}
	c.q = append(c.q, f)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *chainQueue) take() []chainFire {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.q
	c.q = nil
	return q
}

// writeChains writes the queued chain triggers until stop is closed, then
// writes what is left (etcdTimeout at most) and returns.
func (e *Engine) writeChains(q *chainQueue, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // ends with this function
		select {
		case <-stop:
			// A write under way when stop closes ends etcdTimeout later at
			// most, as the trigger deleter's: without a deadline, one
			// that etcd out of reach held (a partition, where requests
			// hang) held Close for as long as the outage lasted.
			time.AfterFunc(etcdTimeout, cancel)
		case <-ctx.Done():
		}
	}()
	missing := missingTargets{log: e.log, max: missingMax}
	for {
		select {
		case <-q.wake:
			e.triggerChains(ctx, q.take(), &missing)
		case <-stop:
			e.triggerChains(ctx, q.take(), &missing)
			return
		}
	}
}

// chainParallel is how many chain triggers are written at once: each is a
// transaction of its own (its target must exist), and one at a time the
// writer took 5 400 a second against 13 000 (BenchmarkChainWriter), which
// a burst of chained fires outruns.
const chainParallel = 16

// triggerChains writes the triggers of fs, chainParallel at once,
// retrying each on etcd errors until it is written or ctx ends: at Close,
// etcdTimeout after the workers drained (writeChains), for a write under
// way then as for one queued after. A target that does not exist is
// skipped and told to missing: the registry allows missing targets on
// request.
func (e *Engine) triggerChains(ctx context.Context, fs []chainFire, missing *missingTargets) {
	var g errgroup.Group
	g.SetLimit(chainParallel)
	var mu sync.Mutex // guards missing
	for _, f := range fs {
		if f.retry != nil {
			g.Go(func() error {
				e.triggerRetry(ctx, f)
				if f.written != nil {
					f.written()
				}
				return nil
			})
			continue
		}
		at := time.Unix(0, f.sched).UTC()
		for _, id := range f.targets {
			g.Go(func() error {
				if err := e.triggerChain(ctx, f.from, id, at); errors.Is(err, registry.ErrNotFound) {
					mu.Lock()
					missing.skipped(time.Now(), f.from, id, at)
					mu.Unlock()
				}
				return nil
			})
		}
	}
	g.Wait()
}

// triggerChain writes the trigger of target id at at, chained from task
// from, as triggerChains does. It returns registry.ErrNotFound when the
// target does not exist, the last error when it gave up, else nil.
func (e *Engine) triggerChain(ctx context.Context, from, id string, at time.Time) error {
	var b backoff
	for {
		err := e.reg.TriggerAt(ctx, id, at)
		if err == nil {
			return nil
		}
		if errors.Is(err, registry.ErrNotFound) {
			return registry.ErrNotFound
		}
		e.log.Warn("writing a chain trigger failed; retrying", "task", from, "target", id, "err", err)
		if !b.wait(ctx) {
			return err
		}
	}
}

// triggerRetry writes f's retry, as triggerChains writes a target's
// trigger. A task deleted since, or put again, has no retry.
func (e *Engine) triggerRetry(ctx context.Context, f chainFire) {
	at := time.Unix(0, f.sched).UTC()
	var b backoff
	for {
		err := e.reg.TriggerRetry(ctx, f.from, at, *f.retry, f.over, f.created)
		if err == nil || errors.Is(err, registry.ErrNotFound) {
			return
		}
		e.log.Warn("handing a retry on through etcd failed; retrying", "task", f.from, "scheduled_at", at, "attempt", f.retry.Attempt, "err", err)
		if !b.wait(ctx) {
			e.log.Warn("a retry was not handed on: etcd did not take it before the node stopped", "task", f.from, "scheduled_at", at, "attempt", f.retry.Attempt)
			return
		}
	}
}

// missingEvery is how often one chain whose target does not exist is
// logged: a task firing every second would otherwise log every second.
const missingEvery = 10 * time.Minute

// missingMax bounds the chains missingTargets remembers, at about 100
// bytes each. Past it, a chain it could not remember is logged at every
// skip, as if unbounded: that takes more chains missing their targets
// within missingEvery than this.
const missingMax = 1 << 16

// missingTargets logs the chains whose target does not exist, once per
// chain (task and target) every missingEvery, with the triggers skipped
// since. Used by the chain writer alone.
type missingTargets struct {
	log   *slog.Logger
	max   int // chains remembered at most: missingMax
	chain map[[2]string]*missedChain
	swept time.Time // when chains logged missingEvery ago were last forgotten
}

type missedChain struct {
	logged  time.Time
	skipped int // since logged
}

// skipped notes that the trigger of target by from's fire at was skipped.
func (m *missingTargets) skipped(now time.Time, from, target string, at time.Time) {
	k := [2]string{from, target}
	c := m.chain[k]
	if c != nil && now.Sub(c.logged) < missingEvery {
		c.skipped++
		return
	}
	skipped := 1
	if c != nil {
		skipped += c.skipped
	}
	m.log.Warn("a chain target does not exist; not triggered", "task", from, "target", target, "scheduled_at", at,
		"skipped", skipped, "next_log_in", missingEvery)
	if c != nil {
		c.logged, c.skipped = now, 0
		return
	}
	if len(m.chain) >= m.max && now.Sub(m.swept) >= missingEvery {
		// A chain logged missingEvery ago is logged at its next skip
		// anyway: forgetting it loses only the count of skips since. At
		// most one sweep an interval, so that a full map of chains all
		// logged within it costs no sweep a skip.
		for key, old := range m.chain {
			if now.Sub(old.logged) >= missingEvery {
				delete(m.chain, key)
			}
		}
		m.swept = now
	}
	if len(m.chain) < m.max {
		if m.chain == nil {
			m.chain = map[[2]string]*missedChain{}
		}
		m.chain[k] = &missedChain{logged: now}
	}
}
