package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// clockTweak runs a node on clock. The bounded lead and the misfire
// threshold are in clock time; the watermark interval is real time (the
// writer's ticker and the loop's longest sleep), so 10 ms keeps the lead
// fed at any test speed and lets the loop see a clock jump within 10 ms.
func clockTweak(clock Clock, misfire time.Duration, more func(*Config)) func(*Config) {
	return func(cfg *Config) {
		cfg.Clock = clock
		cfg.WatermarkInterval = 10 * time.Millisecond
		cfg.Lead = time.Second
		cfg.MisfireThreshold = misfire
		if more != nil {
			more(cfg)
		}
	}
}

// TestEngine_DSTBerlin2026 runs Europe/Berlin tasks through both clock
// changes of 2026 on a clock ten times faster than real time, and checks
// docs/api.md's rule end to end: a wall time in the spring gap fires once at
// the first instant after it, and a wall time of the repeated autumn hour
// fires only at its first occurrence.
func TestEngine_DSTBerlin2026(t *testing.T) {
	t.Parallel()
	utc := func(mo time.Month, d, h, m, s int) time.Time { return time.Date(2026, mo, d, h, m, s, 0, time.UTC) }
	type tsk struct {
		spec string
		want []time.Time // every fire while the clock runs from start to end
		next time.Time   // the next fire after end
	}
	tests := []struct {
		name       string
		start, end time.Time
		tasks      []tsk
	}{
		{
			// 2026-03-29 01:00 UTC: 02:00 CET becomes 03:00 CEST.
			name: "spring forward", start: utc(3, 29, 0, 59, 50), end: utc(3, 29, 1, 0, 20),
			tasks: []tsk{
				// Every 5 s of the missing hour: once, at 03:00:00 CEST.
				{"*/5 * 2 * * *", []time.Time{utc(3, 29, 1, 0, 0)}, utc(3, 30, 0, 0, 0)},
				// 02:30 does not exist: 03:00:00 CEST.
				{"0 30 2 * * *", []time.Time{utc(3, 29, 1, 0, 0)}, utc(3, 30, 0, 30, 0)},
			},
		},
		{
			// 2026-10-25 01:00 UTC: 03:00 CEST becomes 02:00 CET.
			name: "fall back", start: utc(10, 25, 0, 59, 40), end: utc(10, 25, 1, 0, 20),
			tasks: []tsk{
				// 02:59:45-02:59:55 CEST fire; the repeated 02:00:00 CET
				// (01:00:00 UTC) and its first seconds do not.
				{"*/5 * 2 * * *", []time.Time{utc(10, 25, 0, 59, 45), utc(10, 25, 0, 59, 50), utc(10, 25, 0, 59, 55)},
					utc(10, 26, 1, 0, 0)},
				// 02:00:00 CET repeats 02:00:00 CEST, which fired an hour ago.
				{"0 * 2 * * *", nil, utc(10, 26, 1, 0, 0)},
				// 02:30 CEST fired at 00:30 UTC; 02:30 CET does not fire.
				{"0 30 2 * * *", nil, utc(10, 26, 1, 30, 0)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := etcdtest.Start(t)
			clock := newTestClock(tt.start, 0) // frozen until the tasks are armed
			log := &callLog{}
			// A threshold far above any CI stall: this test is about DST,
			// not about misfires.
			n := startNode(t, c, "", log.handler(nil), clockTweak(clock, time.Hour, nil))
			ids := make([]string, len(tt.tasks))
			for i, tk := range tt.tasks {
				ids[i] = "dst/" + tk.spec
				tsk := handlerTask(ids[i], tk.spec)
				tsk.Timezone = "Europe/Berlin"
				putTask(t, n.e.Registry(), tsk)
				first := tk.next
				if len(tk.want) > 0 {
					first = tk.want[0]
				}
				waitNext(t, n, ids[i], first)
			}

			clock.SetSpeed(10)
			// The acknowledged watermark passing end means every fire up to
			// end has been taken by a worker.
			etcdtest.WaitFor(t, 30*time.Second, func() bool { return !n.e.Stats().Watermark.Before(tt.end) })
			for i, tk := range tt.tasks {
				if got := taskState(t, n, ids[i]).NextFireAt; !got.Equal(tk.next) {
					t.Errorf("%s: next fire %v, want %v", tk.spec, got, tk.next)
				}
			}
			n.stop(t) // waits for the handlers: every call is logged
			for i, tk := range tt.tasks {
				if got := log.scheds(ids[i]); !slices.EqualFunc(got, tk.want, time.Time.Equal) {
					t.Errorf("%s fired at %v, want %v (UTC)", tk.spec, secs(got), secs(tk.want))
				}
			}
		})
	}
}

// TestEngine_MisfirePolicies stops the clock, jumps it 30 s forward (a
// stalled node, a suspended VM) and checks what each misfire policy makes
// of the missed fires of an every-second task with a 5 s threshold and a
// 10 s catch-up window.
func TestEngine_MisfirePolicies(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }
	seq := func(from, to int) []time.Time {
		var out []time.Time
		for s := from; s <= to; s++ {
			out = append(out, at(s))
		}
		return out
	}
	start := at(0).Add(time.Second / 2) // 12:00:00.5, between two fires
	tests := []struct {
		policy task.MisfirePolicy
		// want is every fire: 01-03 on time, then the gap from 04 to 33
		// (the clock stops at 33.5), then 34 and 35 on time.
		want []time.Time
		// misfires is the task's counter, 0 for "at least one".
		misfires uint64
	}{
		// Nothing for the missed times; the schedule resumes after now.
		{task.MisfireSkip, slices.Concat(seq(1, 3), seq(34, 35)), 1},
		// Once, with the latest missed time.
		{task.MisfireFireOnce, slices.Concat(seq(1, 3), seq(33, 33), seq(34, 35)), 1},
		// Every missed time in the window [33.5-10s, 33.5], oldest first;
		// those still late by more than the threshold count as misfires
		// too.
		{task.MisfireFireAll, slices.Concat(seq(1, 3), seq(24, 33), seq(34, 35)), 0},
	}
	for _, tt := range tests {
		t.Run(string(tt.policy), func(t *testing.T) {
			t.Parallel()
			c := etcdtest.Start(t)
			clock := newTestClock(start, 0)
			log := &callLog{}
			// One worker: handlers run in the order fires were dispatched.
			n := startNode(t, c, "", log.handler(nil), clockTweak(clock, 5*time.Second, func(cfg *Config) { cfg.Workers = 1 }))
			const id = "misfire"
			tsk := handlerTask(id, "* * * * * *")
			tsk.Misfire = tt.policy
			tsk.CatchupWindow = task.Duration(10 * time.Second)
			tsk.HistoryLimit = &task.HistoryLimit{Successes: new(50)} // every record, not the last 10
			sink := newAlertSink(t)
			tsk.Notify = &task.Notify{On: []task.NotifyEvent{task.NotifyMisfire}, URL: sink.srv.URL}
			putTask(t, n.e.Registry(), tsk)
			waitNext(t, n, id, at(1))

			// 01, 02 and 03 fire late by at most 2.5 s: under the threshold.
			clock.Advance(3 * time.Second)
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt(id, at(3)) })
			// The gap.
			clock.Advance(30 * time.Second)
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				s := taskState(t, n, id)
				return s.Misfires > 0 && s.NextFireAt.Equal(at(34))
			})
			// On time again. The worker records a fire once its handler
			// returned, after the call the log holds: wait for the record
			// of 35 (the one worker ran the others before it).
			clock.Advance(2 * time.Second)
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return slices.Equal(statusesAt(t, n, id, at(35)), []string{"ok"}) })

			st := taskState(t, n, id)
			hist := history(t, n, id)
			stats := n.e.Stats()
			n.stop(t) // sends the queued alerts

			// One misfire alert for the gap, however many of its fires
			// were late; misfires are counted under the task's policy.
			if alerts, _ := sink.of(id); len(alerts) != 1 || alerts[0].Event != task.NotifyMisfire || alerts[0].Status != "misfired" {
				t.Errorf("alerts %+v, want one misfire alert", alerts)
			}
			for p, k := range stats.MisfiresByPolicy {
				if want := map[bool]uint64{true: stats.Misfires}[p == string(tt.policy)]; k != want || stats.Misfires == 0 {
					t.Errorf("misfires of policy %s: %d, want %d of %d", p, k, want, stats.Misfires)
				}
			}

			if got := log.scheds(id); !slices.EqualFunc(got, tt.want, time.Time.Equal) {
				t.Errorf("fired at %v,\nwant     %v", secs(got), secs(tt.want))
			}
			if d := duplicateKeys(log); len(d) > 0 {
				t.Errorf("duplicate fires: %v", d)
			}
			if tt.misfires != 0 && st.Misfires != tt.misfires || st.Misfires == 0 {
				t.Errorf("state: %d misfires, want %d (0: at least one)", st.Misfires, tt.misfires)
			}
			// The gap shows in the history as one "misfired" record, at the
			// first missed time; every fire that ran is "ok".
			var misfired, ok []time.Time
			for _, e := range hist {
				switch e.Status {
				case "misfired":
					misfired = append(misfired, e.ScheduledAt)
				case "ok":
					ok = append(ok, e.ScheduledAt)
				default:
					t.Errorf("unexpected record %+v", e)
				}
			}
			if want := []time.Time{at(4)}; !slices.EqualFunc(misfired, want, time.Time.Equal) {
				t.Errorf("misfired records at %v, want %v", secs(misfired), secs(want))
			}
			if !slices.EqualFunc(ok, tt.want, time.Time.Equal) {
				t.Errorf("ok records at %v, want %v", secs(ok), secs(tt.want))
			}
		})
	}
}

// duplicateKeys returns the idempotency keys whose first attempt was run
// more than once.
func duplicateKeys(l *callLog) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[string]int{}
	var d []string
	for _, c := range l.calls {
		if c.Attempt != 1 {
			continue
		}
		k := c.IdempotencyKey()
		if seen[k]++; seen[k] == 2 {
			d = append(d, k)
		}
	}
	return d
}

// TestEngine_MisfireCountsAsAnExecution: a fire released later than the
// misfire threshold, which its policy folds away (fire_once fires only the
// latest missed time), must show in Stats.Executions["misfired"]
// (shardcron_executions_total{status="misfired"}), which docs/api.md says
// counts "attempts by status, skipped and misfired included", as
// Executions["skipped"] counts a fire the concurrency policy skipped. A
// backlogged node that folds fires logs nothing, so the metrics are the
// only trace of them.
func TestEngine_MisfireCountsAsAnExecution(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return time.Date(2026, 5, 4, 12, 0, s, 0, time.UTC) }
	c := etcdtest.Start(t)
	clock := newTestClock(at(0).Add(time.Second/2), 0)
	log := &callLog{}
	n := startNode(t, c, "", log.handler(nil), clockTweak(clock, 5*time.Second, func(cfg *Config) { cfg.Workers = 1 }))
	const id = "misfire"
	tsk := handlerTask(id, "* * * * * *")
	tsk.Misfire = task.MisfireFireOnce
	tsk.CatchupWindow = task.Duration(10 * time.Second)
	putTask(t, n.e.Registry(), tsk)
	waitNext(t, n, id, at(1))

	clock.Advance(3 * time.Second) // 01-03 on time
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt(id, at(3)) })
	clock.Advance(30 * time.Second) // the gap: 04-32 folded, 33 fired
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return log.firedAt(id, at(33)) })
	stats := n.e.Stats()
	n.stop(t)

	if stats.Misfires == 0 {
		t.Fatalf("Stats.Misfires = 0 after a 30 s gap")
	}
	if got := stats.Executions[task.ExecutionMisfired]; got == 0 {
		t.Errorf("Stats.Executions[%q] = 0 after a misfire (Misfires = %d, Executions = %v): "+
			"the folded fire is counted nowhere among the executions", task.ExecutionMisfired, stats.Misfires, stats.Executions)
	}
}
