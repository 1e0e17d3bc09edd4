package engine

import (
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/task"
)

// The misfire and concurrency policies as pure functions of their inputs:
// the loop keeps the bookkeeping (counters, records, the queue), these
// decide. To add a policy, add its constant to the task model and a case
// here; the table tests in policy_test.go cover each policy in each case.

// misfireFire decides what a fire released later than the misfire
// threshold becomes, for a task of policy p whose schedule is h: the
// scheduled time to fire now (0: none), and the time its schedule resumes
// after. Missed times are those from sched up to now, and none older than
// the catch-up window.
//
// fire_all fires every missed time in the window, oldest first: this one,
// or the first in the window, its successors coming due at once (the loop
// arms them in the past). fire_once fires the latest missed time only.
// skip fires none.
func misfireFire(p task.MisfirePolicy, h schedule.Schedule, sched, now int64, catchup time.Duration) (fire, resume int64) {
	oldest := now - int64(catchup)
	switch p {
	case task.MisfireFireAll:
		first := sched
		if first < oldest {
			first = next(h, oldest-1)
		}
		if first != 0 && first <= now {
			fire = first
		}
	case task.MisfireFireOnce:
		fire = latestBefore(h, max(sched, oldest), now)
	}
	if fire == 0 {
		return 0, now
	}
	return fire, fire
}

// misfireWhy is the reason recorded for a missed time that policy p did
// not fire, fire being what it fired instead (0: none). A fire_once or
// fire_all that fired none found every missed time older than the
// catch-up window, and says so: the policy's name alone reads as a fire
// that should have come.
func misfireWhy(p task.MisfirePolicy, fire int64, catchup time.Duration) string {
	why := "missed by more than the misfire threshold (" + string(p) + ")"
	if fire == 0 && p != task.MisfireSkip {
		why += ", and older than the catch-up window (" + catchup.String() + "): none ran"
	}
	return why
}

// admission is what becomes of a fire while the task may still run.
type admission uint8

const (
	admitRun     admission = iota // run it
	admitSkip                     // record it skipped
	admitBuffer                   // hold it until the running fire ends (buffer_one)
	admitReplace                  // cancel the running and waiting fires, then run it
)

// admit decides a fire of a task of policy p with running fires in
// flight, one of which may be buffered (waiting). A retry is a later
// attempt of an older fire: while another fire runs, only allow lets it
// run alongside.
func admit(p task.ConcurrencyPolicy, running int, waiting, retry bool) admission {
	if running == 0 || p == task.ConcurrencyAllow {
		return admitRun
	}
	if retry {
		return admitSkip
	}
	switch p {
	case task.ConcurrencyBufferOne:
		if waiting {
			return admitSkip
		}
		return admitBuffer
	case task.ConcurrencyReplace:
		return admitReplace
	}
	return admitSkip // forbid
}

// latestBefore returns the latest fire of h in [from, to], or 0. A
// schedule of fixed period jumps there; others bisect on time, about 60
// Next calls whatever the window, instead of one per missed fire.
func latestBefore(h schedule.Schedule, from, to int64) int64 {
	first := next(h, from-1)
	if first == 0 || first > to {
		return 0
	}
	if p, ok := h.(interface{ Period() time.Duration }); ok && p.Period() > 0 {
		d := int64(p.Period())
		return first + (to-first)/d*d
	}
	// The largest x with next(x) <= to gives the latest fire: next(x).
	lo, hi := first-1, to // next(lo) <= to; next(hi) > to
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if n := next(h, mid); n != 0 && n <= to {
			lo = mid
		} else {
			hi = mid
		}
	}
	return next(h, lo)
}

// next returns the first fire of h after t (unix ns), or 0.
func next(h schedule.Schedule, t int64) int64 {
	n := h.Next(time.Unix(0, t))
	if n.IsZero() {
		return 0
	}
	return n.UnixNano()
}
