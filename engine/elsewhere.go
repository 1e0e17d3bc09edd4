package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Runs elsewhere: a run that outlives its partition's release keeps its
// task's concurrency policy, and its backfill's concurrency, on the next
// owner.
//
// A graceful release waits Config.ReleaseRunWait for the attempts under
// way of tasks that keep their fires apart (forbid, buffer_one, replace),
// or with fires of their backfill under way. Past
// it, the releasing node writes a marker for each such task still running,
// /<prefix>/running/<partition>/<lease>.<run>/<id>, under its session's lease,
// before the release commits: every later owner of the partition reads
// the markers when it takes the partition over, so it sees them. A
// partition whose markers etcd refuses is not released until etcd takes
// them or their runs end (a stuck release): its lock, still the node's,
// keeps every other owner out meanwhile, and past the lease TTL the
// session ends, which cancels the runs as any fence does. The
// releasing node deletes a marker once its attempts end and etcd has the
// retries they handed on (markers.handedOn); its lease takes the marker
// with it when the node crashes or closes.
//
// The owner counts a task's markers as runs in flight: forbid skips its
// fires, buffer_one holds one until the markers go, and replace deletes
// them, which the releasing node, watching its markers, takes for a cancel
// of the run. A marker that holds only fires of the backfill counts so
// too: on one owner a backfill's fire is a run of its task for the task's
// own fires (docs/api.md), and the hand-over must not change that. The
// backfill's fires a marker holds (runningMarker) count against the
// backfill's concurrency there until it goes: the runner starts only as
// many as they leave. They are outside the task's policy,
// and run on past a replace, as on the owner: a replace fire does not
// delete a marker that holds some, but marks it replaced (one etcd
// request a replace fire, as the delete), which the releasing node takes
// for the same cancel of the rest of the run; the marker stays, no run of
// the task for its policy but still the backfill's fires, until they end.
// However many the markers, the owner watches them with one watch a
// partition, the releasing node with one a session.

// runningPrefix is the prefix of partition p's markers.
func (k keys) runningPrefix(p int) string { return fmt.Sprintf("%s/running/%05d/", k.prefix, p) }

// runningMarker is a marker's value: which node runs the task, for an
// operator reading etcd, and how many fires of the task's backfill the
// run holds, which the next owner's runner counts against the backfill's
// concurrency until the marker goes.
type runningMarker struct {
	Node     string `json:"node"`
	Backfill int    `json:"backfill,omitempty"`
	// Replaced: a replace fire of the task on the partition's owner
	// canceled the run but for its backfill's fires, which run on and
	// keep the marker until they end.
	Replaced bool `json:"replaced,omitempty"`
}

// markedRun is a leaver's run that a marker stands for.
type markedRun struct {
	set      *markers
	key      string
	part     int
	rec, gen uint32
	backfill int   // its backfill's fires (runningMarker)
	rev      int64 // the revision etcd took its put at; 0 until then; guarded by set.mu
	ended    bool  // its attempts ended; guarded by set.mu
	// refused: a put of it failed, and etcd may have taken it all the
	// same (its answer lost), so its run's end deletes it, written or
	// not; guarded by set.mu.
	refused bool
	// replaced: the next owner marked it replaced (runningMarker), and
	// its run was canceled but for its backfill's fires; guarded by
	// set.mu.
	replaced bool
	// writing are the retries its run handed on through etcd whose
	// writes have not ended: the marker stays until they have, ended or
	// not its run; guarded by set.mu.
	writing int
}

// markers are one session's markers of runs past their release. A marker
// is deleted once its run ended and etcd took its put, and one watch of
// them all, however many, tells when the next owner deleted one first, or
// marked it replaced (a replace fire), which cancels its run.
type markers struct {
	e     *Engine
	lease clientv3.LeaseID
	life  context.Context // the session's: its lease takes the markers when it ends

	// mu guards the rest, and each run's rev, ended, replaced and
	// writing. It is taken under leavers.mu (leavers.ended, and
	// leavers.retry's handingOn), and pool.runMu under it (gone,
	// rewritten).
	mu       sync.Mutex
	runs     map[string]*markedRun // written and watched, by key
	watching bool                  // watch runs
	dead     []string              // the keys of written markers whose runs ended, to delete
	deleting bool                  // deleteDead runs
}

// markersOf returns the markers of sess, made when the node's session
// changed. Called only from the coordinator.
func (e *Engine) markersOf(sess *membership.Session) *markers {
	if m := e.marks; m != nil && m.lease == sess.Lease() {
		return m
	}
	e.marks = &markers{e: e, lease: sess.Lease(), life: sess.Mutexes().Ctx(), runs: map[string]*markedRun{}}
	return e.marks
}

// run is the marker of the run of task id (record rec of generation gen)
// of partition p. The run's record and generation on this node are in
// its key, with the lease, so that runs of one task outliving two
// releases keep a marker each: on two nodes, or on one that took the
// partition again in between and ran the task there beside its run
// elsewhere (a backfill's fire, or one after an edit to allow). One's end
// then does not delete the other's marker. The owner reads the task's id
// after the key's first slash.
func (m *markers) run(p int, id string, rec, gen uint32) *markedRun {
	key := fmt.Sprintf("%s%x.%x/%s", m.e.keys.runningPrefix(p), int64(m.lease), leavingKey(rec, gen), id)
	return &markedRun{set: m, key: key, part: p, rec: rec, gen: gen}
}

// mark gives run's leavers that keep their fires apart, or run fires of
// their backfill, and still run a marker of set: from now on their last
// attempt's end is told to it. Called after the release was sealed.
func (ls *leavers) mark(run *running, set *markers) []*markedRun {
	if run == nil {
		return nil
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []*markedRun
	for _, k := range run.keys {
		lv := ls.m[k]
		if lv == nil || lv.n == 0 || lv.prof.concurrency == task.ConcurrencyAllow && lv.backfill == 0 {
			continue
		}
		lv.mark = set.run(lv.part, lv.id, uint32(k>>32), uint32(k))
		lv.mark.backfill = min(lv.backfill, lv.n) // those that ended counted as any attempt
		out = append(out, lv.mark)
	}
	return out
}

// markElsewhere marks runs (leavers.mark) under sess's lease, and returns
// those etcd did not take, by partition: their partitions' releases wait
// for them (release, retryStuck), since the next owner would not keep its
// fires apart from them, and the runs go on meanwhile, their partitions'
// locks still this node's. Called only from the coordinator.
func (e *Engine) markElsewhere(ctx context.Context, sess *membership.Session, runs []*markedRun) map[int][]*markedRun {
	n, refused := e.markersOf(sess).put(ctx, runs)
	if n > 0 {
		e.stats.runsMarked.Add(uint64(n))
		e.log.Info("runs go on past their partitions' release; the next owners keep their tasks' fires apart from them (concurrency policies) until they end",
			"runs", n)
	}
	var out map[int][]*markedRun
	for _, r := range refused {
		if out == nil {
			out = map[int][]*markedRun{}
		}
		out[r.part] = append(out[r.part], r)
	}
	return out
}

// markerTries is how many times a release tries a transaction of
// markers before it leaves their partitions' releases stuck: a refusal
// that passes (a leader change, a request timed out) must not hold back
// the release of every partition with a run under way, which the short
// wait for runs (Config.ReleaseRunWait) leaves to markers. A put again is
// the same key under the same lease, so one whose answer was lost is
// taken twice harmlessly.
const markerTries = 3

// put writes the markers of those of ms whose runs have not ended, and
// returns how many etcd took and those it did not take within
// markerTries tries (and ctx), whose runs have not ended.
func (m *markers) put(ctx context.Context, ms []*markedRun) (written int, refused []*markedRun) {
	for chunk := range slices.Chunk(m.going(ms), registry.MaxTxnOps) {
		ops := make([]clientv3.Op, len(chunk))
		for i, r := range chunk {
			val, _ := json.Marshal(runningMarker{Node: m.e.cfg.NodeID, Backfill: r.backfill})
			ops[i] = clientv3.OpPut(r.key, string(val), clientv3.WithLease(m.lease))
		}
		var resp *clientv3.TxnResponse
		var err error
		for try := range markerTries {
			if try > 0 && !sleepCtx(ctx, time.Duration(try)*200*time.Millisecond) {
				break
			}
			if resp, err = m.e.cli.Txn(ctx).Then(ops...).Commit(); err == nil {
				break
			}
		}
		if err != nil {
			m.e.log.Warn("writing the markers of runs past their release failed: their partitions' releases wait until etcd takes them or the runs end",
				"runs", len(chunk), "err", err)
			refused = append(refused, m.refuse(chunk)...)
			continue
		}
		m.written(chunk, resp.Header.Revision)
		written += len(chunk)
	}
	return written, refused
}

// going returns those of ms whose runs have not ended, or whose retries
// handed on through etcd are not written yet: the others need no marker.
func (m *markers) going(ms []*markedRun) []*markedRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(ms), func(r *markedRun) bool { return r.ended && r.writing == 0 })
}

// refuse notes that etcd refused the puts of ms, and returns those whose
// runs have not ended. etcd may have taken a put whose answer did not
// come back: the marker of a run that ended meanwhile goes now, the
// others' when their runs end (ended), if no put is taken before.
func (m *markers) refuse(ms []*markedRun) []*markedRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	var going []*markedRun
	for _, r := range ms {
		r.refused = true
		switch {
		case !r.ended:
			going = append(going, r)
		case r.writing == 0:
			m.deleteLocked(r.key)
		}
	}
	return going
}

// written notes that etcd took the puts of ms at rev: those whose runs
// ended meanwhile go at once, the others are watched.
func (m *markers) written(ms []*markedRun, rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range ms {
		r.rev = rev
		if r.ended && r.writing == 0 {
			m.deleteLocked(r.key)
		} else {
			m.runs[r.key] = r
		}
	}
	if !m.watching && len(m.runs) > 0 {
		m.watching = true
		m.e.marking.Go(func() { m.watch(rev) })
	}
}

// ended notes that r's run ended: its marker goes, once written, and
// once the retries its run handed on through etcd are (handedOn).
func (m *markers) ended(r *markedRun) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r.ended = true
	m.goneIfDoneLocked(r)
}

// handingOn notes that r's run hands a retry on through etcd: r's marker
// stays until its write ended (handedOn), so that the next owner sees the
// marker or the retry, never neither, and the backfill's count of the
// fire holds there throughout (Engine.handedBackfill counts the retry).
func (m *markers) handingOn(r *markedRun) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r.writing++
}

// handedOn notes that the write of a retry of r's run ended.
func (m *markers) handedOn(r *markedRun) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r.writing--
	m.goneIfDoneLocked(r)
}

// goneIfDoneLocked has r's marker deleted once it was written (or its put
// refused), its run ended, and the retries it handed on are in etcd.
// Called with m.mu held.
func (m *markers) goneIfDoneLocked(r *markedRun) {
	if r.ended && r.writing == 0 && (r.rev != 0 || r.refused) {
		m.deleteLocked(r.key)
	}
}

// deleteLocked has marker key deleted, by one goroutine for all the
// markers whose runs end meanwhile (a Close cancels its runs at once).
// Called with m.mu held.
func (m *markers) deleteLocked(key string) {
	m.dead = append(m.dead, key)
	if !m.deleting {
		m.deleting = true
		m.e.marking.Go(m.deleteDead)
	}
}

// deleteDead deletes the markers in dead, and those that join it
// meanwhile, each transaction until etcd takes it or the session ends
// (its lease then takes them), and returns once dead is empty.
func (m *markers) deleteDead() {
	for {
		m.mu.Lock()
		keys := m.dead
		m.dead = nil
		if len(keys) == 0 {
			m.deleting = false
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		for chunk := range slices.Chunk(keys, registry.MaxTxnOps) {
			if err := m.e.deleteMarkers(m.life, chunk); err != nil {
				m.e.log.Debug("the session ended before etcd took the deletes of markers of runs that ended; its lease takes them",
					"markers", len(chunk), "err", err)
			}
		}
	}
}

// watch watches the markers from after rev until none is left or the
// session ends.
func (m *markers) watch(rev int64) {
	m.e.watchDeletes(m.life, m.e.keys.prefix+"/running/", rev, m.watched, m.gone, m.rewritten)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.life.Err() != nil {
		m.watching = false
		clear(m.runs) // the lease took them
	}
}

// watched returns the keys of the markers watched.
func (m *markers) watched(at int64) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k, r := range m.runs {
		if r.rev <= at { // one put after a read of revision at is not missing from it
			out = append(out, k)
		}
	}
	return out
}

// gone applies the delete of marker key, and reports whether markers are
// left to watch. A marker whose run has not ended was deleted by the next
// owner of its partition, for a replace fire: the run is canceled, but
// for a backfill's fires among it (replaceRunning).
func (m *markers) gone(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.runs[key]; r != nil {
		delete(m.runs, key)
		if !r.ended {
			m.e.pool.replaceRunning(r.rec, r.gen) // a backfill's fires run on, as on the owner
		}
	}
	if len(m.runs) == 0 {
		m.watching = false // under the lock: a marker written now starts a watch of its own
		return false
	}
	return true
}

// watchDeletes watches the keys under prefix from after rev, and tells gone
// each key deleted, until gone reports that none it wants is left, or ctx
// ends; and put, when not nil, each key put, with its value. A watch that
// etcd ends (a lost leader, a compaction) is opened again from a read of
// the prefix, which tells gone those of known's keys deleted meanwhile,
// and put the values of the others: known(at) are the keys put at or
// before revision at, those the read would show.
func (e *Engine) watchDeletes(ctx context.Context, prefix string, rev int64, known func(at int64) []string, gone func(key string) bool,
	put func(key string, value []byte)) {
	watchOpts, readOpts := []clientv3.OpOption{clientv3.WithPrefix()}, []clientv3.OpOption{clientv3.WithPrefix()}
	if put == nil {
		watchOpts, readOpts = append(watchOpts, clientv3.WithFilterPut()), append(readOpts, clientv3.WithKeysOnly())
	}
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		wch := e.cli.Watch(clientv3.WithRequireLeader(wctx), prefix, append(watchOpts, clientv3.WithRev(rev+1))...)
		for resp := range wch {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.PUT {
					put(string(ev.Kv.Key), ev.Kv.Value)
				} else if !gone(string(ev.Kv.Key)) {
					cancel()
					return
				}
			}
		}
		cancel()
		gctx, gcancel := context.WithTimeout(ctx, etcdTimeout)
		resp, err := e.cli.Get(gctx, prefix, readOpts...)
		gcancel()
		if err != nil {
			sleepCtx(ctx, time.Second)
			continue
		}
		left := make(map[string][]byte, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			left[string(kv.Key)] = kv.Value
		}
		for _, k := range known(resp.Header.Revision) {
			v, ok := left[k]
			switch {
			case !ok && !gone(k):
				return
			case ok && put != nil:
				put(k, v)
			}
		}
		rev = resp.Header.Revision
	}
}

// rewritten applies a put of marker key: one the next owner of its
// partition marked replaced (a replace fire) has its run canceled but for
// its backfill's fires, which keep the marker until they end.
func (m *markers) rewritten(key string, value []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.runs[key]
	if r == nil || r.replaced || r.ended {
		return // another session's marker, most likely: the watch sees them all
	}
	var v runningMarker
	if json.Unmarshal(value, &v) == nil && v.Replaced {
		r.replaced = true
		m.e.pool.replaceRunning(r.rec, r.gen)
	}
}

// deleteMarkers deletes marker keys in one transaction, trying again while
// etcd refuses until ctx ends, and returns the last error then: one left behind
// goes with its lease only when its node closes or crashes, and a node
// that lives on would keep its task's fires held or skipped for good.
func (e *Engine) deleteMarkers(ctx context.Context, keys []string) error {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpDelete(k)
	}
	return e.commitRetrying(ctx, ops, nil)
}

// replaceMarkers cancels the runs elsewhere of runs for a replace fire,
// in one transaction, trying again while etcd refuses until ctx ends: it
// deletes their markers, or marks replaced (runningMarker) those that
// hold fires of their backfill, if they still stand, under their lease.
func (e *Engine) replaceMarkers(ctx context.Context, runs []elsewhereRun) error {
	ops := make([]clientv3.Op, len(runs))
	for i, r := range runs {
		if !r.replaced {
			ops[i] = clientv3.OpDelete(r.key)
			continue
		}
		val, _ := json.Marshal(runningMarker{Node: r.node, Backfill: r.backfill, Replaced: true})
		ops[i] = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(r.key), ">", 0)},
			[]clientv3.Op{clientv3.OpPut(r.key, string(val), clientv3.WithIgnoreLease())}, nil)
	}
	return e.commitRetrying(ctx, ops, nil)
}

// elsewhereRun is a run elsewhere: its marker's key, its node, how many
// fires of its task's backfill it holds, and whether a replace fire
// canceled the rest of it (runningMarker): then it is not counted in its
// record's running.
type elsewhereRun struct {
	key      string
	node     string
	backfill int
	replaced bool
}

// readElsewhere reads partition p's markers, by task id, and the read's
// revision.
func (e *Engine) readElsewhere(ctx context.Context, p int) (map[string][]elsewhereRun, int64, error) {
	prefix := e.keys.runningPrefix(p)
	resp, err := e.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, err
	}
	var out map[string][]elsewhereRun
	for _, kv := range resp.Kvs {
		_, id, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
		if !ok || id == "" {
			continue
		}
		if out == nil {
			out = map[string][]elsewhereRun{}
		}
		var m runningMarker
		if json.Unmarshal(kv.Value, &m) != nil || m.Backfill < 0 {
			m.Backfill = 0 // a run elsewhere all the same
		}
		out[id] = append(out[id], elsewhereRun{key: string(kv.Key), node: m.Node, backfill: m.Backfill, replaced: m.Replaced})
	}
	return out, resp.Header.Revision, nil
}

// watchElsewhere tells the loop when the markers of runs elsewhere of
// partition p, read at rev (away, by task id), are deleted: the runs
// ended. One watch serves the partition. ctx is the partition's ownership.
func (e *Engine) watchElsewhere(ctx context.Context, p int, away map[string][]elsewhereRun, rev int64) {
	ids := map[string]string{} // by marker key
	for id, runs := range away {
		for _, r := range runs {
			ids[r.key] = id
		}
	}
	e.watchDeletes(ctx, e.keys.runningPrefix(p), rev, func(int64) []string { return slices.Collect(maps.Keys(ids)) }, func(key string) bool {
		if id, ok := ids[key]; ok {
			delete(ids, key)
			_ = e.call(ctx, &elsewhereEndedCmd{part: p, id: id, key: key})
		}
		return len(ids) > 0
	}, nil)
}

// elsewhereEndedCmd: the marker key of task id's run elsewhere is gone.
type elsewhereEndedCmd struct {
	part    int
	id, key string
}

func (c *elsewhereEndedCmd) run(l *loop) { l.elsewhereEnded(c) }

// runElsewhere counts record i's runs elsewhere as its runs in flight,
// but those replaced, and the fires of its backfill among them against the
// backfill's concurrency. Called only from the dispatch loop, as are the
// other loop methods here.
func (l *loop) runElsewhere(i uint32, r *record, runs []elsewhereRun) {
	l.elsewhere[i] = append(l.elsewhere[i], runs...)
	n := counted(runs)
	r.running += uint16(n)
	l.stats.runsElsewhere.Add(int64(n))
}

// counted is how many of runs count as runs of their task: not those
// replaced.
func counted(runs []elsewhereRun) int {
	n := 0
	for _, e := range runs {
		if !e.replaced {
			n++
		}
	}
	return n
}

// elsewhereEnded applies the end of a run elsewhere, as a completion's:
// a fire buffer_one held behind it runs, an ended delete_after_fire task
// goes to the deleter.
func (l *loop) elsewhereEnded(c *elsewhereEndedCmd) {
	i, r, ok := l.tab.lookup(c.id)
	if !ok || int(r.part) != c.part {
		return // released or deleted since
	}
	runs := l.elsewhere[i]
	at := slices.IndexFunc(runs, func(e elsewhereRun) bool { return e.key == c.key })
	if at < 0 {
		return // released, or replaced, since
	}
	if !runs[at].replaced {
		r.running--
		l.stats.runsElsewhere.Add(-1)
	}
	if l.elsewhere[i] = slices.Delete(runs, at, at+1); len(l.elsewhere[i]) == 0 {
		delete(l.elsewhere, i)
	}
	l.admitWaiting(i, r)
	l.checkEnded(i, r)
	if len(l.jobs) > 0 {
		l.pushJobs()
	}
}

// replaceElsewhere has record i's runs elsewhere canceled, for a fire of
// its replace task that starts now: by deleting their markers, or, for a
// run with fires of its backfill, which run on, by marking it replaced,
// and it counts against the backfill's concurrency until its marker goes.
func (l *loop) replaceElsewhere(i uint32, r *record) {
	runs := l.elsewhere[i]
	var unmark []elsewhereRun
	kept := runs[:0]
	for _, e := range runs {
		if !e.replaced {
			r.running--
			e.replaced = e.backfill > 0
			unmark = append(unmark, e)
			if !e.replaced {
				continue
			}
		}
		kept = append(kept, e)
	}
	if len(unmark) == 0 {
		return
	}
	l.stats.runsElsewhere.Add(-int64(len(unmark)))
	clear(runs[len(kept):])
	if len(kept) == 0 {
		delete(l.elsewhere, i)
	} else {
		l.elsewhere[i] = kept
	}
	if l.unmark != nil {
		l.unmark(unmark)
	}
}

// forgetElsewhere forgets record i's runs elsewhere: replaced, or the
// task went.
func (l *loop) forgetElsewhere(i uint32) {
	if runs, ok := l.elsewhere[i]; ok {
		l.stats.runsElsewhere.Add(-int64(counted(runs)))
		delete(l.elsewhere, i)
	}
}

// backfillElsewhere is how many fires of record i's backfill run
// elsewhere, by their markers.
func (l *loop) backfillElsewhere(i uint32) int {
	n := 0
	for _, e := range l.elsewhere[i] {
		n += e.backfill
	}
	return n
}

// runningHere is how many of record i's runs in flight are this node's.
func (l *loop) runningHere(i uint32, r *record) int {
	return int(r.running) - counted(l.elsewhere[i])
}
