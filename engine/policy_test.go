package engine

import (
	"testing"
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/task"
)

func TestMisfireFire(t *testing.T) {
	tab := schedule.NewTable()
	intern := func(spec string) schedule.Schedule {
		h, err := tab.Intern(spec, "UTC", "x")
		if err != nil {
			t.Fatal(err)
		}
		return tab.Get(h)
	}
	every, hourly := intern("* * * * * *"), intern("0 0 * * * *")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano() // on the hour
	sec := int64(time.Second)
	window := time.Minute
	for _, tt := range []struct {
		name         string
		p            task.MisfirePolicy
		h            schedule.Schedule // nil: every second
		at           int64             // the decision's now; 0: now
		sched        int64
		fire, resume int64
	}{
		{"fire_once late", task.MisfireFireOnce, nil, 0, now - 10*sec, now, now},
		{"fire_once past the window", task.MisfireFireOnce, nil, 0, now - 5*60*sec, now, now},
		{"fire_all late", task.MisfireFireAll, nil, 0, now - 10*sec, now - 10*sec, now - 10*sec},
		{"fire_all past the window starts at its edge", task.MisfireFireAll, nil, 0, now - 5*60*sec, now - 60*sec, now - 60*sec},
		{"skip late", task.MisfireSkip, nil, 0, now - 10*sec, 0, now},
		{"skip past the window", task.MisfireSkip, nil, 0, now - 5*60*sec, 0, now},
		// The window's only time is now itself.
		{"fire_once, the window's only time now", task.MisfireFireOnce, hourly, 0, now - 3600*sec, now, now},
		{"fire_all, the window's only time now", task.MisfireFireAll, hourly, 0, now - 3600*sec, now, now},
		// Every missed time is older than the window: none runs, and
		// the next time, after now, is not fired early.
		{"fire_once, no time in the window", task.MisfireFireOnce, hourly, now + 30*60*sec, now, 0, now + 30*60*sec},
		{"fire_all, no time in the window", task.MisfireFireAll, hourly, now + 30*60*sec, now, 0, now + 30*60*sec},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, at := every, now
			if tt.h != nil {
				h = tt.h
			}
			if tt.at != 0 {
				at = tt.at
			}
			fire, resume := misfireFire(tt.p, h, tt.sched, at, window)
			if fire != tt.fire || resume != tt.resume {
				t.Errorf("misfireFire = %d, %d; want %d, %d (in s from now: %d, %d; want %d, %d)",
					fire, resume, tt.fire, tt.resume, (fire-now)/sec, (resume-now)/sec, (tt.fire-now)/sec, (tt.resume-now)/sec)
			}
		})
	}
}

// The record of a missed time that fire_once or fire_all did not fire, none
// of the times being within the catch-up window (a one-shot put long after
// its time, say), says so: it read "missed by more than the misfire
// threshold (fire_once)", the policy that would have fired it once.
func TestMisfireWhy(t *testing.T) {
	const threshold = "missed by more than the misfire threshold"
	for _, tt := range []struct {
		p    task.MisfirePolicy
		fire int64
		want string
	}{
		{task.MisfireSkip, 0, threshold + " (skip)"},
		{task.MisfireFireOnce, 0, threshold + " (fire_once), and older than the catch-up window (1m0s): none ran"},
		{task.MisfireFireAll, 0, threshold + " (fire_all), and older than the catch-up window (1m0s): none ran"},
		{task.MisfireFireOnce, 42, threshold + " (fire_once)"},
		{task.MisfireFireAll, 42, threshold + " (fire_all)"},
	} {
		if got := misfireWhy(tt.p, tt.fire, time.Minute); got != tt.want {
			t.Errorf("%s, fire %d: %q, want %q", tt.p, tt.fire, got, tt.want)
		}
	}
}

func TestAdmit(t *testing.T) {
	for _, tt := range []struct {
		p       task.ConcurrencyPolicy
		running int
		waiting bool
		retry   bool
		want    admission
	}{
		{task.ConcurrencyAllow, 0, false, false, admitRun},
		{task.ConcurrencyAllow, 3, false, false, admitRun},
		{task.ConcurrencyAllow, 1, false, true, admitRun},
		{task.ConcurrencyForbid, 0, false, false, admitRun},
		{task.ConcurrencyForbid, 1, false, false, admitSkip},
		{task.ConcurrencyForbid, 1, false, true, admitSkip},
		{task.ConcurrencyBufferOne, 0, false, false, admitRun},
		{task.ConcurrencyBufferOne, 1, false, false, admitBuffer},
		{task.ConcurrencyBufferOne, 1, true, false, admitSkip},
		{task.ConcurrencyBufferOne, 1, false, true, admitSkip},
		{task.ConcurrencyReplace, 0, false, false, admitRun},
		{task.ConcurrencyReplace, 1, false, false, admitReplace},
		{task.ConcurrencyReplace, 1, false, true, admitSkip},
	} {
		if got := admit(tt.p, tt.running, tt.waiting, tt.retry); got != tt.want {
			t.Errorf("admit(%s, running %d, waiting %v, retry %v) = %d, want %d", tt.p, tt.running, tt.waiting, tt.retry, got, tt.want)
		}
	}
}
