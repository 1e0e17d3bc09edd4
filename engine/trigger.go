package engine

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Triggers: a fire asked for through the API, outside the schedule.
// Registry.Trigger writes /<prefix>/triggers/<partition>/<unix ms>/<id>;
// the owner's trigger watch (or its acquire, for triggers written while
// nobody owned the partition) hands it to the loop.
//
// The key is the trigger's only record, so it stays until the fire starts
// here (a worker took it) or ends without running (skipped by its
// concurrency policy, its task deleted, or never loaded within
// triggerWait): then triggerEnds deletes it. A trigger queued, buffered
// or early when its partition is handed over, or when its node fences or
// crashes, keeps its key, and the next owner's acquire reads it; a
// release waits for the deletes of the triggers that started here before
// it commits, so that the next owner does not fire them again.

// triggerKey is a trigger as the loop remembers it: a partition's task and
// the trigger's time (unix ns, whole milliseconds).
type triggerKey struct {
	part int
	id   string
	at   int64
}

// triggerFire is a trigger as its key gives it.
type triggerFire struct {
	part int
	id   string
	at   int64          // unix ns, whole milliseconds
	over *task.Override // the body or payload of this fire; nil: the task's
}

func (c *triggerFire) key() triggerKey { return triggerKey{c.part, c.id, c.at} }

type earlyTrigger struct {
	triggerFire
	until int64 // dropped after this (unix ns)
}

// triggers fires each trigger of fires once. The trigger watch and a
// partition's watch are separate streams: a trigger written right after
// its task's put can come before the task, and one can come while its
// partition loads, so it waits for its task (triggerWait at most). The
// watch and an acquire's read of pending triggers can both deliver one
// trigger: it fires once.
func (l *loop) triggers(fires []triggerFire) {
	if l.fenced() {
		return // the keys stay for the next owner's load to find
	}
	now := l.cfg.Clock.Now().UnixNano()
	for i := range fires {
		c := &fires[i]
		if !l.parts[c.part].owned {
			continue // its key stays for the owner's load to find
		}
		if _, seen := l.triggered[c.key()]; seen {
			continue // fired, or waiting for its task
		}
		if !l.triggerNow(c, now) {
			l.triggered[c.key()] = now + int64(triggerWait)
			l.early = append(l.early, earlyTrigger{triggerFire: *c, until: now + int64(triggerWait)})
		}
	}
	if now >= l.forgetAt {
		l.retryTriggers()
	}
}

// triggerNow fires c if the loop holds its task, and reports whether it did.
func (l *loop) triggerNow(c *triggerFire, now int64) bool {
	if !l.parts[c.part].owned {
		return false
	}
	i, r, ok := l.tab.lookup(c.id)
	if !ok {
		return false
	}
	l.triggered[c.key()] = now + int64(triggerWait)
	l.admit(i, r, l.profs.list[r.prof], c.at, now, kindTrigger, c.over)
	l.pushJobs()
	return true
}

// retryTriggers fires the early triggers whose task came, drops those that
// waited too long, and forgets fired ones past triggerWait, once a second:
// a bulk trigger remembers tens of thousands, which each of its triggers
// used to walk.
func (l *loop) retryTriggers() {
	if len(l.early) == 0 && len(l.triggered) == 0 {
		return
	}
	now := l.cfg.Clock.Now().UnixNano()
	keep := l.early[:0]
	for _, t := range l.early {
		switch {
		case l.triggerNow(&t.triggerFire, now):
		case now < t.until:
			keep = append(keep, t)
		default:
			l.pool.ends.add(t.key()) // its task never came: the trigger ends here
		}
	}
	clear(l.early[len(keep):])
	l.early = keep
	if now < l.forgetAt {
		return
	}
	l.forgetAt = now + int64(time.Second)
	maps.DeleteFunc(l.triggered, func(_ triggerKey, until int64) bool { return now >= until })
}

// watchTriggers fires the triggers of the partitions this node owns,
// resuming after the last revision it saw when its watch breaks (progress
// notifications keep that revision recent). If etcd compacted past it, it
// reads the pending triggers instead, fires those written since, and goes
// on from that read.
func (e *Engine) watchTriggers(ctx context.Context) {
	var rev int64
	for ctx.Err() == nil {
		for resp := range e.reg.WatchTriggers(ctx, rev) {
			if resp.CompactRevision != 0 {
				if r, err := e.reg.PendingTriggers(ctx); err == nil {
					// The others came before: queued or buffered here, or
					// not this node's.
					e.fireTriggers(ctx, slices.DeleteFunc(r.Kvs, func(kv *mvccpb.KeyValue) bool { return kv.ModRevision <= rev }))
					rev = r.Header.Revision
				}
				break
			}
			if resp.Err() != nil {
				break
			}
			kvs := make([]*mvccpb.KeyValue, len(resp.Events))
			for i, ev := range resp.Events {
				kvs[i] = ev.Kv
				rev = ev.Kv.ModRevision
			}
			e.fireTriggers(ctx, kvs)
			if resp.IsProgressNotify() {
				rev = max(rev, resp.Header.Revision)
			}
		}
		sleepCtx(ctx, time.Second)
	}
}

// fireTriggers hands the triggers of kvs (trigger keys) of the partitions
// this node owns to the loop, in one command: a bulk trigger's watch
// responses hold hundreds. One of a partition in hand-over stays for the
// next owner's load.
func (e *Engine) fireTriggers(ctx context.Context, kvs []*mvccpb.KeyValue) {
	fires := make([]triggerFire, 0, len(kvs))
	for _, kv := range kvs {
		p, at, id, ok := e.reg.ParseTrigger(string(kv.Key))
		if ok && e.Owns(p) {
			fires = append(fires, triggerFire{part: p, id: id, at: at * int64(time.Millisecond), over: registry.DecodeTriggerValue(kv.Value)})
		}
	}
	if len(fires) > 0 {
		c := &triggersCmd{fires: fires, reply: make(chan struct{}, 1)}
		_, _ = request(ctx, e, c, c.reply)
	}
}

// triggerEnds queues the keys of triggers whose fire started here, or
// ended without running, for deleteTriggers to delete in transactions of
// many. Workers add to it when they take a trigger's job, under the pool's
// lock: once the jobs a release waits for are taken, the keys of those
// that started are queued. It holds no more than the triggers pending in
// etcd; safe for concurrent use.
type triggerEnds struct {
	mu      sync.Mutex // guards the rest
	q       []triggerKey
	added   uint64        // keys ever queued
	deleted uint64        // keys ever deleted (or given up at Close), the first of q next
	wake    chan struct{} // signalled when q becomes non-empty
	moved   chan struct{} // closed, and replaced, when keys are deleted
}

func newTriggerEnds() *triggerEnds {
	return &triggerEnds{wake: make(chan struct{}, 1), moved: make(chan struct{})}
}

// add queues k's key for deletion.
func (t *triggerEnds) add(k triggerKey) {
	t.mu.Lock()
	t.q = append(t.q, k)
	t.added++
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// next returns up to n of the first queued keys, which stay queued until
// done.
func (t *triggerEnds) next(n int) []triggerKey {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.q[:min(n, len(t.q))])
}

// done takes the first n queued keys off the queue: deleted.
func (t *triggerEnds) done(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.q[:n])
	t.q = t.q[n:]
	t.deleted += uint64(n)
	close(t.moved)
	t.moved = make(chan struct{})
}

// len returns how many keys are queued.
func (t *triggerEnds) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.q)
}

// flush waits until the keys queued before it are deleted, or ctx ends.
func (t *triggerEnds) flush(ctx context.Context) error {
	t.mu.Lock()
	end := t.added
	for t.deleted < end {
		moved := t.moved
		t.mu.Unlock()
		select {
		case <-moved:
		case <-ctx.Done():
			return ctx.Err()
		}
		t.mu.Lock()
	}
	t.mu.Unlock()
	return nil
}

// deleteTriggers deletes the keys triggerEnds queues until stop is closed,
// then what is left (etcdTimeout at most), retrying while etcd refuses.
func (e *Engine) deleteTriggers(t *triggerEnds, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-stop
		time.AfterFunc(etcdTimeout, cancel) // the last deletes, for Close
	}()
	defer cancel()
	var b backoff
	for {
		batch := t.next(registry.MaxTxnOps)
		if len(batch) == 0 {
			select {
			case <-t.wake:
				continue
			case <-stop:
				return
			}
		}
		ops := make([]clientv3.Op, len(batch))
		for i, k := range batch {
			ops[i] = e.reg.TriggerDelete(k.part, k.id, k.at/int64(time.Millisecond))
		}
		tctx, tcancel := context.WithTimeout(ctx, etcdTimeout)
		_, err := e.cli.Txn(tctx).Then(ops...).Commit()
		tcancel()
		if err == nil {
			t.done(len(batch))
			b.reset()
			continue
		}
		if ctx.Err() != nil {
			// Left behind, a key fires again at its partition's next
			// acquire.
			e.log.Warn("deleting the keys of triggers fired here failed; their next owners may fire them again",
				"keys", t.len(), "err", err)
			return
		}
		e.log.Warn("deleting the keys of triggers fired here failed; retrying", "keys", len(batch), "err", err, "in", b.next())
		b.wait(ctx)
	}
}
