package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Runs elsewhere: a run that outlives its partition's release keeps its
// task's concurrency policy on the next owner.
//
// A graceful release waits handOverWait for the attempts under way of
// tasks that keep their fires apart (forbid, buffer_one, replace). Past
// it, the releasing node writes a marker for each such task still running,
// /<prefix>/running/<partition>/<lease>.<run>/<id>, under its session's lease,
// before the release commits: every later owner of the partition reads
// the markers when it takes the partition over, so it sees them. The
// releasing node deletes a marker once its attempts end; its lease takes
// the marker with it when the node crashes or closes.
//
// The owner counts a task's markers as runs in flight: forbid skips its
// fires, buffer_one holds one until the markers go (each is watched),
// and replace deletes them, which the releasing node, watching its
// markers, takes for a cancel of the run. The marker's lease and run
// (the run's record and generation on its node) are in its key, so that
// runs of one task outliving two releases keep a marker each: on two
// nodes, or on one that took the partition again in between and ran the
// task there beside its run elsewhere (a backfill's fire, or one after
// an edit to allow). One's end then does not delete the other's marker.
// The owner reads the task's id after the key's first slash.

// runningPrefix is the prefix of partition p's markers.
func (k keys) runningPrefix(p int) string { return fmt.Sprintf("%s/running/%05d/", k.prefix, p) }

// runningKey is the marker of run m on the node of lease.
func (k keys) runningKey(lease clientv3.LeaseID, m marked) string {
	return fmt.Sprintf("%s%x.%x/%s", k.runningPrefix(m.part), int64(lease), leavingKey(m.rec, m.gen), m.id)
}

// runningMarker is a marker's value: which node runs the task, for an
// operator reading etcd.
type runningMarker struct {
	Node string `json:"node"`
}

// marked is a leaver's run that a marker stands for.
type marked struct {
	part int
	id   string
	rec  uint32
	gen  uint32
	gone chan struct{} // closed once the leaver's attempts ended
}

// mark picks run's leavers that keep their fires apart and still run,
// for markers: from now on their last attempt's end closes gone. Called
// after the release was sealed.
func (ls *leavers) mark(run *running) []marked {
	if run == nil {
		return nil
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []marked
	for _, k := range run.keys {
		lv := ls.m[k]
		if lv == nil || lv.n == 0 || lv.prof.concurrency == task.ConcurrencyAllow {
			continue
		}
		lv.gone = make(chan struct{})
		out = append(out, marked{part: lv.part, id: lv.id, rec: uint32(k >> 32), gen: uint32(k), gone: lv.gone})
	}
	return out
}

// markElsewhere writes the markers of ms under sess's lease, each watched
// by a goroutine of its own until its run ends (then it deletes the
// marker) or the next owner deletes it (then it cancels the run): they
// are few, one per task still running past handOverWait. Markers etcd
// does not take are logged: the next owner then does not keep its fires
// apart from those runs.
func (e *Engine) markElsewhere(ctx context.Context, sess *membership.Session, ms []marked) {
	if len(ms) == 0 {
		return
	}
	val, _ := json.Marshal(runningMarker{Node: e.cfg.NodeID})
	lease, life := sess.Lease(), sess.Mutexes().Ctx()
	written := 0
	for chunk := range slices.Chunk(ms, registry.MaxTxnOps) {
		ops := make([]clientv3.Op, len(chunk))
		for i, m := range chunk {
			ops[i] = clientv3.OpPut(e.keys.runningKey(lease, m), string(val), clientv3.WithLease(lease))
		}
		resp, err := e.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			e.log.Warn("writing the markers of runs past their release failed: their next owners do not keep their fires apart from them (concurrency policies)",
				"tasks", len(chunk), "err", err)
			continue
		}
		for _, m := range chunk {
			go e.watchMarked(life, e.keys.runningKey(lease, m), resp.Header.Revision, m)
		}
		written += len(chunk)
	}
	e.stats.runsMarked.Add(uint64(written))
	if written > 0 {
		e.log.Info("runs go on past their partitions' release; the next owners keep their tasks' fires apart from them (concurrency policies) until they end",
			"tasks", written)
	}
}

// watchMarked deletes m's marker key, written at rev, once m's run ended,
// and cancels the run when the next owner deleted the marker first (a
// fire of a replace task). life is the session's: its lease takes the
// marker when it ends.
func (e *Engine) watchMarked(life context.Context, key string, rev int64, m marked) {
	ctx, cancel := context.WithCancel(life)
	defer cancel()
	go func() {
		select {
		case <-m.gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	if e.awaitGone(ctx, key, rev) {
		e.pool.cancelRunning(m.rec, m.gen)
		return
	}
	select {
	case <-m.gone:
		e.deleteMarkers(life, []string{key})
	default: // the session ended
	}
}

// awaitGone waits until key, present at rev, is deleted (true), or ctx
// ends (false). A watch that etcd ends (a lost leader, a compaction) is
// opened again from a read of the key.
func (e *Engine) awaitGone(ctx context.Context, key string, rev int64) bool {
	for {
		if e.waitDeleted(ctx, key, rev) == nil {
			return true
		}
		gctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		resp, err := e.cli.Get(gctx, key)
		cancel()
		switch {
		case ctx.Err() != nil:
			return false
		case err == nil && len(resp.Kvs) == 0:
			return true
		case err == nil:
			rev = resp.Header.Revision
		default:
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Second):
			}
		}
	}
}

// deleteMarkers deletes marker keys, trying again every second until ctx
// ends: one left behind goes with its lease only when its node closes or
// crashes, and a node that lives on would keep its task's fires held or
// skipped for good.
func (e *Engine) deleteMarkers(ctx context.Context, keys []string) {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpDelete(k)
	}
	for {
		tctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		_, err := e.cli.Txn(tctx).Then(ops...).Commit()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			e.log.Warn("deleting the markers of runs elsewhere failed: a run replaced is not canceled, and the marker of a run that ended stays until its node's lease ends",
				"keys", keys, "err", err)
			return
		case <-time.After(time.Second):
		}
	}
}

// readElsewhere reads partition p's markers, by task id, and the read's
// revision.
func (e *Engine) readElsewhere(ctx context.Context, p int) (map[string][]string, int64, error) {
	prefix := e.keys.runningPrefix(p)
	resp, err := e.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, 0, err
	}
	var out map[string][]string
	for _, kv := range resp.Kvs {
		_, id, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
		if !ok || id == "" {
			continue
		}
		if out == nil {
			out = map[string][]string{}
		}
		out[id] = append(out[id], string(kv.Key))
	}
	return out, resp.Header.Revision, nil
}

// watchElsewhere tells the loop when the marker key of task id's run
// elsewhere, read at rev, is deleted: the run ended. ctx is the
// partition's ownership.
func (e *Engine) watchElsewhere(ctx context.Context, p int, id, key string, rev int64) {
	if e.awaitGone(ctx, key, rev) {
		_ = e.call(ctx, &elsewhereEndedCmd{part: p, id: id, key: key})
	}
}

// elsewhereEndedCmd: the marker key of task id's run elsewhere is gone.
type elsewhereEndedCmd struct {
	part    int
	id, key string
}

func (c *elsewhereEndedCmd) run(l *loop) { l.elsewhereEnded(c) }

// runElsewhere counts record i's runs elsewhere, by their marker keys, as
// its runs in flight. Called only from the dispatch loop, as are the other
// loop methods here.
func (l *loop) runElsewhere(i uint32, r *record, keys []string) {
	l.elsewhere[i] = append(l.elsewhere[i], keys...)
	r.running += uint16(len(keys))
	l.stats.runsElsewhere.Add(int64(len(keys)))
}

// elsewhereEnded applies the end of a run elsewhere, as a completion's:
// a fire buffer_one held behind it runs, an ended delete_after_fire task
// goes to the deleter.
func (l *loop) elsewhereEnded(c *elsewhereEndedCmd) {
	i, r, ok := l.tab.lookup(c.id)
	if !ok || int(r.part) != c.part || !slices.Contains(l.elsewhere[i], c.key) {
		return // released, deleted, or replaced since
	}
	if l.elsewhere[i] = slices.DeleteFunc(l.elsewhere[i], func(k string) bool { return k == c.key }); len(l.elsewhere[i]) == 0 {
		delete(l.elsewhere, i)
	}
	r.running--
	l.stats.runsElsewhere.Add(-1)
	l.admitWaiting(i, r)
	l.checkEnded(i, r)
	if len(l.jobs) > 0 {
		l.pushJobs()
	}
}

// replaceElsewhere has record i's runs elsewhere canceled, by deleting
// their markers, for a fire of its replace task that starts now.
func (l *loop) replaceElsewhere(i uint32, r *record) {
	keys := l.elsewhere[i]
	if len(keys) == 0 {
		return
	}
	l.forgetElsewhere(i)
	r.running -= uint16(len(keys))
	if l.unmark != nil {
		l.unmark(keys)
	}
}

// forgetElsewhere forgets record i's runs elsewhere: replaced, or the
// task went.
func (l *loop) forgetElsewhere(i uint32) {
	if keys, ok := l.elsewhere[i]; ok {
		l.stats.runsElsewhere.Add(-int64(len(keys)))
		delete(l.elsewhere, i)
	}
}

// runningHere is how many of record i's runs in flight are this node's.
func (l *loop) runningHere(i uint32, r *record) int {
	return int(r.running) - len(l.elsewhere[i])
}
