package engine

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Triggers: a fire asked for through the API, outside the schedule.
// Registry.Trigger writes /<prefix>/triggers/<partition>/<unix ms>/<id>;
// the owner's trigger watch (or its acquire, for triggers written while
// nobody owned the partition) hands it to the loop.
//
// The key is the trigger's only record, so it stays until the fire starts
// here (a worker took it; for a task kept apart, started it: pool.track)
// or ends without running (skipped by its concurrency policy, its task
// deleted, or put again after a delete (checkTriggers), or never loaded
// within triggerWait): then triggerEnds deletes it, if it still holds the
// put that fired or ended (triggerEnd). A trigger queued, buffered or
// early when its partition is handed over, or when its node fences or
// crashes, keeps its key, and the next owner's acquire reads it; so does
// one a worker took and a fence, or an undone acquire, cut before it
// started (pool.takeUnstarted, loop.forgetUnstarted). A release waits
// for the deletes of the triggers that started here before it commits,
// so that the next owner does not fire them again.
//
// A trigger can also be a retry a former owner handed on (leavers): its
// value carries the attempt and when it is due, and the owner holds it
// waiting for its backoff, as a retry handed over in a checkpoint, and
// deletes its key at once.

// triggerKey is a trigger as the loop remembers it: a partition's task and
// the trigger's time (unix ns, whole milliseconds).
type triggerKey struct {
	part int
	id   string
	at   int64
}

// triggerFire is a trigger as its key gives it.
type triggerFire struct {
	part  int
	id    string
	at    int64           // unix ns, whole milliseconds
	rev   int64           // the key's revision (ModRevision)
	over  *task.Override  // the body or payload of this fire; nil: the task's
	retry *registry.Retry // a retry handed on by a former owner (leavers); nil: the trigger's own fire
	bf    *backfillRun    // a backfill's retry: its backfill's fires handed over (Engine.handedBackfill)
	// checked is the revision of the read by which checkTriggers found
	// its task created before its key (0: none); checking says that such
	// a read is under way, while it waits among the early triggers.
	checked  int64
	checking bool
	// prev is, for a key put again after its trigger fired here, the
	// revision of the key that fired (0: none): its task's creation, read,
	// tells whether it is that fire or a trigger of the task put again
	// since (checkedAgain).
	prev int64
}

func (f *triggerFire) key() triggerKey { return triggerKey{f.part, f.id, f.at} }

// end is the end of f's put of its key, for triggerEnds.
func (f *triggerFire) end() triggerEnd { return triggerEnd{f.key(), f.rev} }

// triggerEnd is a put of a trigger's key, at revision rev (its
// ModRevision), that fired or ended here: its delete deletes that put
// alone, and a key put again since stays (registry.DeleteTriggers),
// another trigger, or one this node ends at that put in its turn.
type triggerEnd struct {
	triggerKey
	rev int64
}

// attempt is the attempt of its fire that f is when a retry, else 0.
func (f *triggerFire) attempt() uint16 {
	if f.retry == nil {
		return 0
	}
	return f.retry.Attempt
}

// triggerKeyOf is the key of record r's trigger at at (unix ns).
func (l *loop) triggerKeyOf(r *record, at int64) triggerKey {
	return triggerKey{int(r.part), l.tab.id(r), at}
}

// triggerKey is the key of j, a trigger's job.
func (j *job) triggerKey() triggerKey { return triggerKey{int(j.part), j.id, j.sched} }

// triggerEnd is the end of the put of j's key that j fires.
func (j *job) triggerEnd() triggerEnd { return triggerEnd{j.triggerKey(), j.extra.trig} }

// seenTrigger is a trigger the loop fired or holds early: until when it
// remembers it, and the last revision of its key it saw.
type seenTrigger struct {
	until, rev int64
	attempt    uint16 // the retry its key carried (registry.Retry); 0: the trigger's own fire
	early      bool
	ended      bool // its fire ended here
	again      bool // its key was put again while its fire waited or ran: it goes when the fire ends
	handed     bool // its put at rev fired on the partition's previous owner (handedTriggers)
}

// triggerRead is the acquire's read of a partition's pending triggers, at
// revision rev.
type triggerRead struct {
	part int
	rev  int64
}

// triggers fires each trigger of c once. The trigger watch and a
// partition's watch are separate streams: a trigger written right after
// its task's put can come before the task, so it waits for its task
// (triggerWait at most). The watch and an acquire's read can both deliver
// a trigger: the watch's events at or before the read are passed over, and
// one delivered twice (same revision) fires once. A key put again after
// the loop took it (two chains of one target and second, two nodes that
// trigger a task in one millisecond) is that fire: its key goes too;
// unless its task was deleted and put again since, which a read of its
// creation tells (checkedAgain).
// Called only from the dispatch loop, as are the other loop methods here.
func (l *loop) triggers(c *triggersCmd) {
	if l.fenced() {
		return // the keys stay for the next owner's load to find
	}
	now := l.cfg.Clock.Now().UnixNano()
	for i := range c.fires {
		f := &c.fires[i]
		ps := &l.parts[f.part]
		if !ps.owned || (c.read == nil && f.rev <= ps.triggersRead) {
			continue // its key stays for the owner's load; or the acquire's read had it
		}
		s, seen := l.triggered[f.key()]
		if seen && f.rev > s.rev && f.attempt() != s.attempt && f.retry != nil {
			// Not that fire put again, but a retry of it handed on by the
			// node that ran its attempt: its partition went and came back
			// (the fire was this node's trigger, or an earlier retry).
			delete(l.triggered, f.key())
			if s.early {
				l.early.keepOf(f.id, func(e *triggerFire) bool { return e.key() != f.key() })
			}
			seen = false
		}
		if seen {
			if f.rev > s.rev && !s.early {
				// Put again: that fire's, or a trigger of its task
				// deleted and put again since, another fire, which the
				// partition's watch may not have brought yet. The key's
				// revision is noted, so that its second delivery (the
				// watch and an acquire's read) is not read again.
				f.prev, f.checking = s.rev, true
				s.rev, s.handed = f.rev, false
				l.triggered[f.key()] = s
				l.checks.add(*f)
				l.early.add(*f)
			} else if f.rev > s.rev {
				l.putAgain(f.key(), f.rev)
			} else if f.rev == s.rev && s.handed {
				// The put that fired on the previous owner, whose delete
				// did not reach etcd before the release.
				l.pool.ends.add(f.end())
			}
			continue
		}
		if !l.triggerNow(f, now) {
			l.holdEarly(*f, now)
		}
	}
	if c.read != nil && l.parts[c.read.part].owned {
		l.parts[c.read.part].triggersRead = c.read.rev
	}
}

// putAgain takes key k, put again at revision rev, for the fire of its
// trigger here: once that fire ended, the delete at its start is past, and
// the key goes now; before, it goes when the fire ends, and stays should
// the fire be handed over unrun.
func (l *loop) putAgain(k triggerKey, rev int64) {
	s := l.triggered[k]
	s.rev, s.again, s.handed = rev, !s.ended, false
	l.triggered[k] = s
	if s.ended {
		l.pool.ends.add(triggerEnd{k, rev})
	}
}

// triggerNow fires f if the loop holds its task, and reports whether it
// did. A task that may have been created after f's key was written
// (partState.created) waits for checkTriggers to read its creation: a
// trigger names its task's id, and a task deleted and put again under it
// is another task, which the trigger must not fire.
func (l *loop) triggerNow(f *triggerFire, now int64) bool {
	ps := &l.parts[f.part]
	if !ps.owned || f.checking {
		return false
	}
	i, r, ok := l.tab.lookup(f.id)
	if !ok {
		return false
	}
	if f.rev < ps.created && f.checked < ps.created {
		f.checking = true
		l.checks.add(*f)
		return false
	}
	if f.retry != nil {
		// A retry a former owner handed on: it waits for its backoff
		// here, as a retry handed over in a checkpoint does, and goes
		// with the partition as any waiting retry. Its key goes now.
		l.triggered[f.key()] = seenTrigger{until: now + int64(triggerWait), rev: f.rev, attempt: f.attempt(), ended: true}
		var trig int64
		if f.retry.Trigger {
			trig = f.rev
		}
		if l.waitHandedRetry(i, r, f.retry.At.UnixNano(), f.retry.Attempt, f.retry.Due.UnixNano(), handedExtra(f.over, f.bf, trig), false) && f.bf != nil {
			// Counted against the backfill's concurrency until it ends,
			// as one a checkpoint hands over (takeOver).
			f.bf.tookOver(f.retry.At.UnixNano())
		}
		l.pool.ends.add(f.end())
		return true
	}
	l.triggered[f.key()] = seenTrigger{until: now + int64(triggerWait), rev: f.rev}
	l.admit(i, r, l.profs.list[r.prof], ownFire{at: f.at, kind: kindTrigger, extra: &fireExtra{over: f.over, trig: f.rev}}, now)
	l.pushJobs()
	return true
}

// triggerEnded notes that the fire of trigger k ended here; a key put again
// while it waited or ran goes now.
func (l *loop) triggerEnded(k triggerKey) {
	s, ok := l.triggered[k]
	if !ok {
		return
	}
	if s.again {
		l.pool.ends.add(triggerEnd{k, s.rev})
	}
	s.ended, s.again = true, false
	l.triggered[k] = s
}

// droppedTrigger ends trigger k, whose fire (with override over) waited
// for a worker when its task was deleted, or changed to what this node
// cannot read, by the partition's changes up to revision rev. A key
// written after rev is of a task put again under the id since, which the
// trigger watch brought before the partition's watch brought the delete:
// it waits for that task among the early triggers.
func (l *loop) droppedTrigger(k triggerKey, over *task.Override, rev int64) {
	s := l.triggered[k]
	if s.rev <= rev {
		l.pool.ends.add(triggerEnd{k, s.rev})
		return
	}
	l.holdEarly(triggerFire{part: k.part, id: k.id, at: k.at, rev: s.rev, over: over}, l.cfg.Clock.Now().UnixNano())
}

// holdEarly holds f among the early triggers, until triggerWait from now
// at most, for its task to come.
func (l *loop) holdEarly(f triggerFire, now int64) {
	l.triggered[f.key()] = seenTrigger{until: now + int64(triggerWait), rev: f.rev, attempt: f.attempt(), early: true}
	l.early.add(f)
}

// retryTriggers fires the early triggers of defs, the tasks a load chunk
// or a change just armed, or starts the reads of their creations. It
// tries no other: an early trigger waits for its task, absent until a
// load or a change arms it, or for a read under way
// (triggerFire.checking), which its answer ends (checked). Behind a bulk
// trigger pending, 100 000 wait, and each change went through them all.
func (l *loop) retryTriggers(defs []taskDef) {
	if l.early.len() == 0 {
		return
	}
	now := l.cfg.Clock.Now().UnixNano()
	for i := range defs {
		l.early.keepOf(defs[i].id, func(f *triggerFire) bool { return !l.triggerNow(f, now) })
	}
}

// checked takes checkTriggers' answer for the triggers of c: a trigger
// whose task was created after its key was written, or is gone, was
// written for a task of the same id deleted since, and ends unrun; the
// others are checked as of c.rev, and fire if their task is here: no other
// early trigger can fire on an answer, so the loop goes through the
// triggers of the tasks c answers alone (earlyTriggers.keepOf), and tries
// no other again (retryTriggers). An answer for a trigger forgotten
// meanwhile (its partition was released) finds nothing. Called only from
// the dispatch loop.
func (l *loop) checked(c *checkedCmd) {
	if l.fenced() {
		return
	}
	// The keys read for, each at every revision read for: a key put again
	// twice after its fire (triggers) waits for two checks, which one
	// answer can carry.
	type askedKey struct {
		k   triggerKey
		rev int64
	}
	asked := make(map[askedKey]bool, len(c.fires))
	for _, f := range c.fires {
		asked[askedKey{f.key(), f.rev}] = true
	}
	now := l.cfg.Clock.Now().UnixNano()
	done := make(map[string]bool, len(c.fires)) // the tasks whose triggers were gone through
	for _, a := range c.fires {
		if done[a.id] {
			continue
		}
		done[a.id] = true
		l.early.keepOf(a.id, func(f *triggerFire) bool {
			if !f.checking || !asked[askedKey{f.key(), f.rev}] {
				return true // not asked: one waiting for its task, or a key put again since
			}
			created := c.created[f.id]
			if f.prev != 0 {
				return l.checkedAgain(f, created, c.rev, now)
			}
			if created == 0 || created > f.rev {
				l.pool.ends.add(f.end())
				s := l.triggered[f.key()]
				s.early, s.ended = false, true
				l.triggered[f.key()] = s
				return false
			}
			f.checking, f.checked = false, c.rev
			return !l.triggerNow(f, now)
		})
	}
}

// checkedAgain takes the creation revision, read at rev, of the task of
// f, a key put again after its trigger fired here (triggerFire.prev), and
// reports whether f stays early. Created before the key that fired, the
// task is that fire's, and f is that fire; created after f, or gone, f is
// a trigger of a task deleted since, unrun; created between them, f is a
// trigger of the task put again, another fire, checked as of rev, which
// fires now if its task is here.
func (l *loop) checkedAgain(f *triggerFire, created, rev, now int64) bool {
	switch {
	case created != 0 && created <= f.prev:
		l.putAgain(f.key(), f.rev)
		return false
	case created == 0 || created > f.rev:
		l.pool.ends.add(f.end())
		return false
	}
	l.triggered[f.key()] = seenTrigger{until: now + int64(triggerWait), rev: f.rev, early: true}
	f.prev, f.checking, f.checked = 0, false, rev
	return !l.triggerNow(f, now)
}

// earlyTriggers are the triggers the loop holds before they can fire:
// those waiting for their task, and those whose task's creation
// checkTriggers reads (triggerFire.checking), by task, so that an answer
// goes through the triggers of the tasks it answers alone, and a load or
// a change those of the tasks it armed: an acquire with a bulk trigger
// pending holds 100 000 triggers being checked, answered a transaction's
// read (MaxTxnOps) at a time. Not safe for concurrent use: the dispatch
// loop's.
type earlyTriggers struct {
	byTask map[string][]triggerFire // in the order they came
	n      int                      // how many byTask holds
}

// add holds f.
func (e *earlyTriggers) add(f triggerFire) {
	if e.byTask == nil {
		e.byTask = map[string][]triggerFire{}
	}
	e.byTask[f.id] = append(e.byTask[f.id], f)
	e.n++
}

// len returns how many triggers e holds.
func (e *earlyTriggers) len() int { return e.n }

// keep keeps the triggers for which keep, which may change them (a check
// started), returns true; keep must not add to e.
func (e *earlyTriggers) keep(keep func(f *triggerFire) bool) {
	for id := range e.byTask {
		e.keepOf(id, keep)
	}
}

// keepOf is keep, for the triggers of task id alone; keep must not add
// to e either: a trigger added for id while its list is walked would be
// lost, and the count would drift.
func (e *earlyTriggers) keepOf(id string, keep func(f *triggerFire) bool) {
	fs, ok := e.byTask[id]
	if !ok {
		return
	}
	kept := fs[:0]
	for i := range fs {
		if keep(&fs[i]) { // in place: a copy for keep to change escaped, one allocation a trigger
			kept = append(kept, fs[i])
		}
	}
	clear(fs[len(kept):])
	e.n -= len(fs) - len(kept)
	if len(kept) == 0 {
		delete(e.byTask, id)
	} else {
		e.byTask[id] = kept
	}
}

// sweepTriggers, once a second, drops the early triggers that waited too
// long, their keys with them, and forgets the fired ones past triggerWait
// whose task has no fire in flight, ending a key put again, and the
// handed-on retries that came due past it (loop.handed).
// The loop runs it between dispatches, so that it happens on a quiet node
// too, and not at each trigger: a bulk trigger remembers tens of
// thousands. Called only from the dispatch loop.
func (l *loop) sweepTriggers() {
	now := l.cfg.Clock.Now().UnixNano()
	if now < l.sweepAt || (l.early.len() == 0 && len(l.triggered) == 0 && len(l.handed) == 0) {
		return
	}
	l.sweepAt = now + int64(time.Second)
	maps.DeleteFunc(l.handed, func(_ handedRetryKey, until int64) bool { return until != 0 && now >= until })
	l.early.keep(func(f *triggerFire) bool {
		s := l.triggered[f.key()]
		if now < s.until {
			return true
		}
		if f.checking {
			// Its task came; etcd has not answered the read of its
			// creation yet.
			s.until = now + int64(triggerWait)
			l.triggered[f.key()] = s
			return true
		}
		l.pool.ends.add(f.end()) // its task never came: the trigger ends here
		return false
	})
	maps.DeleteFunc(l.triggered, func(k triggerKey, s seenTrigger) bool {
		if now < s.until {
			return false
		}
		if !s.ended && !s.early && l.firing(k) {
			// Its fire may still wait or run: a put of its key is that
			// fire's until it ends, however long it takes.
			s.until = now + int64(triggerWait)
			l.triggered[k] = s
			return false
		}
		if s.again && !s.early && l.parts[k.part].owned && !l.fenced() {
			// Its fire is over without ending here (triggerEnded): its
			// task was deleted while it ran, or its policy skipped it.
			// The key put again is that fire's, and would stay until the
			// partition's next acquire.
			l.pool.ends.add(triggerEnd{k, s.rev})
		}
		return true
	})
}

// firing reports whether the task of trigger k has a fire waiting for a
// worker, buffered or running here (not necessarily k's: a scheduled fire
// keeps k remembered a little longer, which costs nothing).
func (l *loop) firing(k triggerKey) bool {
	_, r, ok := l.tab.lookup(k.id)
	return ok && int(r.part) == k.part && r.running > 0
}

// forgetTrigger forgets a trigger handed over unrun with its partition: its
// key stays for the next owner, and should this node own the partition
// again, it fires the key.
func (l *loop) forgetTrigger(k triggerKey) {
	delete(l.triggered, k)
	delete(l.releasedAgain, k)
}

// forgetUnstarted forgets the triggers of partitions that left the node
// whose jobs a cut canceled before they started (pool.takeUnstarted), as
// triggers handed over unrun: their keys stay, and the partition's next
// owner fires them, this node too. Remembered, they were listed as fired
// in the hand-over a fenced session kept, and a key read again within
// triggerWait was taken for that fire: ended unrun, or passed over.
// Called only from the dispatch loop.
func (l *loop) forgetUnstarted(ends []triggerEnd) {
	for _, u := range ends {
		l.forgetTrigger(u.triggerKey)
	}
}

// noteReleasedAgain notes the keys of the triggers of partitions in out,
// being released, that were put again while their fire waited or ran
// (triggers): that fire's, they go when it ends, which may come after
// the release commits, and the next owner fires every key it finds.
func (l *loop) noteReleasedAgain(out map[int]*handOver) {
	for k, s := range l.triggered {
		if s.again && out[k.part] != nil {
			if l.releasedAgain == nil {
				l.releasedAgain = map[triggerKey]int64{}
			}
			l.releasedAgain[k] = s.rev
		}
	}
}

// endReleasedAgain, at the seal of the release of the partitions of hand,
// ends the keys noteReleasedAgain noted whose fire was not handed over
// unrun: it started here, so the key put again goes with the keys of the
// triggers that started, before the release commits. Left, it fired again
// on the next owner.
func (l *loop) endReleasedAgain(hand map[int]*handOver) {
	for k, rev := range l.releasedAgain {
		if hand[k.part] != nil {
			l.pool.ends.add(triggerEnd{k, rev})
			delete(l.releasedAgain, k)
		}
	}
}

// handTriggers lists, in the hand-overs of hand at their seal, the
// triggers of their partitions that fired or ended here, or were handed
// over to this node so (handedTriggers), within triggerWait, with what is
// left of it (again when the checkpoint is written: firedWithin): those
// handed over unrun are forgotten by then (handOverQueued), and the keys
// of these are deleted before the release commits. A key put again after
// the commit (two chains of one target and second, the second a little
// later) is then that fire on the next owner too, which fired it again.
// Past maxFired a partition's latest puts are listed. One whose job a
// worker holds unstarted is not, nor one a fence cut so (pool.notStarted):
// a fence after the commit may cut it, or one before the seal of a
// release it left stuck (the fenced drop keeps its hand-over), its key
// staying, and the next owner, taking that key for the fire, ended it
// unrun. Should it start instead, its key goes in the background, and the
// next owner may fire it again, at least once rather than never: rare, as
// the release waited for the job's end first (Config.ReleaseRunWait), the
// worker held through that wait.
func (l *loop) handTriggers(hand map[int]*handOver) {
	now := l.cfg.Clock.Now().UnixNano()
	unstarted := l.pool.notStarted()
	for k, s := range l.triggered {
		if h := hand[k.part]; h != nil && !s.early && s.until > now && !slices.Contains(unstarted, k) {
			f := firedTrigger{ID: k.id, At: time.Unix(0, k.at).UTC(), Rev: s.rev, Attempt: s.attempt, until: s.until}
			f.waitLeft(now)
			h.fired = append(h.fired, f)
		}
	}
	for _, h := range hand {
		// The latest first, so that the bound, and a checkpoint too long,
		// leave out the oldest (shed from the tail).
		slices.SortFunc(h.fired, func(a, b firedTrigger) int { return cmp.Compare(b.Rev, a.Rev) })
		h.fired = h.fired[:min(len(h.fired), maxFired)]
	}
}

// waitLeft sets f's WaitMS to what is left of its wait at now (unix ns),
// and UntilMS to its end (rounded up), and reports whether any is left.
func (f *firedTrigger) waitLeft(now int64) bool {
	ms := int64(time.Millisecond)
	f.WaitMS, f.UntilMS = max((f.until-now)/ms, 1), (f.until+ms-1)/ms
	return f.until > now
}

// firedWithin returns fired with what is left of each one's wait at now,
// without those whose wait is over: a release writes its checkpoint after
// its seal (handTriggers) once etcd took its markers and its trigger
// keys' deletes, 5 s each at most, a stuck release up to the lease TTL
// later, and a fenced node that takes the partition back writes its
// hand-over then. Listed as at the seal, a trigger was remembered that
// much past its wait on the next owner, which ended a key put again then,
// another fire, unrun.
func firedWithin(fired []firedTrigger, now int64) []firedTrigger {
	kept := fired[:0]
	for _, f := range fired {
		if f.waitLeft(now) {
			kept = append(kept, f)
		}
	}
	return kept
}

// handedTriggers remembers the triggers of partition p, being acquired,
// that its previous owner fired (handTriggers), as if they had fired here,
// for what was left of their triggerWait there: a key put again is that
// fire. A partition that changes hands again and again does not make them
// remembered for ever. Nor one taken from the hold checkpoint of an owner
// that crashed before naming its session, at least a lease TTL after that
// release: no later than its end on the releasing node's clock (UntilMS),
// which NTP keeps within milliseconds of this one's.
func (l *loop) handedTriggers(p int, fired []firedTrigger) {
	now := l.cfg.Clock.Now().UnixNano()
	for _, f := range fired {
		until := now + min(f.WaitMS, triggerWait.Milliseconds())*int64(time.Millisecond)
		if f.UntilMS != 0 {
			until = min(until, f.UntilMS*int64(time.Millisecond))
		}
		l.triggered[triggerKey{p, f.ID, f.At.UnixNano()}] = seenTrigger{until: until, rev: f.Rev, attempt: f.Attempt, ended: true, handed: true}
	}
}

// watchTriggers fires the triggers of the partitions this node owns,
// from revision from on, resuming after the last revision it saw when its
// watch breaks (progress notifications keep that revision recent). from
// is before the node's first acquire read the partition's pending
// triggers: a watch from its creation missed those written between that
// read and its creation until the partition's next acquire
// (TestEngine_TriggerWrittenBeforeTheWatchIsCreatedFires). Nor may a
// watch that broke resume from etcd's revision of then: it would pass
// over the triggers written while it was down (etcd cancels a watch that
// requires a leader once its member has none). If etcd compacted past it,
// it reads the pending triggers instead, fires those written since, and
// goes on from that read.
func (e *Engine) watchTriggers(ctx context.Context, from int64) {
	rev := from
	for ctx.Err() == nil {
		for resp := range e.reg.WatchTriggers(ctx, rev) {
			if resp.Created && !resp.Canceled {
				continue
			}
			if resp.CompactRevision != 0 {
				if r, err := e.reg.PendingTriggers(ctx); err == nil {
					// The others came before: queued or buffered here, or
					// not this node's.
					e.fireTriggers(ctx, slices.DeleteFunc(r.Kvs, func(kv *mvccpb.KeyValue) bool { return kv.ModRevision <= rev }), nil)
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
			e.fireTriggers(ctx, kvs, nil)
			if resp.IsProgressNotify() {
				rev = max(rev, resp.Header.Revision)
			}
		}
		sleepCtx(ctx, time.Second)
	}
}

// fireTriggers hands the triggers of kvs (trigger keys) of the partitions
// this node owns to the loop, in one command: a bulk trigger's watch
// responses hold hundreds. read is the acquire's read they are (nil: the
// watch's events). One of a partition in hand-over stays for the next
// owner's load.
func (e *Engine) fireTriggers(ctx context.Context, kvs []*mvccpb.KeyValue, read *triggerRead) {
	fires := make([]triggerFire, 0, len(kvs))
	for _, kv := range kvs {
		p, at, id, ok := e.reg.ParseTrigger(string(kv.Key))
		if ok && e.Owns(p) {
			over, retry := registry.DecodeTriggerValue(kv.Value)
			var bf *backfillRun
			if retry != nil && retry.Backfill {
				bf = e.handedBackfill(p, id, nil)[id]
			}
			fires = append(fires, triggerFire{part: p, id: id, at: at * int64(time.Millisecond), rev: kv.ModRevision,
				over: over, retry: retry, bf: bf})
		}
	}
	if len(fires) > 0 || read != nil {
		c := &triggersCmd{fires: fires, read: read, reply: make(chan struct{}, 1)}
		_, _ = request(ctx, e, c, c.reply)
	}
}

// batchQueue is a queue that goroutines add to and one takes from in
// batches; safe for concurrent use.
type batchQueue[T any] struct {
	mu   sync.Mutex // guards q, and the fields of a type that embeds it
	q    []T
	wake chan struct{} // signalled when q becomes non-empty
}

func newBatchQueue[T any]() *batchQueue[T] { return &batchQueue[T]{wake: make(chan struct{}, 1)} }

// add queues xs.
func (b *batchQueue[T]) add(xs ...T) {
	b.mu.Lock()
	b.q = append(b.q, xs...)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// take takes up to n of the first queued items off the queue, or none.
func (b *batchQueue[T]) take(n int) []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.takeLocked(n)
}

// takeIf takes the queued items for which in returns true off the
// queue, in order.
func (b *batchQueue[T]) takeIf(in func(x T) bool) []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []T
	b.q = slices.DeleteFunc(b.q, func(x T) bool {
		if in(x) {
			out = append(out, x)
			return true
		}
		return false
	})
	return out
}

// takeLocked is take, called with mu held.
func (b *batchQueue[T]) takeLocked(n int) []T {
	if len(b.q) == 0 {
		return nil
	}
	out := slices.Clone(b.q[:min(n, len(b.q))])
	clear(b.q[:len(out)])
	b.q = b.q[len(out):]
	return out
}

// triggerEnds queues the puts of the keys of triggers whose fire started
// here, or ended without running, for deleteTriggers to delete in
// transactions of many. Workers add to it when they take a trigger's
// job, under the pool's lock: once the jobs a release waits for are
// taken, the puts of those that started are queued. A job of a task kept
// apart is queued once it starts, or a replace cancels it (pool.letGo):
// a fence or an undone acquire may cut it in between, and its key must
// stay. One that starts after the release took its partitions' puts is
// deleted in the background, and the release lists its trigger as fired,
// for the next owner to end the key at that put. It holds about as many
// puts as there are triggers pending in etcd (a key put again is queued
// again, at that put); safe for concurrent use. Its lock is taken under
// the pool's or its runMu, and takes no other.
type triggerEnds struct {
	*batchQueue[triggerEnd]
	taken    uint64        // batches the deleter took
	finished uint64        // batches it finished: deleted, or given up at Close
	moved    chan struct{} // closed, and replaced, when a batch finishes
}

func newTriggerEnds() *triggerEnds {
	return &triggerEnds{batchQueue: newBatchQueue[triggerEnd](), moved: make(chan struct{})}
}

// take takes up to n of the first queued puts off the queue, as the
// deleter's next batch, or none.
func (t *triggerEnds) take(n int) []triggerEnd {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.takeLocked(n)
	if b != nil {
		t.taken++
	}
	return b
}

// finish says that the deleter's batch is done with.
func (t *triggerEnds) finish() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.finished++
	close(t.moved)
	t.moved = make(chan struct{})
}

// takeParts takes the puts of partitions ps off the queue, for a release
// to delete itself: behind a bulk trigger, the queue holds many of other
// partitions.
func (t *triggerEnds) takeParts(ps []int) []triggerEnd {
	in := make(map[int]bool, len(ps))
	for _, p := range ps {
		in[p] = true
	}
	return t.takeIf(func(k triggerEnd) bool { return in[k.part] })
}

// waitBatch waits until the deleter's batch in flight, if any, is done
// with, or ctx ends.
func (t *triggerEnds) waitBatch(ctx context.Context) error {
	t.mu.Lock()
	end := t.taken
	for t.finished < end {
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

// len returns how many puts are queued.
func (t *triggerEnds) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.q)
}

// deleteTriggers deletes the puts triggerEnds queues until stop is closed,
// then what is left (etcdTimeout at most), retrying while etcd refuses.
func (e *Engine) deleteTriggers(t *triggerEnds, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // ends with this function
		select {
		case <-stop:
			time.AfterFunc(etcdTimeout, cancel) // the last deletes, for Close
		case <-ctx.Done():
		}
	}()
	for {
		batch := t.take(deleteParallel * registry.MaxTxnOps)
		if batch == nil {
			select {
			case <-t.wake:
				continue
			case <-stop:
				return
			}
		}
		err := e.deleteTriggerKeys(ctx, batch)
		t.finish()
		if err != nil {
			// Left behind, a key fires again at its partition's next
			// acquire.
			e.log.Warn("deleting the keys of triggers fired here failed; their next owners may fire them again",
				"keys", len(batch)+t.len(), "err", err)
			return
		}
	}
}

// triggerChecks queues the triggers whose task's creation checkTriggers
// is to read (partState.created).
type triggerChecks = batchQueue[triggerFire]

// checkTriggers reads, for the triggers t queues, when their task was
// created, MaxTxnOps tasks a transaction, and hands the loop each
// transaction's answer as it comes, until ctx ends; it retries while etcd
// refuses. An answer holds the loop about 0.1 ms, since it goes through
// the early triggers of the tasks it names alone (earlyTriggers): answers
// of 64 transactions together cost the loop as much in all, but held it
// some 6 ms each, a stall of its fires, and their first trigger waited
// for 64 reads (BenchmarkCheckedAnswers). Only triggers whose key is
// older than a creation the loop applied in their partition are queued:
// those an acquire reads, and those of a partition that took a new task
// between the trigger and the loop's look at it; and keys put again after
// their trigger fired here (checkedAgain). Those of a partition that
// leaves the node, a release or a fenced drop, keep their keys for its
// next owner: the release forgets them (but a key put again goes as that
// fire's), and takes those not yet read off t, so that they hold back no
// check of a partition kept; as do those left when ctx ends.
func (e *Engine) checkTriggers(ctx context.Context, t *triggerChecks) {
	for {
		batch := t.take(registry.MaxTxnOps)
		if batch == nil {
			select {
			case <-t.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		ids := make([]string, 0, len(batch))
		for _, f := range batch {
			ids = append(ids, f.id)
		}
		slices.Sort(ids)
		created, rev, err := e.readCreated(ctx, slices.Compact(ids))
		if err != nil {
			return
		}
		if e.call(ctx, &checkedCmd{fires: batch, created: created, rev: rev}) != nil {
			return
		}
	}
}

// readCreated is registry.Created, tried again while etcd refuses, until
// ctx ends (retrying).
func (e *Engine) readCreated(ctx context.Context, ids []string) (created map[string]int64, rev int64, err error) {
	err = retrying(ctx, func(rctx context.Context) (err error) {
		created, rev, err = e.reg.Created(rctx, ids)
		return err
	}, func(err error, in time.Duration) {
		e.log.Warn("reading when triggered tasks were created failed; retrying", "tasks", len(ids), "err", err, "in", in)
	})
	return created, rev, err
}

// deleteParallel is how many transactions of trigger deletes run at once:
// behind a bulk trigger, one at a time falls behind the workers.
const deleteParallel = 8

// deleteTriggerKeys deletes the puts of ks, each key only while it holds
// its put (registry.DeleteTriggers), in transactions of up to MaxTxnOps,
// deleteParallel at once, retrying while etcd refuses, until ctx ends.
func (e *Engine) deleteTriggerKeys(ctx context.Context, ks []triggerEnd) error {
	var g errgroup.Group
	g.SetLimit(deleteParallel)
	for chunk := range slices.Chunk(latestPuts(ks), registry.MaxTxnOps) {
		g.Go(func() error {
			puts := make([]registry.TriggerPut, len(chunk))
			for i, k := range chunk {
				puts[i] = registry.TriggerPut{Part: k.part, ID: k.id, At: k.at / int64(time.Millisecond), Rev: k.rev}
			}
			return retrying(ctx, func(tctx context.Context) error { return e.reg.DeleteTriggers(tctx, puts) }, func(err error, in time.Duration) {
				e.log.Warn("deleting the keys of triggers fired here failed; retrying", "keys", len(chunk), "err", err, "in", in)
			})
		})
	}
	return g.Wait()
}

// latestPuts is ks with each key once, at its latest put: the delete of
// an earlier one could only find the key put since (a key put again
// after its fire, that fire's, ends at each of its puts).
func latestPuts(ks []triggerEnd) []triggerEnd {
	at := make(map[triggerKey]int, len(ks))
	out := make([]triggerEnd, 0, len(ks))
	for _, k := range ks {
		if i, ok := at[k.triggerKey]; ok {
			out[i].rev = max(out[i].rev, k.rev)
			continue
		}
		at[k.triggerKey] = len(out)
		out = append(out, k)
	}
	return out
}

// commitRetrying commits ops in one transaction, trying again with backoff
// while etcd refuses, until ctx ends. refused, when not nil, is told each
// refusal and the wait before the next try.
func (e *Engine) commitRetrying(ctx context.Context, ops []clientv3.Op, refused func(err error, in time.Duration)) error {
	return retrying(ctx, func(tctx context.Context) error {
		_, err := e.cli.Txn(tctx).Then(ops...).Commit()
		return err
	}, refused)
}

// retrying calls try, etcdTimeout at most a call, trying again with
// backoff while it fails, until ctx ends. refused, when not nil, is told
// each failure and the wait before the next try.
func retrying(ctx context.Context, try func(ctx context.Context) error, refused func(err error, in time.Duration)) error {
	var b backoff
	for {
		tctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		err := try(tctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if refused != nil {
			refused(err, b.next())
		}
		if !b.wait(ctx) {
			return ctx.Err()
		}
	}
}
