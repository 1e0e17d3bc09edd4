package task

import (
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
)

// Backfill limits.
const (
	// MaxBackfillFires is the most scheduled times one backfill runs.
	MaxBackfillFires = 10000
	// MaxBackfillConcurrency is the most fires of one backfill in flight.
	MaxBackfillConcurrency = 32
	// DefaultBackfillConcurrency is a backfill's concurrency left out.
	DefaultBackfillConcurrency = 1
)

// Backfill states.
const (
	BackfillRunning  = "running"
	BackfillDone     = "done"
	BackfillCanceled = "canceled" // by a request; Done and Through say how far it got
)

// Backfill is a backfill of a task: every scheduled time of the task in
// [From, To] run once, with the fire's usual idempotency key, at most
// Concurrency at a time. The task's owner runs it and records its progress
// in etcd, where a new owner finds it after a hand-over.
type Backfill struct {
	From        time.Time `json:"from"`
	To          time.Time `json:"to"`
	Concurrency int       `json:"concurrency"`
	// Fires is how many scheduled times [From, To] holds.
	Fires int `json:"fires"`
	// Through is the progress: every fire of the backfill scheduled at or
	// before it has been handed to a worker (graceful hand-over) or has
	// ended (while it runs). Zero before the first.
	Through time.Time `json:"through,omitzero"`
	// Done counts the fires at or before Through.
	Done int `json:"done"`
	// State is running, done or canceled.
	State     string    `json:"state"`
	CreatedAt time.Time `json:"created_at"`
	// Node is the node that recorded the progress last.
	Node string `json:"node,omitempty"`
}

// BackfillTimes returns the scheduled times of t in [from, to], checking
// the request's limits: from before to, to not after now, at most
// MaxBackfillFires times, concurrency within 1-MaxBackfillConcurrency (0:
// the default). Errors are *ValidationError naming the request's field.
// The task's window bounds the times as it bounds its fires
// (ScheduledTimes): a backfill runs only times the task would have fired.
func BackfillTimes(t *Task, from, to, now time.Time, concurrency int) ([]time.Time, error) {
	if from.IsZero() {
		return nil, Invalid("from", "required: an RFC 3339 time such as \"2026-01-01T00:00:00Z\"")
	}
	if to.IsZero() {
		return nil, Invalid("to", "required: an RFC 3339 time such as \"2026-01-02T00:00:00Z\"")
	}
	if !from.Before(to) {
		return nil, Invalid("to", "%s is not after from %s", to.Format(time.RFC3339), from.Format(time.RFC3339))
	}
	if to.After(now) {
		return nil, Invalid("to", "%s is in the future (now %s): a backfill runs past fires only", to.Format(time.RFC3339), now.Format(time.RFC3339))
	}
	if concurrency < 0 || concurrency > MaxBackfillConcurrency {
		return nil, Invalid("concurrency", "%d is not within 1-%d", concurrency, MaxBackfillConcurrency)
	}
	sched, err := schedule.Parse(t.Schedule, t.Timezone, t.ID)
	if err != nil {
		return nil, Invalid("schedule", "%s", err.Error())
	}
	times, more := ScheduledTimes(t, sched, from, to, now, MaxBackfillFires)
	if more {
		return nil, Invalid("to", "[from, to] holds more than %d scheduled times, the limit of one backfill: split it", MaxBackfillFires)
	}
	if len(times) == 0 {
		if w := t.Window(sched, now); w.Bounded() {
			return nil, Invalid("from", "the task's window (not_before, not_after, max_fires or @at: %s) leaves no scheduled time in [%s, %s]",
				w.span(), from.Format(time.RFC3339), to.Format(time.RFC3339))
		}
		return nil, Invalid("from", "the schedule %q has no fire in [%s, %s]", t.Schedule, from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	return times, nil
}

// ScheduledTimes returns the scheduled times of t (whose schedule, parsed
// from Schedule, is s) in [from, to] and inside its window, at most limit
// of them in order; more reports that [from, to] holds others past those.
// anchor is Window's, for a task without created_at. The registry counts
// a backfill's fires and the owner runs them with it, so both agree.
func ScheduledTimes(t *Task, s schedule.Schedule, from, to, anchor time.Time, limit int) (times []time.Time, more bool) {
	w := t.Window(s, anchor)
	if w.From.After(from) {
		from = w.From
	}
	if !w.To.IsZero() && w.To.Before(to) {
		to = w.To
	}
	for n := s.Next(from.Add(-time.Nanosecond)); !n.IsZero() && !n.After(to); n = s.Next(n) {
		if len(times) == limit {
			return times, true
		}
		times = append(times, n.UTC())
	}
	return times, false
}
