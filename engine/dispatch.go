package engine

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/task"
	"github.com/shardcron/shardcron/timerwheel"
)

// dispatch hands one batch of due fires to the pool, and reports whether
// more may be due at once.
func (l *loop) dispatch() bool {
	if l.fenced() {
		return false // the coordinator drops the partitions
	}
	if len(l.unpushed) > 0 {
		k := l.pool.push(l.unpushed)
		l.unpushed = l.unpushed[k:]
		if len(l.unpushed) > 0 {
			return false
		}
		l.publish()
	}
	now := l.cfg.Clock.Now().UnixNano()
	target, ok := l.reach(now)
	if !ok {
		return false // no watermark recorded yet: no lead to run on
	}
	if target < now {
		target = max(target, l.idleUntil(now)) // never past now: a node within its lead has nothing to skip
	}
	free := l.pool.free()
	if free == 0 {
		return false
	}
	batch := min(l.cfg.BatchSize, free)
	if k := l.useStage(target, now); k > 0 {
		batch = k // the staged tick's timers, as one batch (stage.go)
	}
	swept := target >= l.wheel.Now() // the wheel's current tick is released first
	l.expired = l.wheel.Advance(target, batch, l.expired[:0])
	full := len(l.expired) == batch
	if swept && !full {
		// The current tick went out whole, with every timer armed into it
		// at or before the wheel's time.
		l.lowArm = math.MaxInt64
	}
	// The wheel releases whole ticks: every timer due up to the start of
	// its current tick is out, unless the batch was cut, in which case the
	// current tick may hold more, some due before its start.
	through := l.wheel.Now()
	if full {
		through -= int64(l.cfg.Tick)
	}
	// Dispatch first, then compute next times (docs/design.md, facts measured).
	if len(l.expired) > 0 {
		l.epoch++
	}
	if !l.releaseStaged() {
		l.jobs = l.jobs[:0]
		for _, e := range l.expired {
			l.release(e, now)
		}
		l.pushJobs()
	}
	for _, e := range l.expired {
		if e.ID < retryBase {
			l.released = append(l.released, e.ID)
		}
	}
	l.releasedThrough = max(l.releasedThrough, through)
	if full && len(l.unpushed) == 0 && l.pool.free() > 0 {
		// More is due and the queue has room: the rest of the burst goes
		// to the workers before the loop computes next times.
		return true
	}
	l.rescheduleReleased()
	return full
}

// reach is how far dispatch may run at now: the bounded lead (acked.limit),
// so that a successor repeats at most Lead of fires; but never short of the
// wheel's clock. While the lead is lifted (NOSPACE) the wheel may run more
// than Lead past the dispatch point, which a fire armed into the past, with
// every batch cut, holds back; once the alarm clears, acked is that point,
// and a limit behind the clock would release nothing: the dispatch point,
// and the watermark with it, would never move again. What is armed at or
// before the clock is due, and releasing it runs no further ahead.
func (l *loop) reach(now int64) (int64, bool) {
	limit, ok := l.acked.limit(now, l.cfg.Lead)
	return max(limit, l.wheel.Now()), ok
}

// idleUntil is how far the wheel's clock may run at now without releasing
// a fire, past the bounded lead: up to the tick before its next timer. The
// lead bounds the fires a successor repeats; a span without a timer holds
// none, and a watermark over it claims none. Without this, a clock left
// behind (a node fenced through an etcd outage, rejoining with the
// watermark of its old session) crept up on now by Lead per
// acknowledgement, a tenth of the outage, firing nothing meanwhile.
// Records released and not yet rescheduled have no timer: nothing moves
// while they wait.
func (l *loop) idleUntil(now int64) int64 {
	if len(l.released) > 0 {
		return 0
	}
	next, ok := l.wheel.NextDeadline()
	if !ok {
		return now
	}
	return min(now, next-1) // NextDeadline starts a tick: next-1 ends the one before
}

// rescheduleReleased computes the next times of the records released
// since the last call, and only then moves the dispatch point: a next fire
// armed at or before the wheel's time (a fire_all catch-up chain, jitter
// close to the period, a dispatch running late) is released by the next
// Advance, and the point must not claim it before. Until it runs, a
// released record's r.next is the fire just released: it runs before any
// command, which may read or move r.next (handle), and before the loop
// sleeps.
func (l *loop) rescheduleReleased() {
	l.awaitSegment()
	l.startStagedFires()
	for _, i := range l.released {
		l.reschedule(i)
	}
	l.released = l.released[:0]
	if t := min(l.releasedThrough, l.lowArm-1); t > l.through {
		// A change armed before now was armed behind t, so its fires due
		// by t are out (never past a fire armed and not released), and a
		// watermark at t goes with the applied revisions as they stand.
		l.through, l.throughSeq = t, l.appliedSeq
	}
	l.publish()
}

// publish lets the node watermark follow the dispatch point once every
// job dispatched before it is in the queue.
//
// A fire waiting in pending (buffer_one) does not hold it back: it is in
// flight with the fire it waits for, and holding the watermark would hold
// the bounded lead, and with it every task of the node, for as long as
// that fire runs. A release hands it over (releaseParts), and the
// watermark writes carry it for a successor after a crash (buffer). A
// partition armed from a resume point behind the dispatch point is
// released at the next dispatch: an acquire waits until the watermark
// passes the point where it armed its partition before it names its
// session in the checkpoint (see Engine.nameSession).
func (l *loop) publish() {
	if len(l.unpushed) == 0 {
		l.pool.publish(l.through, l.throughSeq)
	}
}

// pushJobs hands l.jobs to the pool after any jobs still waiting for room,
// so that the queue stays in order; what does not fit waits in unpushed.
func (l *loop) pushJobs() {
	if len(l.unpushed) > 0 {
		l.unpushed = append(l.unpushed, l.jobs...)
	} else if k := l.pool.push(l.jobs); k < len(l.jobs) {
		l.unpushed = append(l.unpushed, l.jobs[k:]...)
	}
	clear(l.jobs)
	l.jobs = l.jobs[:0]
	l.publish()
}

// release turns one expired timer into a job, applying the misfire and
// concurrency policies.
func (l *loop) release(e timerwheel.Expired, now int64) {
	if e.ID >= retryBase {
		l.releaseRetry(e.ID - retryBase)
		return
	}
	r := l.tab.rec(e.ID)
	if r.flags&flagLive == 0 || r.flags&flagPaused != 0 {
		return
	}
	prof := l.profs.list[r.prof]
	sched := r.next
	late := now-e.At > int64(l.cfg.MisfireThreshold)
	if lateness(r, late) {
		l.alert(task.NotifyMisfire, r, sched, 1, statusMisfired, "missed by more than the misfire threshold ("+string(prof.misfire)+")")
	}
	if late {
		sched = l.misfire(r, prof, sched, now)
		if sched == 0 {
			return
		}
	}
	r.lastFire = sched
	l.admit(e.ID, r, prof, ownFire{at: sched, kind: kindSchedule}, e.At)
}

// misfire applies the task's misfire policy to a fire released late, and
// returns the scheduled time to fire now, or 0 for none. Missed times are
// those up to now and none older than the catch-up window. It leaves r.next
// where the schedule resumes from.
//
// A misfire is a decision about the past as a whole, so it looks up to now,
// past the bounded lead: after a pause longer than the misfire threshold,
// a crash right after the catch-up fire may repeat that one fire on the
// next owner (its misfire policy makes the same decision), but not the
// missed ones it stands for.
func (l *loop) misfire(r *record, prof *profile, sched, now int64) int64 {
	r.misfires++
	l.stats.misfire(prof.misfire)
	fire, resume := misfireFire(prof.misfire, l.schedOf(r), sched, now, prof.catchup)
	if fire != sched {
		// sched stays the first missed time: when fire_all's window begins
		// later, or fire_once picks a later time, this one is recorded.
		l.misfired(r, sched, misfireWhy(prof.misfire, fire, prof.catchup))
	}
	r.next = resume
	return fire
}

// ownFire is a fire of a task's own (startFire), its schedule's or a
// trigger's, as admit takes it and as it waits for the running one
// (buffer_one): its scheduled time, its kind (a trigger's stays one when
// it runs; released unrun, it keeps its key for the next owner), and a
// trigger's override of the body or payload and put of its key.
type ownFire struct {
	at    int64
	kind  uint8
	extra *fireExtra // a trigger's; nil: none
}

// waitingFire is an ownFire waiting for the running one (loop.pending),
// apart so that a fire that does not wait carries none of it: for a fire
// of the schedule, its place in bufferedIn[part], and the last publish
// of the waiting fires before it began to wait (loop.retrySeq).
type waitingFire struct {
	ownFire
	pos   uint32
	since uint64
}

// admit applies the concurrency policy and queues a job for fire f of
// record i, released when due.
func (l *loop) admit(i uint32, r *record, prof *profile, f ownFire, due int64) {
	waiting := false
	if r.running > 0 { // the fire path looks up nothing for a task at rest
		_, waiting = l.pending[i]
	}
	switch admit(prof.concurrency, int(r.running), waiting, false) {
	case admitSkip:
		why := "the previous fire is still running (concurrency forbid)"
		if waiting {
			why = "a fire is already waiting for the running one (concurrency buffer_one)"
		}
		l.skip(r, f.at, 1, why)
		if f.kind == kindTrigger {
			l.pool.ends.add(triggerEnd{l.triggerKeyOf(r, f.at), f.extra.trig})
		}
		return
	case admitBuffer:
		l.buffer(i, r, f)
		return
	case admitReplace:
		// The running fire is canceled, and so are those still waiting for
		// a worker: only the newest runs. A backfill's fires are outside
		// the policy and run on (replaceRunning).
		l.pool.replaceRunning(i, r.gen)
		l.replaceElsewhere(i, r)
		l.pool.replaceQueued(i, r.gen)
		for k := range l.unpushed {
			if u := &l.unpushed[k]; u.rec == i && u.gen == r.gen && u.extra.backfill() == nil {
				u.replaced = true
			}
		}
		// One held at the gate (the task's policy was buffer_one when its
		// fire waited) goes to a worker now: it runs nothing, and held,
		// a release would hand it over to run on the next owner.
		l.gated = slices.DeleteFunc(l.gated, func(g gatedJob) bool {
			if g.rec != i || g.gen != r.gen {
				return false
			}
			g.replaced = true
			l.jobs = append(l.jobs, g.job)
			return true
		})
	}
	startFire(r)
	j := l.jobOf(i, r, prof, f.at, due, f.kind)
	j.extra = f.extra
	l.jobs = append(l.jobs, j)
}

// startFire notes on r that a fire of its own (not a retry's or a
// backfill's) is on its way to a worker.
func startFire(r *record) {
	r.running++
	r.fires++
	r.flags &^= flagEdited // this fire runs the definition as it stands
}

// jobOf is the job of the first attempt of a fire of record i.
func (l *loop) jobOf(i uint32, r *record, prof *profile, sched, due int64, kind uint8) job {
	return job{
		id: l.tab.id(r), prof: prof, sched: sched, due: due,
		fence: l.parts[r.part].fence, rec: i, gen: r.gen, attempt: 1, kind: kind, part: r.part,
	}
}

// misfired records a fire that a misfire did not run, and counts it among
// the executions (docs/api.md: shardcron_executions_total counts skipped
// and misfired fires), as skip does a skipped one.
func (l *loop) misfired(r *record, sched int64, why string) {
	l.stats.execs[statusMisfired].Add(1)
	l.record(r, sched, 1, statusMisfired, why)
}

func (l *loop) skip(r *record, sched int64, attempt uint16, why string) {
	r.skipped++
	l.stats.skipped.Add(1)
	l.stats.execs[statusSkipped].Add(1)
	l.record(r, sched, int(attempt), statusSkipped, why)
}

// record writes an execution record for a fire that did not run.
func (l *loop) record(r *record, sched int64, attempt int, status uint8, why string) {
	if l.history == nil {
		return
	}
	now := l.cfg.Clock.Now()
	l.history.RecordKeep(execution(l.tab.id(r), l.cfg.NodeID, sched, attempt, status, now, now, why),
		l.profs.list[r.prof].keepFor(status))
}

// reschedule puts record i back in the wheel at its next fire after r.next.
func (l *loop) reschedule(i uint32) {
	r := l.tab.rec(i)
	if r.flags&flagLive == 0 || r.flags&flagPaused != 0 || r.next == 0 {
		return
	}
	n := l.nextOf(r, r.next)
	l.arm(i, r, n)
	if n == 0 {
		l.checkEnded(i, r) // past its window: out of the wheel
	}
}

// arm schedules record i's fire at scheduled time n (0: none).
func (l *loop) arm(i uint32, r *record, n int64) {
	r.next = n
	if n == 0 {
		l.wheel.Cancel(i)
		return
	}
	due := n + l.delay(r, n)
	l.wheel.Schedule(i, due)
	if due <= l.wheel.Now() {
		l.lowArm = min(l.lowArm, due) // the dispatch point stays before it (dispatch)
	}
}

// delay is the task's jitter for the fire at n: deterministic per (id, n),
// so every node computes the same.
func (l *loop) delay(r *record, n int64) int64 {
	return int64(Delay(l.tab.id(r), n, r.jitter))
}

// Delay is the jitter of the fire of task id scheduled at sched (unix ns)
// for a task whose jitter is jitterMS milliseconds: in [0, jitter), whole
// milliseconds, and deterministic, so that every node and the schedule
// preview compute the same.
func Delay(id string, sched int64, jitterMS uint32) time.Duration {
	if jitterMS == 0 {
		return 0
	}
	h := xxhash.Sum64String(id) ^ uint64(sched)*0x9e3779b97f4a7c15
	return time.Duration(h%uint64(jitterMS)) * time.Millisecond
}

func (l *loop) nextMemo(h schedule.Handle, from int64) int64 {
	m := &l.memo[(uint64(h)*0x9e3779b97f4a7c15^uint64(from))>>56]
	if m.h == h && m.from == from {
		return m.to
	}
	to := next(l.scheds.Get(h), from)
	*m = memoEntry{h: h, from: from, to: to}
	return to
}

// firstAfter returns the first fire of r whose release (with jitter) is
// after w: the fire to resume with after the watermark w.
func (l *loop) firstAfter(r *record, w int64) int64 {
	h := l.schedOf(r)
	n := next(h, w-int64(r.jitter)*int64(time.Millisecond))
	for n != 0 && n+l.delay(r, n) <= w {
		n = next(h, n)
	}
	return n
}

func (l *loop) releaseRetry(slot uint32) {
	rs := l.retries[slot]
	l.freeRetry(slot)
	if rs.handed {
		l.handed[handedRetryKey{rs.rec, rs.gen, rs.sched, rs.attempt}] = l.cfg.Clock.Now().UnixNano() + int64(triggerWait)
	}
	l.startStagedFires() // a staged fire of this task in the batch before runs
	r := l.tab.rec(rs.rec)
	if r.flags&flagLive == 0 || r.gen != rs.gen {
		if bf := rs.extra.backfill(); bf != nil {
			bf.end(rs.sched) // its task was deleted or dropped: the fire ends here
		}
		return
	}
	if bf := rs.extra.backfill(); r.flags&flagPaused != 0 && (bf == nil || bf.stopped.Load()) && !rs.extra.triggersFirst(rs.attempt) {
		// A pause stops what would start on its own, retries too; a
		// backfill runs whole, until it is canceled, and a trigger's
		// first attempt, handed on unrun, runs as the trigger would.
		l.skipForPause(rs.rec, r, rs.sched, rs.attempt)
		if bf != nil {
			bf.end(rs.sched)
		}
		return
	}
	l.admitRetry(rs.rec, r, rs.sched, rs.attempt, rs.extra, rs.listed)
}

// skipPaused skips, recorded so, the fires that have not started of the
// tasks the command under way paused (l.paused): those of their schedule
// and their retries waiting for a worker, and a fire of their schedule
// waiting for the running one (buffer_one). A pause stops what would start
// on its own, as for a retry that comes due later (releaseRetry), and
// takes effect on the owner within a watch delivery (invariant 6), not
// once a queue held up by a slow executor reaches those fires: they ran
// after the pause, against the endpoint it was to spare. Triggers and
// backfills run, as for any paused task. Once a command, not once a task:
// a bulk pause of a fleet in the middle of its burst scans the queue once.
// Called only from the dispatch loop.
func (l *loop) skipPaused() {
	if len(l.paused) == 0 {
		return
	}
	defer clear(l.paused)
	busy := false
	for i := range l.paused {
		r := l.tab.rec(i)
		if w, ok := l.pending[i]; ok && w.kind == kindSchedule {
			l.unbuffer(i)
			l.skipForPause(i, r, w.at, 1)
		}
		busy = busy || r.running > 0
	}
	if !busy {
		return
	}
	type unrun struct {
		rec     uint32
		sched   int64
		attempt uint16
	}
	var skipped []unrun
	l.dropJobs(func(j *job) bool {
		// A replaced job is canceled unrun already, and recorded so.
		if gen, ok := l.paused[j.rec]; !ok || j.gen != gen || j.extra.backfill() != nil || j.replaced || j.kind != kindSchedule && j.kind != kindRetry ||
			j.extra.triggersFirst(j.attempt) {
			return false
		}
		skipped = append(skipped, unrun{j.rec, j.sched, j.attempt})
		return true
	})
	for _, u := range skipped {
		r := l.tab.rec(u.rec)
		r.running--
		l.skipForPause(u.rec, r, u.sched, u.attempt)
	}
	for i := range l.paused {
		r := l.tab.rec(i)
		if r.running > 0 && l.profs.list[r.prof].deleteAfter {
			// A fire the pause did not stop runs the definition before
			// it: that edit wins, as any edit while a fire runs (upsert).
			// One the pause skipped ran nothing.
			r.flags |= flagEdited
		}
		l.admitWaiting(i, r) // a trigger waiting for a fire skipped here starts
	}
	if len(l.jobs) > 0 {
		l.pushJobs()
	}
}

// skipForPause records a fire of record i's paused task skipped
// unstarted. That may end the fire (its last attempt skipped): a
// delete_after_fire task's end is looked at again, at its resume
// (checkEnded).
func (l *loop) skipForPause(i uint32, r *record, sched int64, attempt uint16) {
	l.skip(r, sched, attempt, "the task is paused")
	l.checkEnded(i, r)
}

// admitRetry queues a retry. While another fire of the task runs, only
// allow lets it run alongside: forbid and buffer_one keep fires apart and
// replace lets the newer fire win, so the retry is skipped.
func (l *loop) admitRetry(i uint32, r *record, sched int64, attempt uint16, x *fireExtra, listed bool) {
	prof := l.profs.list[r.prof]
	// While its marker stands, no fire of a task that keeps its fires
	// apart starts here, so a retry handed on through etcd may be of a
	// run elsewhere's own fire, which ended: such a run does not count.
	// A retry a hand-over listed (listed) waited at a release past which
	// the run went on, so it is of an earlier fire, which its former
	// owner would have skipped beside that run.
	running := l.runningHere(i, r)
	if listed {
		running = int(r.running)
	}
	if x.backfill() == nil && admit(prof.concurrency, running, false, true) == admitSkip {
		l.skip(r, sched, attempt, "a newer fire of the task is running (concurrency "+string(prof.concurrency)+")")
		return
	}
	r.running++
	j := l.jobOf(i, r, prof, sched, l.cfg.Clock.Now().UnixNano(), kindRetry)
	j.attempt, j.extra = attempt, x
	l.jobs = append(l.jobs, j)
}

// complete applies finished attempts: counters, retries, buffered fires.
func (l *loop) complete(b *completionBatch) {
	l.epoch++
	for i := range b.c[:b.n] {
		c := &b.c[i]
		r := l.tab.rec(c.rec)
		if r.flags&flagLive == 0 || r.gen != c.gen {
			l.leftEnded(c, b.extra(c)) // the task is gone, with a release or deleted
			continue
		}
		r.running--
		r.status = c.status
		x := b.extra(c)
		if c.kind == kindTrigger && !x.unstarted {
			// One a cut canceled before it started has not ended: its key
			// stays, at a put again since too, and the drop's seal or the
			// undo forgets it (loop.forgetUnstarted). Ended, the key put
			// again went, and nobody fired it.
			l.triggerEnded(l.triggerKeyOf(r, c.sched))
		}
		prof := l.profs.list[r.prof]
		final := true
		if c.status == statusFailed || c.status == statusTimeout {
			r.failures++
			if int(c.attempt) < prof.maxAttempts {
				l.retry(c.rec, r, prof, c.sched, c.attempt+1, x.extra)
				final = false
			}
		}
		if final {
			streak := r.failStreak
			if ev := l.outcome(c.rec, r, c.sched, c.status, x.err); ev != "" {
				l.alert(ev, r, c.sched, int(c.attempt), c.status, x.err)
			}
			if r.failStreak > streak {
				l.pauseOnFailure(r) // a fire that ends without adding to the run pauses nothing
			}
		}
		l.admitWaiting(c.rec, r)
		if final {
			l.checkEnded(c.rec, r)
		}
	}
	l.pool.recycle(b)
	if len(l.jobs) > 0 {
		l.pushJobs()
	}
}

// admitWaiting runs record i's fire that waited for its running one
// (buffer_one), once none runs: at the gate when a publish of the waiting
// fires listed it.
func (l *loop) admitWaiting(i uint32, r *record) {
	if w, ok := l.pending[i]; ok && r.running == 0 {
		l.unbuffer(i)
		n := len(l.jobs)
		l.admit(i, r, l.profs.list[r.prof], w.ownFire, l.cfg.Clock.Now().UnixNano())
		if w.kind == kindSchedule && l.retryBuilt[r.part] > w.since {
			l.gate(n)
		}
	}
}

// retry waits in the wheel, never in a worker: exponential backoff with
// jitter, capped.
func (l *loop) retry(i uint32, r *record, prof *profile, sched int64, attempt uint16, x *fireExtra) {
	l.waitRetry(i, r, sched, attempt, l.cfg.Clock.Now().UnixNano()+int64(retryWait(prof, attempt)), x)
}

// retryWait is how long attempt attempt waits after the one before failed:
// exponential backoff with jitter, capped.
func retryWait(prof *profile, attempt uint16) time.Duration {
	backoff := prof.backoff << min(attempt-2, 30)
	if backoff <= 0 || backoff > prof.maxBackoff {
		backoff = prof.maxBackoff
	}
	// Between half and all of the backoff, so that failed fires spread.
	return backoff/2 + rand.N(backoff/2+1)
}

// waitRetry puts attempt attempt of record i's fire at sched in the wheel
// until due, in the slot it returns.
func (l *loop) waitRetry(i uint32, r *record, sched int64, attempt uint16, due int64, x *fireExtra) uint32 {
	var slot uint32
	if n := len(l.rfree); n > 0 {
		slot = l.rfree[n-1]
		l.rfree = l.rfree[:n-1]
	} else {
		slot = uint32(len(l.retries))
		l.retries = append(l.retries, retryState{})
	}
	l.retries[slot] = retryState{rec: i, gen: r.gen, sched: sched, due: due, attempt: attempt, part: r.part, extra: x}
	l.noteRetry(slot, true)
	l.waiting[leavingKey(i, r.gen)]++
	l.retrying.Store(int64(len(l.retries) - len(l.rfree)))
	l.wheel.Schedule(retryBase+slot, due)
	return slot
}

// handedRetryKey is a retry a former owner handed on: its record's, its
// fire's and which attempt.
type handedRetryKey struct {
	rec, gen uint32
	sched    int64
	attempt  uint16
}

// waitHandedRetry is waitRetry for a retry a former owner handed on, in
// its released checkpoint or its watermark (listed), or through etcd (leavers):
// should both hold it (the owner that took its key listed it, before the
// key's delete succeeded), it runs once. An acquire runs the lists before
// it reads the keys, and a retry already due there (its backoff ran out
// while a crashed owner's lease expired) came due in between: it is
// remembered triggerWait since (loop.handed), as a trigger that fired is.
// It reports whether the retry waits here, not held already.
func (l *loop) waitHandedRetry(i uint32, r *record, sched int64, attempt uint16, due int64, x *fireExtra, listed bool) bool {
	k := handedRetryKey{i, r.gen, sched, attempt}
	if _, ok := l.handed[k]; ok {
		return false
	}
	l.handed[k] = 0
	slot := l.waitRetry(i, r, sched, attempt, due, x)
	l.retries[slot].handed, l.retries[slot].listed = true, listed
	return true
}

// freeRetry frees a retry's slot, due or handed over.
func (l *loop) freeRetry(slot uint32) {
	rs := &l.retries[slot]
	if rs.handed {
		delete(l.handed, handedRetryKey{rs.rec, rs.gen, rs.sched, rs.attempt})
	}
	if k := leavingKey(rs.rec, rs.gen); l.waiting[k] > 1 {
		l.waiting[k]--
	} else {
		delete(l.waiting, k)
	}
	l.noteRetry(slot, false)
	l.retries[slot] = retryState{}
	l.rfree = append(l.rfree, slot)
	l.retrying.Store(int64(len(l.retries) - len(l.rfree)))
}
