package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/registry"
)

// Watermarks: how far a session got, so that its successors after a crash
// resume there.
//
// A fire goes through three points, each behind the one before:
//
//	through  the loop's dispatch point: every fire the wheel released up to
//	         it was handed to the pool (loop.through, published with the
//	         jobs pushed so far; never past a fire armed and not released)
//	taken    the pool's watermark: every job pushed before a published
//	         point was taken by a worker, so every fire up to the point
//	         started (pool.watermark)
//	acked    the watermark etcd acknowledged: written every
//	         WatermarkInterval under /<prefix>/watermarks/<node>/<session>,
//	         held at the mark of any uncommitted release (holds)
//
// Dispatch runs at most Lead past acked (the bounded lead), so a successor
// that resumes from acked repeats at most Lead of fires; while etcd's
// NOSPACE alarm refuses the write, dispatch runs on (acked.limit). A partition's
// checkpoint names the session (nameSession) only once acked passed the
// point where the partition was armed.
//
// Each write also carries, per partition, the etcd revision up to which
// the loop had armed its task changes when its dispatch point reached the
// watermark (appliedLog): every fire due by the watermark of a change up
// to it was taken. A successor after a crash decides the one-shots due by
// the watermark by it, as after a release (decideApplied), not by the
// writers' clocks.

// acked is the session's watermark as etcd last acknowledged it, and
// whether etcd refuses to record a newer one for lack of space.
type acked struct {
	at atomic.Int64 // unix ns; 0 before the first acknowledgement
	// noSpace: the last write was refused by etcd's NOSPACE alarm. Nobody
	// can take a partition over while it lasts (every lock and checkpoint
	// write is refused too), so dispatch runs on without the lead rather
	// than stop every fire of the node; see limit.
	noSpace atomic.Bool
	// retries is the publish of the waiting retries and fires
	// (retryMarks) whose lists the last acknowledged value carried: a
	// fire of the schedule that a value listed as waiting starts once
	// one of a later publish is acknowledged (loop.gated).
	retries atomic.Uint64
}

// limit is how far dispatch may run at now: Lead past the acknowledged
// watermark (the bounded lead), or up to now while etcd has no space to
// record one. ok is false before the first acknowledgement.
func (a *acked) limit(now int64, lead time.Duration) (limit int64, ok bool) {
	at := a.at.Load()
	if at == 0 {
		return 0, false
	}
	if a.noSpace.Load() {
		return now, true
	}
	return min(now, at+int64(lead)), true
}

// nameSession completes an acquire: once the session's acknowledged
// watermark is past the point where p was armed, every fire of p due
// before it has been taken, and the checkpoint may name the session so
// that a successor after a crash resumes from its watermark (repeating at
// most the bounded lead) instead of from p's resume point, and without the
// pending fires, which ran. It keeps trying for as long as the partition
// is held: a checkpoint left unnamed would make a crash days later replay
// from the old point. It runs beside the partition's watch and ends with
// it; a release that comes first wins, as the write needs the lock.
func (e *Engine) nameSession(ctx context.Context, sess *membership.Session, m *concurrency.Mutex, p int, cp checkpoint) {
	c := &throughCmd{reply: make(chan int64, 1)}
	armed, err := request(ctx, e, c, c.reply)
	if err != nil {
		return
	}
	t := time.NewTicker(e.cfg.WatermarkInterval / 2)
	defer t.Stop()
	for e.acked.at.Load() <= armed {
		select {
		case <-ctx.Done():
			return
		case <-sess.Done():
			return
		case <-t.C:
		}
	}
	// The handed-over fires were taken too. After goes: from now on the
	// session's watermark is the resume point, and a crash past it may
	// repeat a catch-up fire, as after any misfire (doc.go). Applied goes
	// with it: it says what the previous owner had, not this session; and
	// so do the triggers fired there, which this node holds.
	cp.Session, cp.Applied, cp.Pending, cp.After, cp.Fired = sessionID(sess), 0, nil, nil, nil
	var b backoff
	for {
		_, err := e.putCheckpoint(ctx, m, p, cp)
		if err == nil || ctx.Err() != nil || sess.Fenced() {
			return
		}
		e.log.Warn("naming the session in a checkpoint failed; retrying", "partition", p, "err", err, "in", b.next())
		if !b.wait(ctx) {
			return
		}
	}
}

// sessionID names a session in checkpoints and watermark keys: its lease.
func sessionID(s *membership.Session) string { return fmt.Sprintf("%x", int64(s.Lease())) }

// writeWatermarks records the session's watermark every WatermarkInterval:
// one etcd request per node whatever the fire rate. A fenced node writes
// nothing, so its successors resume from what it had taken before.
//
// The write is conditioned on the session's lease still holding the node
// key, so that the lease is checked every interval at no extra request: a
// node whose lease ended while its clock did not see it (a frozen VM) ends
// its session at its next write, having run at most the bounded lead past
// its last acknowledged watermark.
//
// A write is waited for up to etcdTimeout, even past the lead: given up
// at the lead, no write to an etcd that answers in more than that would
// be acknowledged, and dispatch would stand at the lead for as long as
// etcd stayed slow, with the session live (its keep-alives answered).
// Waited for, each answer moves the lead on, and fires run late by what
// etcd takes past the lead.
func (e *Engine) writeWatermarks(ctx context.Context) {
	t := time.NewTicker(e.cfg.WatermarkInterval)
	defer t.Stop()
	slow := false // the last write took longer than the lead, and the log said so
	revs := appliedRevs{armed: map[int]int64{}}
	for {
		// The watermark first: the resume points of the fires it passed
		// were noted before it passed them (holds.dropped). Both before the
		// session's check: a drop once the session is fenced resets holds.
		w := e.holds.cap(e.loop.applieds.fold(revs.armed))
		resumes := e.holds.resumes()
		retries, seq := e.loop.retryMarks.carriedAt()
		lists := carriedLists{ends: e.loop.endMarks.carried(), retries: retries}
		if s := e.sess.Load(); s == nil || s.Fenced() {
			// No write of a fenced session is refused for NOSPACE: its
			// successor runs within the lead until one is.
			e.acked.noSpace.Store(false)
		} else {
			val, whole := revs.value(w, resumes, lists, sessionID(s))
			wctx, cancel := context.WithTimeout(ctx, max(e.cfg.Lead, etcdTimeout))
			start := time.Now()
			resp, err := e.cli.Txn(wctx).
				If(clientv3.Compare(clientv3.LeaseValue(s.Key()), "=", int64(s.Lease()))).
				Then(clientv3.OpPut(e.keys.watermark(e.cfg.NodeID, sessionID(s)), val)).
				Commit()
			cancel()
			if err == nil && resp.Succeeded && whole {
				revs.wrote(resp.Header.Revision, lists)
			}
			if took := time.Since(start); err == nil && (took > e.cfg.Lead) != slow {
				slow = !slow
				if slow {
					e.log.Warn("etcd took longer than the lead to record the node watermark: fires run late by the difference",
						"took", took.Round(time.Millisecond), "lead", e.cfg.Lead)
				} else {
					e.log.Info("etcd records the node watermark within the lead again")
				}
			}
			switch {
			case err == nil && !resp.Succeeded:
				e.log.Warn("the session's lease no longer holds the node key; ending the session")
				s.Lost()
			case err == nil:
				e.acked.retries.Store(seq)
				e.acked.at.Store(w)
				if e.acked.noSpace.Swap(false) {
					e.log.Info("etcd has space again: the node watermark is recorded, dispatch runs within the lead again")
				}
				select {
				case e.ackCh <- struct{}{}:
				default:
				}
			case errors.Is(err, registry.ErrNoSpace):
				if !e.acked.noSpace.Swap(true) {
					e.log.Warn("etcd is out of space (NOSPACE alarm): firing goes on without recording the node watermark; "+
						"if this node crashes before the alarm is cleared, its successor resumes from the last recorded one",
						"recorded", time.Unix(0, e.acked.at.Load()).UTC())
				}
				select {
				case e.ackCh <- struct{}{}: // the loop may be waiting at the lead
				default:
				}
				e.checkLease(ctx, s)
			case ctx.Err() == nil:
				// The lead is lifted only while the latest refusal is NOSPACE.
				e.acked.noSpace.Store(false)
				e.log.Warn("writing the node watermark failed; dispatch pauses at the lead", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// appliedLog is the history of the partitions' applied revisions
// (partState.applied) that the watermark writer has not taken yet: the
// loop notes each change, counted, and the writer folds the changes up to
// the count its watermark's mark carries. A watermark w then goes with
// the applied revisions as they stood when the loop's dispatch point
// reached w: a change armed before that was armed behind w, so its fires
// due by w were released before the dispatch point passed them, and taken
// before the watermark did. Read at the write instead, a revision could
// name a put armed since into the past, whose fire no worker took yet
// (too high: a successor would take it for fired, and miss it).
//
// While the watermark stands (workers behind, a lead the writer cannot
// pass, etcd refusing the write) the loop goes on noting, a change a
// watch batch: the log keeps of a partition's changes between two counts
// that a mark can carry only the last (compact), which is all a fold to
// either count sees, so that it grows with the marks in flight (a change
// a partition each, twice over), not with time.
type appliedLog struct {
	pool    *pool      // whose marks carry the counts the writer folds at
	mu      sync.Mutex // guards changes and room; taken before the pool's
	changes []appliedChange
	room    int // the length past which note compacts changes
}

// appliedChange is the seq-th change of an applied revision: p's is rev
// (0: p is not armed here).
type appliedChange struct {
	seq uint64
	p   int
	rev int64
}

// appliedRoom is the length past which note first compacts the log:
// more than a moving watermark leaves between two writes (a node that
// loads 1 024 partitions at once notes 1 024 changes), so that only a
// standing one's log is compacted.
const appliedRoom = 4096

// note records the seq-th change, through being the count the loop's
// dispatch point goes with (loop.throughSeq), which the marks to come
// carry or pass. Called only from the dispatch loop.
func (a *appliedLog) note(seq uint64, p int, rev int64, through uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.changes = append(a.changes, appliedChange{seq: seq, p: p, rev: rev})
	if len(a.changes) > max(a.room, appliedRoom) {
		// Under mu, so that no fold at a count read before comes between
		// the marks read and the changes compacted.
		a.compact(append(a.pool.seqs(), through))
		a.room = 2 * len(a.changes)
	}
}

// compact keeps, of each partition's changes between two consecutive
// counts of seqs (ascending), only the last: a fold to a count folds all
// of them or none. The changes past seqs' last are all noted before the
// next count a mark carries, which is the loop's count when it moves its
// dispatch point. Called with mu held.
func (a *appliedLog) compact(seqs []uint64) {
	seen := map[int]bool{} // the partitions of the span with a change kept
	keep := len(a.changes)
	s := len(seqs) // the span is (seqs[s-1], seqs[s]]
	for i := len(a.changes) - 1; i >= 0; i-- {
		c := a.changes[i]
		if s > 0 && c.seq <= seqs[s-1] {
			for s > 0 && c.seq <= seqs[s-1] {
				s--
			}
			clear(seen)
		}
		if !seen[c.p] {
			seen[c.p] = true
			keep--
			a.changes[keep] = c
		}
	}
	a.changes = append(a.changes[:0], a.changes[keep:]...)
}

// fold applies to revs the changes up to the count the pool's watermark
// goes with, forgets them, and returns the watermark.
func (a *appliedLog) fold(revs map[int]int64) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	w, seq := a.pool.marked()
	a.foldTo(seq, revs)
	return w
}

// foldTo applies the changes up to the seq-th to revs, and forgets them.
// Called with mu held.
func (a *appliedLog) foldTo(seq uint64, revs map[int]int64) {
	n := 0
	for _, c := range a.changes {
		if c.seq > seq {
			break
		}
		if c.rev == 0 {
			delete(revs, c.p)
		} else {
			revs[c.p] = c.rev
		}
		n++
	}
	a.changes = slices.Delete(a.changes, 0, n)
	if len(a.changes) == 0 {
		a.room = 0 // the stand is over: the next compacts at appliedRoom, not at twice this one's log
	}
}

// appliedRevs are the applied revisions the writer's watermark goes with,
// by partition (armed), and the whole of them as the session's watermark
// key last held them (base, written at etcd revision baseRev): a write
// carries only the partitions that differ from base, which a successor
// reads from the key's history. Every partition's revision in every
// write would be 15 KB a value for a node of 1 024 partitions, 150 KB a
// second at the default interval, kept by etcd until it compacts. The
// marks of ended paused tasks (endwaits.go) go the same way: a value that
// names a base has the base's (baseLists), and marks that changed make a
// value that carries them all, the next base. The waiting retries
// (waitingretries.go) change as often as tasks fail: a value that names
// a base carries those of the partitions whose retries differ from the
// base's (retriesSince), so that a failure costs the value its
// partition's retries, not every revision.
type appliedRevs struct {
	armed     map[int]int64
	base      map[int]int64
	baseLists carriedLists
	baseRev   int64     // 0: no base yet, the next value carries them all
	baseAt    time.Time // wall clock: it ages against etcd's compaction
	session   string    // whose key holds base: a new session's has none
}

// appliedBaseAge is how long a write may name the revisions of an earlier
// one: well within the history etcd keeps (an hour on the embedded etcd),
// so that a successor can still read them.
const appliedBaseAge = time.Minute

// value returns the value of watermark w with the resume points resumes
// and the lists lists for session's key, and whether it carries every
// revision and list (the next base, once etcd took it: wrote).
func (a *appliedRevs) value(w int64, resumes map[int]int64, lists carriedLists, session string) (string, bool) {
	if session != a.session {
		a.session, a.base, a.baseLists, a.baseRev = session, nil, carriedLists{}, 0
	}
	if len(a.armed) == 0 {
		return encodeWatermark(w, resumes, nil, 0, lists), false
	}
	if a.baseRev != 0 && time.Since(a.baseAt) <= appliedBaseAge && sameLists(lists.ends, a.baseLists.ends) {
		if diff := a.diff(); len(diff) <= len(a.armed)/4 {
			return encodeWatermark(w, resumes, diff, a.baseRev, carriedLists{retries: retriesSince(lists.retries, a.baseLists.retries)}), false
		}
	}
	return encodeWatermark(w, resumes, a.armed, 0, lists), true
}

// diff returns the revisions of armed that differ from base's, 0 for a
// partition no longer armed here: none to go by.
func (a *appliedRevs) diff() map[int]int64 {
	diff := map[int]int64{}
	for p, rev := range a.armed {
		if a.base[p] != rev {
			diff[p] = rev
		}
	}
	for p := range a.base {
		if _, ok := a.armed[p]; !ok {
			diff[p] = 0
		}
	}
	return diff
}

// retriesSince returns the retries of the partitions of now that differ
// from base's, and no retries (an empty list) for those of base that have
// none now: a successor takes the others from base. nil: none differ.
func retriesSince(now, base map[int]waitingRetries) map[int]waitingRetries {
	var diff map[int]waitingRetries
	add := func(p int, w waitingRetries) {
		if diff == nil {
			diff = map[int]waitingRetries{}
		}
		diff[p] = w
	}
	for p, w := range now {
		if !w.equal(base[p]) {
			add(p, w)
		}
	}
	for p := range base {
		if _, ok := now[p]; !ok {
			add(p, waitingRetries{})
		}
	}
	return diff
}

// wrote takes the revisions of the last value, and its lists, which etcd
// took at rev, as the base of the next.
func (a *appliedRevs) wrote(rev int64, lists carriedLists) {
	a.base, a.baseLists, a.baseRev, a.baseAt = maps.Clone(a.armed), lists, rev, time.Now()
}

// watermarkValue is a watermark key's value: the watermark, the resume
// points of the partitions whose releases dropped fires from the queue
// and are uncommitted (holds), the revisions up to which the partitions'
// task changes were armed (appliedRevs): those in Applied, and for the
// others those of the key's value at revision Base, and the marks of the
// paused delete_after_fire tasks whose last fire ended here (endwaits.go)
// and the retries waiting for their backoff (waitingretries.go): EndWaits
// and Retries, or with a Base the marks of its value, and its retries but
// for the partitions in Retries. A node that arms no
// partition and holds no release writes the watermark alone, an RFC 3339
// time, as every value was before resume points. Nodes from before
// applied revisions read the time and resume points of a value with them,
// and this one reads their values, whose partitions go by updated_at;
// nodes from before the marks, or the retries, read the rest of a value
// with them (JSON's unknown fields are passed over), and this one finds
// none in theirs.
type watermarkValue struct {
	At         time.Time              `json:"at"`
	Partitions map[int]time.Time      `json:"partitions,omitempty"`
	Applied    map[int]int64          `json:"applied,omitempty"`
	Base       int64                  `json:"applied_base,omitempty"`
	EndWaits   map[int]endWaits       `json:"end_waits,omitempty"`
	Retries    map[int]waitingRetries `json:"retries,omitempty"`
	// RetriesThrough is the latest through of the lists of Retries
	// (waitingRetries.through): at or after the point each was
	// published at, it tells a successor the same retries started. One a
	// value, not one a list: 42 bytes a partition.
	RetriesThrough time.Time `json:"retries_through,omitzero"`
}

// encodeWatermark returns the value of watermark w with the resume points
// of partitions, the applied revisions of applied (nil: none), the others
// those of the key's value at etcd revision base (0: none), and the lists
// lists (none, or with a base those of its value).
func encodeWatermark(w int64, partitions, applied map[int]int64, base int64, lists carriedLists) string {
	at := time.Unix(0, w).UTC()
	if len(partitions) == 0 && len(applied) == 0 && base == 0 && len(lists.ends) == 0 && len(lists.retries) == 0 {
		b, _ := at.MarshalText()
		return string(b)
	}
	v := watermarkValue{At: at, Applied: applied, Base: base, EndWaits: lists.ends, Retries: lists.retries}
	var through int64
	for _, w := range lists.retries {
		through = max(through, w.through)
	}
	if through != 0 {
		v.RetriesThrough = time.Unix(0, through).UTC()
	}
	if len(partitions) > 0 {
		v.Partitions = make(map[int]time.Time, len(partitions))
		for p, r := range partitions {
			v.Partitions[p] = time.Unix(0, r).UTC()
		}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// decodeWatermark reads a watermark value, each list of its retries with
// its RetriesThrough; ok is false for one it cannot read.
func decodeWatermark(b []byte) (v watermarkValue, ok bool) {
	if len(b) > 0 && b[0] == '{' {
		if json.Unmarshal(b, &v) != nil || v.At.IsZero() {
			return watermarkValue{}, false
		}
		if !v.RetriesThrough.IsZero() {
			for p, w := range v.Retries {
				w.through = v.RetriesThrough.UnixNano()
				v.Retries[p] = w
			}
		}
	} else if v.At.UnmarshalText(b) != nil {
		return watermarkValue{}, false
	}
	return v, true
}

// resume returns where a successor of partition p resumes after the
// session: the watermark, or p's resume point when it is earlier.
func (v watermarkValue) resume(p int) int64 {
	w := v.At.UnixNano()
	if r, ok := v.Partitions[p]; ok {
		w = min(w, r.UnixNano())
	}
	return w
}

// deadMarks are the watermarks of dead sessions that a round of acquires
// read (resume; a round: acquires since none was in flight): after a
// crash every partition of the session resumes from its watermark, and
// goes by the applied revisions of the key's value, or of the value it
// names in the key's history (applied_base). Read once for the round,
// not for each partition: a session that held 1 024 partitions was read
// 2 048 times. A dead session writes no more, so the first read is what
// every later one would get; and any value of the key goes with its own
// revisions, as every write does.
type deadMarks struct {
	mu   sync.Mutex // guards read
	read map[string]*deadRead
}

// deadRead is the read of a watermark key: mark and err are set once
// done is closed.
type deadRead struct {
	done chan struct{}
	mark deadMark
	err  error
}

func newDeadMarks() *deadMarks { return &deadMarks{read: map[string]*deadRead{}} }

// deadMark is a dead session's watermark key as read: its value v, and
// the applied revisions and lists of the value at v.Base (nil: none, or
// not known).
type deadMark struct {
	v           watermarkValue
	found       bool // the key holds a value that decodes
	base        map[int]int64
	baseEnds    map[int]endWaits
	baseRetries map[int]waitingRetries
}

// get returns the watermark key key as read, reading it with read for
// the first to ask. A read that failed is not kept: those that waited
// for it read for themselves (it may have failed for its own acquire's
// cancel), and the next to ask reads again.
func (d *deadMarks) get(ctx context.Context, key string, read func(context.Context, string) (deadMark, error)) (deadMark, error) {
	d.mu.Lock()
	r, ok := d.read[key]
	if !ok {
		r = &deadRead{done: make(chan struct{})}
		d.read[key] = r
	}
	d.mu.Unlock()
	if !ok {
		r.mark, r.err = read(ctx, key)
		if r.err != nil {
			d.mu.Lock()
			delete(d.read, key)
			d.mu.Unlock()
		}
		close(r.done)
		return r.mark, r.err
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return deadMark{}, ctx.Err()
	}
	if r.err != nil {
		return read(ctx, key)
	}
	return r.mark, nil
}

// readDeadMark reads a dead session's watermark key, and when its value
// names a base, the base's applied revisions, end waits and retries from
// etcd's history. A base etcd compacted is not known, logged.
func (e *Engine) readDeadMark(ctx context.Context, key string) (deadMark, error) {
	wr, err := e.cli.Get(ctx, key)
	if err != nil {
		return deadMark{}, fmt.Errorf("read watermark %s: %w", key, err)
	}
	var m deadMark
	if len(wr.Kvs) == 0 {
		return m, nil
	}
	if m.v, m.found = decodeWatermark(wr.Kvs[0].Value); !m.found || m.v.Base == 0 {
		return m, nil
	}
	resp, err := e.cli.Get(ctx, key, clientv3.WithRev(m.v.Base))
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		e.log.Warn("a crashed session's applied revisions are compacted out of etcd's history; its one-shots go by updated_at, "+
			"its ended paused delete_after_fire tasks stay after their resume, and its waiting retries are lost", "key", key, "revision", m.v.Base)
	case err != nil:
		return deadMark{}, fmt.Errorf("read watermark %s at its base, revision %d: %w", key, m.v.Base, err)
	case len(resp.Kvs) > 0:
		if base, ok := decodeWatermark(resp.Kvs[0].Value); ok {
			m.base, m.baseEnds, m.baseRetries = base.Applied, base.EndWaits, base.Retries
		}
	}
	return m, nil
}

// applied returns the revision up to which the session had armed p's task
// changes when its dispatch point reached the watermark (0: not known).
func (m deadMark) applied(p int) int64 {
	if rev, ok := m.v.Applied[p]; ok {
		return rev
	}
	return m.base[p]
}

// endWaits returns the session's marks of p's ended paused tasks (none:
// not known).
func (m deadMark) endWaits(p int) endWaits {
	if m.v.Base != 0 {
		return m.baseEnds[p]
	}
	return m.v.EndWaits[p]
}

// retries returns the session's waiting retries of p (none: not known).
func (m deadMark) retries(p int) waitingRetries {
	if w, ok := m.v.Retries[p]; ok || m.v.Base == 0 {
		return w
	}
	return m.baseRetries[p]
}

// checkLease makes the check a refused watermark write did not: that the
// session's lease still holds the node key (a read, which NOSPACE allows).
// It has the write's time, the lead: an answer later than that comes after
// the next write is due anyway.
func (e *Engine) checkLease(ctx context.Context, s *membership.Session) {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.Lead)
	defer cancel()
	resp, err := e.cli.Get(rctx, s.Key())
	if err == nil && (len(resp.Kvs) == 0 || resp.Kvs[0].Lease != int64(s.Lease())) {
		e.log.Warn("the session's lease no longer holds the node key; ending the session")
		s.Lost()
	}
}

// collectWatermarksRetrying runs collectWatermarks once a session owns
// its partitions, and again, backing off, while it does not finish: in a
// cluster whose other nodes acquire and release, a checkpoint changes
// while one collection runs often enough that a single try left the keys
// of dead sessions, up to 15 KB each, to pile up restart after restart.
func (e *Engine) collectWatermarksRetrying(ctx context.Context) {
	for wait := time.Second; !e.collectWatermarks(ctx); wait *= 2 {
		if wait > 32*time.Second {
			e.log.Info("collecting the watermark keys of dead sessions did not go through; they stay until a node's next session collects them")
			return
		}
		if !sleepCtx(ctx, wait) {
			return
		}
	}
}

// collectWatermarks deletes the watermark keys that no checkpoint needs
// any more: those of sessions that are gone and that no unreleased
// checkpoint names. It reports whether it went through: false when etcd
// failed, or a checkpoint changed while it ran.
func (e *Engine) collectWatermarks(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wm, err := e.cli.Get(ctx, e.keys.watermarks(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return false
	}
	if len(wm.Kvs) == 0 {
		return true
	}
	cps, err := e.cli.Get(ctx, e.keys.checkpoints(), clientv3.WithPrefix())
	if err != nil {
		return false
	}
	needed := map[string]bool{}
	for _, kv := range cps.Kvs {
		var cp checkpoint
		if json.Unmarshal(kv.Value, &cp) == nil && !cp.Released && cp.Session != "" {
			needed[e.keys.watermark(cp.Node, cp.Session)] = true
		}
	}
	live := map[string]bool{}
	if ms, _, err := membership.List(ctx, e.cli, e.cfg.Prefix); err == nil {
		for _, m := range ms {
			live[m.ID] = true
		}
	} else {
		return false
	}
	if s := e.sess.Load(); s != nil {
		needed[e.keys.watermark(e.cfg.NodeID, sessionID(s))] = true
	}
	var dels []clientv3.Op
	for _, kv := range wm.Kvs {
		key := string(kv.Key)
		node, _, _ := strings.Cut(strings.TrimPrefix(key, e.keys.watermarks()), "/")
		// A live node's other sessions are its own business: it may still
		// be writing. Only keys of sessions nobody can need are removed.
		if !needed[key] && (!live[node] || node == e.cfg.NodeID) {
			dels = append(dels, clientv3.OpDelete(key))
		}
	}
	// Only if no checkpoint changed since it was read: an acquire that
	// failed may have put back one that names a session read as unneeded.
	unchanged := clientv3.Compare(clientv3.ModRevision(e.keys.checkpoints()), "<", cps.Header.Revision+1).WithPrefix()
	for chunk := range slices.Chunk(dels, registry.MaxTxnOps-1) {
		resp, err := e.cli.Txn(ctx).If(unchanged).Then(chunk...).Commit()
		if err != nil || !resp.Succeeded {
			return false
		}
	}
	return true
}
