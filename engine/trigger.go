package engine

import (
	"context"
	"time"

	"github.com/shardcron/shardcron/registry"
)

// Triggers: a fire asked for through the API, outside the schedule.
// Registry.Trigger writes /<prefix>/triggers/<partition>/<unix ms>/<id>;
// the owner's trigger watch (or its acquire, for triggers written while
// nobody owned the partition) hands it to the loop, and deletes the key
// once the loop took it.

type triggerKey struct {
	id string
	at int64
}

type earlyTrigger struct {
	triggerCmd
	until int64 // dropped after this (unix ns)
}

// trigger fires a trigger once. The trigger watch and a partition's watch
// are separate streams: a trigger written right after its task's put can
// come before the task, and one can come while its partition loads, so it
// waits for its task (triggerWait at most). The watch and an acquire's
// read of pending triggers can both deliver one trigger: it fires once.
func (l *loop) trigger(c *triggerCmd) bool {
	if !l.parts[c.part].owned || l.fenced() {
		return false // its key stays for the owner's load to find
	}
	if _, fired := l.triggered[triggerKey{c.id, c.at}]; fired {
		return true
	}
	for i := range l.early {
		if l.early[i].id == c.id && l.early[i].at == c.at {
			return true
		}
	}
	now := l.cfg.Clock.Now().UnixNano()
	if !l.triggerNow(c, now) {
		l.early = append(l.early, earlyTrigger{triggerCmd: *c, until: now + int64(triggerWait)})
	}
	l.retryTriggers()
	return true
}

// triggerNow fires c if the loop holds its task, and reports whether it did.
func (l *loop) triggerNow(c *triggerCmd, now int64) bool {
	if !l.parts[c.part].owned {
		return false
	}
	i, r, ok := l.tab.lookup(c.id)
	if !ok {
		return false
	}
	l.triggered[triggerKey{c.id, c.at}] = now + int64(triggerWait)
	l.admit(i, r, l.profs.list[r.prof], c.at, now, kindTrigger, c.over)
	l.pushJobs()
	return true
}

// retryTriggers fires the early triggers whose task came, drops those that
// waited too long, and forgets fired ones past triggerWait.
func (l *loop) retryTriggers() {
	if len(l.early) == 0 && len(l.triggered) == 0 {
		return
	}
	now := l.cfg.Clock.Now().UnixNano()
	keep := l.early[:0]
	for _, t := range l.early {
		if !l.triggerNow(&t.triggerCmd, now) && now < t.until {
			keep = append(keep, t)
		}
	}
	clear(l.early[len(keep):])
	l.early = keep
	for k, until := range l.triggered {
		if now >= until {
			delete(l.triggered, k)
		}
	}
}

// watchTriggers fires the triggers of the partitions this node owns,
// resuming after the last revision it saw when its watch breaks (progress
// notifications keep that revision recent). If etcd compacted past it, it
// reads the pending triggers instead and goes on from that read.
func (e *Engine) watchTriggers(ctx context.Context) {
	var rev int64
	for ctx.Err() == nil {
		for resp := range e.reg.WatchTriggers(ctx, rev) {
			if resp.CompactRevision != 0 {
				if r, err := e.reg.PendingTriggers(ctx); err == nil {
					for _, kv := range r.Kvs {
						e.fireTrigger(ctx, kv.Key, kv.Value)
					}
					rev = r.Header.Revision
				}
				break
			}
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				e.fireTrigger(ctx, ev.Kv.Key, ev.Kv.Value)
				rev = ev.Kv.ModRevision
			}
			if resp.IsProgressNotify() {
				rev = max(rev, resp.Header.Revision)
			}
		}
		sleepCtx(ctx, time.Second)
	}
}

// fireTrigger hands a trigger to the loop and deletes its key once the
// loop took it; a trigger of a partition in hand-over stays for the next
// owner's load.
func (e *Engine) fireTrigger(ctx context.Context, k, value []byte) {
	key := string(k)
	p, at, id, ok := e.reg.ParseTrigger(key)
	if !ok || !e.Owns(p) {
		return
	}
	c := &triggerCmd{part: p, id: id, at: at * int64(time.Millisecond), over: registry.DecodeTriggerValue(value), reply: make(chan bool, 1)}
	if took, err := request(ctx, e, c, c.reply); err != nil || !took {
		return
	}
	if _, err := e.cli.Delete(ctx, key); err != nil {
		// The key is the trigger's only record: left behind, it fires
		// again at the partition's next acquire.
		e.log.Warn("deleting a fired trigger failed; retrying", "key", key, "err", err)
		e.wg.Go(func() { e.deleteTrigger(key) })
	}
}

// deleteTrigger deletes a fired trigger's key, retrying until it is gone
// or the node closes.
func (e *Engine) deleteTrigger(key string) {
	var b backoff
	for b.wait(e.runCtx) {
		if _, err := e.cli.Delete(e.runCtx, key); err == nil {
			return
		}
	}
}
