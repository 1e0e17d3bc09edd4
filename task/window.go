package task

import (
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
)

// MaxFiresLimit is the largest max_fires. The end of a cron schedule's
// count is found by stepping through its fires when the owner loads the
// task, about 270 ns each in a zone with daylight saving time: at most
// 3 ms per task (BenchmarkNthFire; @every takes 2 µs whatever the count).
const MaxFiresLimit = 10_000

// Why a task fires no more (State.Ended).
const (
	// EndedNotAfter: the schedule's next time is after NotAfter.
	EndedNotAfter = "not_after"
	// EndedMaxFires: the first MaxFires scheduled times are past.
	EndedMaxFires = "max_fires"
	// EndedAt: the one fire of an @at schedule is past.
	EndedAt = "at"
)

// Window is when a task's fires are scheduled: the times of its schedule
// in [From, To], a zero bound leaving that side open. End names the
// field that sets To (EndedNotAfter, EndedMaxFires, EndedAt), empty when
// To is zero.
//
// A window is a function of the task's definition alone, so every node
// computes the same one, and a new owner after a hand-over continues the
// same count of max_fires with no counter kept anywhere.
type Window struct {
	From, To time.Time
	End      string
}

// Contains reports whether the scheduled time at lies in w.
func (w Window) Contains(at time.Time) bool {
	return (w.From.IsZero() || !at.Before(w.From)) && (w.To.IsZero() || !at.After(w.To))
}

// Bounded reports whether w limits anything.
func (w Window) Bounded() bool { return !w.From.IsZero() || !w.To.IsZero() }

// span says when the window's times lie, for errors.
func (w Window) span() string {
	f, t := w.From.UTC().Format(time.RFC3339), w.To.UTC().Format(time.RFC3339)
	switch {
	case w.From.IsZero():
		return "up to " + t
	case w.To.IsZero():
		return "from " + f + " on"
	}
	return "from " + f + " to " + t
}

// Window returns the window of a validated task whose schedule, parsed
// from Schedule, is s. MaxFires counts the scheduled times of s from
// NotBefore, else CreatedAt, else anchor (a task not yet stored: the
// preview and dry runs pass the present). An @at schedule's window is its
// one time.
func (t *Task) Window(s schedule.Schedule, anchor time.Time) Window {
	w := Window{From: t.NotBefore, To: t.NotAfter}
	if !w.To.IsZero() {
		w.End = EndedNotAfter
	}
	if at, ok, err := schedule.At(t.Schedule, t.Timezone); ok && err == nil {
		w.From, w.To, w.End = at, at, EndedAt
		return w
	}
	if t.MaxFires > 0 {
		from := t.NotBefore
		if from.IsZero() {
			from = t.CreatedAt
		}
		if from.IsZero() {
			from = anchor
		}
		w.From = from // the count's first time opens the window
		last := nthFire(s, from, t.MaxFires)
		if !last.IsZero() && (w.To.IsZero() || last.Before(w.To)) {
			w.To, w.End = last, EndedMaxFires
		}
	}
	return w
}

// nthFire returns the n-th fire (n >= 1) of s at or after from, or zero
// when there are fewer. A schedule of fixed period jumps there.
func nthFire(s schedule.Schedule, from time.Time, n int) time.Time {
	at := s.Next(from.Add(-time.Nanosecond))
	if at.IsZero() {
		return at
	}
	if p, ok := s.(interface{ Period() time.Duration }); ok && p.Period() > 0 {
		// Past year 9999 there is no fire: Next says so.
		last := at.Add(time.Duration(n-1) * p.Period())
		if s.Next(last.Add(-time.Nanosecond)).Equal(last) {
			return last
		}
		return time.Time{}
	}
	for range n - 1 {
		if at = s.Next(at); at.IsZero() {
			return at
		}
	}
	return at
}

// checkWindow checks not_before, not_after, max_fires and
// delete_after_fire against each other and the schedule s.
func (t *Task) checkWindow(s schedule.Schedule) error {
	at, once, _ := schedule.At(t.Schedule, t.Timezone) // Validate parsed it
	nb, na := t.NotBefore, t.NotAfter
	if !nb.IsZero() && !na.IsZero() && !na.After(nb) {
		return Invalid("not_after", "%s is not after not_before %s", na.Format(time.RFC3339Nano), nb.Format(time.RFC3339Nano))
	}
	switch {
	case t.MaxFires < 0 || t.MaxFires > MaxFiresLimit:
		return Invalid("max_fires", "%d is not within 1-%d (leave it out for no limit)", t.MaxFires, MaxFiresLimit)
	case t.MaxFires > 0 && once:
		return Invalid("max_fires", "an @at schedule fires once: leave max_fires out")
	}
	if !nb.IsZero() || !na.IsZero() {
		// The zero time is before every fire: Next looks from year 1.
		first := s.Next(nb.Add(-time.Nanosecond))
		if first.IsZero() || !na.IsZero() && first.After(na) {
			if once {
				return Invalid("schedule", "%s is outside not_before and not_after: the task would never fire", at.Format(time.RFC3339))
			}
			return Invalid("not_after", "the schedule has no time between not_before and not_after: the task would never fire")
		}
	}
	if t.DeleteAfterFire && !once && na.IsZero() && t.MaxFires == 0 {
		return Invalid("delete_after_fire", "the task never ends: use an @at schedule, not_after or max_fires")
	}
	return nil
}

// instant decodes an RFC 3339 time.
func (d *objDecoder) instant(name string, dst *time.Time) {
	r, ok := d.raw(name)
	if !ok {
		return
	}
	var s string
	if err := unmarshal(r, &s); err != nil {
		d.fail(name, "want an RFC 3339 time such as \"2027-01-01T00:00:00Z\", got %s", jsonKind(r))
		return
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		d.fail(name, "%q is not an RFC 3339 time such as \"2027-01-01T00:00:00Z\"", s)
		return
	}
	*dst = v
}

// bound decodes not_before or not_after. The zero time is refused: it
// reads as no bound, so a not_after of year 1 would fire for ever.
func (d *objDecoder) bound(name string, dst *time.Time) {
	d.instant(name, dst)
	if d.err == nil && dst.IsZero() {
		if r, ok := d.raw(name); ok {
			d.fail(name, "%s is the zero time, which reads as no time: leave the field out for none", r)
		}
	}
}

// maxFires decodes max_fires; an explicit 0 is refused, since it would
// silently mean no limit.
func (d *objDecoder) maxFires(name string, dst *int) {
	d.value(name, dst, "a whole number")
	if _, ok := d.raw(name); ok && d.err == nil && *dst == 0 {
		d.fail(name, "0 is not within 1-%d (leave it out for no limit)", MaxFiresLimit)
	}
}

// utcOrZero returns t in UTC without a monotonic reading, or the zero time.
func utcOrZero(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Round(0)
}
