package engine

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Windows, limits and one-shot tasks on the owner. A task's window
// (task.Window: not_before, not_after, max_fires, an @at time) is a
// function of its definition, so it wraps the task's schedule: every Next
// the loop computes (arming, rescheduling, resuming after a hand-over,
// misfire decisions) finds only fires inside it, and a task past its
// window has no next fire and leaves the wheel. A new owner computes the
// same window, so a hand-over neither repeats nor adds a fire to a count:
// no counter is kept.
//
// An @at task is "@every 1s" bounded to its one second: the schedule
// table, which never forgets a schedule, then holds one schedule for every
// one-shot task rather than one per instant; the window lives in the
// task's profile, which goes with its last task.

// window is a task's schedule bounded to its window: a schedule.Schedule
// that the loop uses in place of the interned one. Immutable.
type window struct {
	s        schedule.Schedule
	from, to int64  // unix ns; 0: open
	end      string // task.Ended*: what sets to
	once     bool   // an @at task: a put with its time past fires by the misfire policy
	written  int64  // an @at task: when its definition was last written (updated_at, unix ns)
}

// Next is the first fire of the schedule after t inside the window.
func (w *window) Next(t time.Time) time.Time {
	if w.from != 0 && t.UnixNano() < w.from {
		t = time.Unix(0, w.from-1)
	}
	n := w.s.Next(t)
	if n.IsZero() || w.to != 0 && n.UnixNano() > w.to {
		return time.Time{}
	}
	return n
}

// same reports whether a and b bound the same schedule alike.
func (w *window) same(b *window) bool {
	if w == nil || b == nil {
		return w == b
	}
	return w.s == b.s && w.from == b.from && w.to == b.to
}

// atSchedule stands for an @at schedule in the schedule table.
const atSchedule = "@every 1s"

// windowOf returns the window of a validated task whose interned schedule
// is h, nil when it has none, and the schedule to intern for it. anchor
// is when max_fires counts from for a task without created_at.
func windowOf(t *task.Task, s schedule.Schedule, anchor time.Time) *window {
	tw := t.Window(s, anchor)
	if !tw.Bounded() {
		return nil
	}
	w := &window{s: s, end: tw.End}
	if !tw.From.IsZero() {
		w.from = tw.From.UnixNano()
	}
	if !tw.To.IsZero() {
		w.to = tw.To.UnixNano()
	}
	w.once = tw.End == task.EndedAt
	if w.once && !t.UpdatedAt.IsZero() {
		w.written = t.UpdatedAt.UnixNano()
	}
	return w
}

// appendWindowKey extends a profile's key in b with its window and
// deletion, which depend on the schedule's handle h (max_fires counts its
// fires).
func appendWindowKey(b []byte, h schedule.Handle, w *window, t *task.Task) []byte {
	if w == nil && !t.DeleteAfterFire {
		return b
	}
	b = append(b, "|w"...)
	b = strconv.AppendUint(b, uint64(h), 10)
	if w != nil {
		b = strconv.AppendInt(append(b, ','), w.from, 10)
		b = strconv.AppendInt(append(b, ','), w.to, 10)
		b = append(append(b, ','), w.end...)
		b = strconv.AppendInt(append(b, ','), w.written, 10)
	}
	if t.DeleteAfterFire {
		b = strconv.AppendInt(append(b, ",d"...), t.UpdatedAt.UnixNano(), 10)
	}
	return b
}

// schedOf returns the schedule record r fires by: its window when it has
// one. Called only from the dispatch loop.
func (l *loop) schedOf(r *record) schedule.Schedule {
	if w := l.profs.list[r.prof].win; w != nil {
		return w
	}
	return l.scheds.Get(r.sched)
}

// nextOf returns record r's first fire after from (unix ns), or 0.
func (l *loop) nextOf(r *record, from int64) int64 {
	if w := l.profs.list[r.prof].win; w != nil {
		return next(w, from)
	}
	return l.nextMemo(r.sched, from)
}

// startOf returns the fire record r resumes with after resume. A one-shot
// whose time is not after resume is armed at its time all the same when
// nobody can have decided it yet: it was just put (a watch event), or
// written after resume (a put while its partition changed hands, which the
// new owner loads), unless decided says the previous owner held it at that
// time before resume (the write changed something else: a label, a pause).
// Released late, its misfire policy decides (fire it, or record it
// missed), as for any fire its owner could not run in time.
func (l *loop) startOf(r *record, resume int64, put, decided bool) int64 {
	n := l.firstAfter(r, resume)
	if w := l.profs.list[r.prof].win; n == 0 && w != nil && w.once && (put || w.written > resume && !decided) {
		n = w.from
	}
	return n
}

// endedOf says why record r fires no more ("" while it has fires to come).
func (l *loop) endedOf(r *record) string {
	w := l.profs.list[r.prof].win
	if w == nil || w.to == 0 || r.next != 0 || r.flags&flagPaused != 0 {
		return ""
	}
	return w.end
}

// endedTask is a delete_after_fire task whose last fire ended: its owner
// deletes it if its definition did not change since (updatedAt).
type endedTask struct {
	id        string
	updatedAt time.Time
}

// endedQueue bounds the deletions waiting for the deleter. A deletion that
// does not fit waits for the partition's next acquire, which looks again.
const endedQueue = 1024

// checkEnded hands a delete_after_fire task to the deleter once it has no
// fire to come, none running and none waiting (for the running one, or
// out a retry's backoff), unless it was edited while its last fire ran.
// A paused task stays: the pause holds it, and its next time is 0 whether
// or not its window has times to come; a fire that ends while it is
// paused (skipped for the pause included) leaves the check to its resume
// (flagEndWaits, which a release hands to the partition's next owner, and
// the watermark writes to one after a crash or a fence: endwaits.go), as
// does a pause alone that comes before the deleter's delete (upsert).
// Called only from the dispatch loop.
func (l *loop) checkEnded(i uint32, r *record) {
	prof := l.profs.list[r.prof]
	if !prof.deleteAfter || r.flags&(flagDeleting|flagEdited) != 0 || r.next != 0 || r.running > 0 {
		return
	}
	if _, waiting := l.pending[i]; waiting {
		return
	}
	// The retry of an earlier fire waiting out its backoff is a fire not
	// ended: the delete would drop it, and that fire never got its
	// attempts. Its end looks again (a retry skipped while another fire
	// runs leaves that one to: it runs).
	if l.retryWaits(i, r) {
		return
	}
	if r.flags&flagPaused != 0 {
		l.markEndWaits(i, r)
		return
	}
	select {
	case l.ended <- endedTask{id: l.tab.id(r), updatedAt: prof.updatedAt}:
		r.flags |= flagDeleting
	default:
		l.cfg.Logger.Warn("too many ended tasks waiting to be deleted; this one waits for the next acquire of its partition", "task", l.tab.id(r))
	}
}

// retryWaits reports whether a retry of record i waits out its backoff.
// A lookup, not a scan of every retry: a burst of one-shots ending on a
// node with a backlog of retries asks it of each.
func (l *loop) retryWaits(i uint32, r *record) bool {
	return l.waiting[leavingKey(i, r.gen)] > 0
}

// endedCmd looks for the delete_after_fire tasks of a partition just
// acquired that ended on a previous owner, which did not delete them (it
// crashed, or its deleter did not get to them). Not knowing what that
// owner fired, it deletes only tasks last written before their last
// scheduled time: one edited later (while or after it fired), or put after
// its time (a one-shot fired late by its misfire policy), stays, ended.
// A task whose last fire ended while it was paused there, as its release
// said (flagEndWaits), and resumed since, is looked at as its resume
// would have been.
type endedCmd struct{ part int }

func (c *endedCmd) run(l *loop) {
	if !l.parts[c.part].owned {
		return
	}
	l.tab.eachIn(c.part, func(i uint32, r *record) {
		prof := l.profs.list[r.prof]
		if !prof.deleteAfter || r.flags&flagPaused != 0 {
			return // a paused task is not known to have ended, nor to have fired
		}
		if !l.checkEndWaits(i, r) && prof.win != nil && prof.win.to != 0 && prof.updatedAt.UnixNano() <= prof.win.to {
			l.checkEnded(i, r)
		}
	})
}

// checkEndWaits takes the mark of a resumed task whose fire ended while it
// was paused (flagEndWaits), if record i has one, and looks whether the
// task ended (checkEnded); it reports whether there was a mark. Called
// only from the dispatch loop.
func (l *loop) checkEndWaits(i uint32, r *record) bool {
	if r.flags&flagEndWaits == 0 {
		return false
	}
	l.clearEndWaits(i, r)
	l.checkEnded(i, r)
	return true
}

// deleteEnded deletes the ended tasks the loop hands over until ctx ends.
func (e *Engine) deleteEnded(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-e.loop.ended:
			e.deleteTask(ctx, t)
		}
	}
}

// deleteTask deletes an ended task unless it changed since its last fire
// ended: the definition read must be the one fired, and the delete is
// conditioned on its version, so that an edit at any point wins.
func (e *Engine) deleteTask(ctx context.Context, t endedTask) {
	var b backoff
	for {
		err := e.deleteIfUnchanged(ctx, t)
		switch {
		case err == nil:
			e.log.Info("deleted a task after its last fire (delete_after_fire)", "task", t.id)
			return
		case errors.Is(err, registry.ErrNotFound):
			return
		case errors.Is(err, registry.ErrVersionMismatch):
			e.log.Info("an ended task was written since its last fire; not deleted now (delete_after_fire): an edit keeps it, a pause leaves it to the resume", "task", t.id)
			return
		}
		e.log.Warn("deleting an ended task failed; retrying", "task", t.id, "err", err)
		if !b.wait(ctx) {
			return
		}
	}
}

func (e *Engine) deleteIfUnchanged(ctx context.Context, t endedTask) error {
	ctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	stored, err := e.reg.Get(ctx, t.id)
	if err != nil {
		return err
	}
	if !stored.UpdatedAt.Equal(t.updatedAt) {
		return registry.ErrVersionMismatch
	}
	return e.reg.DeleteIfVersion(ctx, t.id, stored.Version)
}
