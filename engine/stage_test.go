package engine

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/task"
)

// dispatchAll dispatches until nothing more is due, as the loop's run
// does, and reschedules what it released.
func (tl *testLoop) dispatchAll() {
	for tl.dispatch() {
	}
	if len(tl.released) > 0 {
		tl.rescheduleReleased()
	}
}

// recordState is what a fire leaves in a task's record.
func (tl *testLoop) recordState(t *testing.T, id string) string {
	t.Helper()
	i, r, ok := tl.tab.lookup(id)
	if !ok {
		t.Fatalf("task %s is not in the table", id)
	}
	return fmt.Sprintf("next=%d last=%d running=%d fires=%d scheduled=%v", r.next, r.lastFire, r.running, r.fires, tl.wheel.Scheduled(i))
}

// A tick staged ahead fires as the same tick released at its second: the
// same fires queued in the same order, the same records after, the same
// dispatch point, and the next second armed.
func TestLoop_StagedTickFiresAsUnstaged(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	prof := noopProfile(task.MisfireFireOnce)
	load := func(tl *testLoop) {
		tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", ids("a", 25)...)
		tl.add(t, 1, base.Add(-time.Second), prof, "* * * * * *", ids("b", 25)...)
	}
	staged := newTestLoop(t, base.Add(-50*time.Millisecond), nil)
	load(staged)
	staged.dispatchAll() // up to the clock: nothing due
	staged.stageNext()
	if staged.staged.at != base.UnixNano() || len(staged.staged.jobs) != 50 {
		t.Fatalf("staged %d fires for %d, want 50 for the second %d", len(staged.staged.jobs), staged.staged.at, base.UnixNano())
	}
	if staged.through >= base.UnixNano() || staged.wheel.Len() != 50 {
		t.Fatalf("staging moved the dispatch point to %d or took timers out of the wheel (%d left)", staged.through, staged.wheel.Len())
	}
	staged.clock.Advance(51 * time.Millisecond)
	staged.dispatchAll()
	if staged.staged.at != 0 {
		t.Error("the stage was not used up by the tick's release")
	}
	for c, name := range stageDropNames {
		if n := staged.stats.stageDrops[c].Load(); n != 0 {
			t.Errorf("%d stage drops counted as %s for a stage used", n, name)
		}
	}

	plain := newTestLoop(t, base.Add(time.Millisecond), nil)
	load(plain)
	plain.dispatchAll()

	for part := range 2 {
		got, want := staged.dispatched(part), plain.dispatched(part)
		if !slices.Equal(got, want) {
			t.Errorf("partition %d: staged tick queued %v, want %v", part, got, want)
		}
	}
	for _, id := range append(ids("a", 25), ids("b", 25)...) {
		if got, want := staged.recordState(t, id), plain.recordState(t, id); got != want {
			t.Errorf("%s after the staged tick: %s, want %s", id, got, want)
		}
	}
	if staged.through != plain.through {
		t.Errorf("dispatch point %d after the staged tick, want %d", staged.through, plain.through)
	}
}

// What the loop does between staging a tick and its second drops the
// stage: a task deleted then does not fire, and a task edited then (its
// timer standing) fires its new definition.
func TestLoop_StageDroppedByWhatHappensBeforeItsSecond(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, change := range []string{"delete", "edit"} {
		t.Run(change, func(t *testing.T) {
			tl := newTestLoop(t, base.Add(-50*time.Millisecond), nil)
			prof, edited := noopProfile(task.MisfireFireOnce), noopProfile(task.MisfireSkip)
			tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", ids("a", 20)...)
			tl.dispatchAll()
			tl.stageNext()
			if len(tl.staged.jobs) != 20 {
				t.Fatalf("staged %d fires, want 20", len(tl.staged.jobs))
			}
			if change == "delete" {
				tl.handle(&eventsCmd{part: 0, deletes: []string{"a-003"}})
			} else {
				_, r, _ := tl.tab.lookup("a-003")
				tl.handle(&eventsCmd{part: 0, upserts: []taskDef{{id: "a-003", hash: xxhash.Sum64String("a-003"), part: 0, sched: r.sched, prof: edited}}})
			}
			tl.handle(wakeCmd{})
			tl.clock.Advance(51 * time.Millisecond)
			tl.dispatchAll()
			var got, want []string
			p := tl.pool
			p.mu.Lock()
			for i := range p.queued() {
				got = append(got, fmt.Sprintf("%s@%d/%s", p.at(i).id, p.at(i).sched/int64(time.Millisecond), p.at(i).prof.key))
			}
			p.mu.Unlock()
			for _, id := range ids("a", 20) {
				key := prof.key
				if id == "a-003" {
					if change == "delete" {
						continue
					}
					key = edited.key
				}
				want = append(want, fmt.Sprintf("%s@%d/%s", id, base.UnixMilli(), key))
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("queued %v, want %v (a-003: %s before its second)", got, want, change)
			}
			if n := tl.stats.stageDrops[dropChanged].Load(); n != 1 {
				t.Errorf("%d stage drops counted as changed, want 1", n)
			}
		})
	}
}

// stagedTick is a loop 50 ms before a second whose 10 fires (misfire skip)
// it has staged.
func stagedTick(t *testing.T) *testLoop {
	t.Helper()
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-50*time.Millisecond), nil)
	tl.add(t, 0, base.Add(-time.Second), noopProfile(task.MisfireSkip), "* * * * * *", ids("a", 10)...)
	tl.dispatchAll()
	tl.stageNext()
	if len(tl.staged.jobs) != 10 {
		t.Fatalf("staged %d fires, want 10", len(tl.staged.jobs))
	}
	return tl
}

// A stage whose tick comes past the misfire threshold is dropped, and
// counted so: release applies the misfire policies.
func TestLoop_StageDroppedWhenItsTickComesLate(t *testing.T) {
	tl := stagedTick(t)
	tl.clock.Advance(tl.cfg.MisfireThreshold + time.Second)
	tl.dispatchAll()
	if n := tl.stats.stageDrops[dropLate].Load(); n != 1 {
		t.Errorf("%d stage drops counted as late, want 1", n)
	}
	if n := tl.stats.staged.Load(); n != 0 {
		t.Errorf("%d fires released from the late stage", n)
	}
}

// A stage whose timers are not those the wheel releases at its tick (here
// in another order than Peek saw them) is dropped and counted as a
// mismatch, and release fires the tick as if nothing had been staged.
func TestLoop_StageDroppedWhenTheWheelReleasesOtherTimers(t *testing.T) {
	tl := stagedTick(t)
	tl.staged.peek[0], tl.staged.peek[1] = tl.staged.peek[1], tl.staged.peek[0]
	tl.clock.Advance(51 * time.Millisecond)
	tl.dispatchAll()
	if n := tl.stats.stageDrops[dropMismatch].Load(); n != 1 {
		t.Errorf("%d stage drops counted as a mismatch, want 1", n)
	}
	if n := tl.stats.staged.Load(); n != 0 {
		t.Errorf("%d fires released from the mismatched stage", n)
	}
	p := tl.pool
	p.mu.Lock()
	queued := p.queued()
	p.mu.Unlock()
	if queued != 10 {
		t.Errorf("%d fires queued, want the tick's 10", queued)
	}
}

// A command served between two batches of one burst sees every record
// released so far rescheduled: a schedule edited then takes effect from
// its next time, instead of the burst's rescheduling skipping it.
func TestLoop_CommandBetweenBatchesSeesNextTimes(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-time.Second/2), nil)
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", ids("a", 25)...)
	tl.clock.Advance(time.Second/2 + time.Millisecond)
	if !tl.dispatch() {
		t.Fatal("the first batch should be cut: the tick holds 25 fires, a batch 10")
	}
	first := tl.dispatched(0)[0] // released in the cut batch, its next time not yet computed
	id := first[:5]
	h, err := tl.scheds.Intern("*/5 * * * * *", "UTC", id)
	if err != nil {
		t.Fatal(err)
	}
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{{id: id, hash: xxhash.Sum64String(id), part: 0, sched: h, prof: prof}}})
	tl.dispatchAll()
	_, r, _ := tl.tab.lookup(id)
	if want := base.Add(5 * time.Second).UnixNano(); r.next != want {
		t.Errorf("%s edited to every 5 s between batches: next fire %s, want %s", id,
			time.Unix(0, r.next).UTC().Format(time.TimeOnly), time.Unix(0, want).UTC().Format(time.TimeOnly))
	}
}

// A staged fire counts as running before a retry of its task released in
// the same second is admitted: under forbid the retry is skipped, as it is
// when the tick is not staged. The stage ends at the retry's timer, so the
// retry comes out in the next batch, before the records of the staged
// fires are otherwise brought up to date.
func TestLoop_StagedFireCountsAsRunningForItsRetry(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	run := func(stage bool) []string {
		tl := newTestLoop(t, base.Add(-50*time.Millisecond), nil)
		prof := noopProfile(task.MisfireFireOnce)
		prof.concurrency = task.ConcurrencyForbid
		tl.add(t, 0, base.Add(-time.Second), prof, "* * * * * *", "x")
		i, r, _ := tl.tab.lookup("x") // the fire at S-1 failed: its retry is due at S
		tl.waitRetry(i, r, base.Add(-time.Second).UnixNano(), 2, base.UnixNano(), nil)
		tl.dispatchAll()
		if stage {
			tl.stageNext()
			if len(tl.staged.jobs) != 1 {
				t.Fatalf("staged %d fires, want x's", len(tl.staged.jobs))
			}
		}
		tl.clock.Advance(52 * time.Millisecond)
		tl.dispatchAll()
		return tl.dispatched(0)
	}
	if plain, staged := run(false), run(true); !slices.Equal(plain, staged) {
		t.Errorf("the staged tick queued %v, the unstaged one %v", staged, plain)
	}
}

// A tick with more fires than the queue holds is staged whole, and goes to
// the pool whole, once the loop was idle while no tick was near: the
// stage's slice is sized to the tick then. A loop idle only just before
// the tick stages what the queue has room for. The queue takes nothing
// more until the workers have taken the stage below its length.
func TestLoop_StageGrowsPastTheQueue(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-50*time.Millisecond), func(c *Config) { c.Queue, c.Stage = 20, 100 })
	tl.add(t, 0, base.Add(-time.Second), noopProfile(task.MisfireFireOnce), "* * * * * *", ids("a", 70)...)
	// The workers run what is queued (this loop's take nothing), and the
	// loop releases what waited for room, as before it sleeps.
	idle := func() {
		for {
			var done completionBatch
			p := tl.pool
			p.mu.Lock()
			for i := range p.queued() {
				j := p.at(i)
				done.c[done.n] = completion{sched: j.sched, rec: j.rec, gen: j.gen, attempt: j.attempt, kind: j.kind, status: statusOK}
				done.n++
				if done.n == len(done.c) {
					p.mu.Unlock()
					tl.complete(&done)
					p.mu.Lock()
				}
			}
			p.mu.Unlock()
			tl.complete(&done)
			tl.pool.reset()
			tl.dispatchAll()
			if tl.pool.depth() == 0 && len(tl.unpushed) == 0 {
				break
			}
		}
		tl.stageNext()
	}
	var staged []int
	for sec := range 3 {
		tick := base.Add(time.Duration(sec) * time.Second)
		if sec > 0 {
			tl.clock.Advance(tick.Add(-sizeAhead - 100*time.Millisecond).Sub(tl.clock.Now()))
			idle() // away from any tick: the stage's slice is sized to it
		}
		tl.clock.Advance(tick.Add(-50 * time.Millisecond).Sub(tl.clock.Now()))
		idle()
		staged = append(staged, len(tl.staged.jobs))
		tl.clock.Advance(tick.Add(time.Millisecond).Sub(tl.clock.Now()))
		tl.dispatchAll()
	}
	if !slices.Equal(staged, []int{20, 70, 70}) {
		t.Fatalf("staged %v fires in three ticks of 70 (queue 20, stage 100), want 20 (idle only near the tick), then 70 and 70", staged)
	}
	if got := len(tl.dispatched(0)); got != 70 || len(tl.unpushed) != 0 {
		t.Fatalf("%d fires queued and %d waiting for room after the staged tick, want 70 queued", got, len(tl.unpushed))
	}
	if free := tl.pool.free(); free != 0 {
		t.Errorf("the queue has room for %d more behind a segment of 70, want none", free)
	}
	if k := tl.pool.push(make([]job, 3)); k != 0 {
		t.Errorf("the queue took %d jobs behind a segment of 70, want none", k)
	}
}

// A stage is sized to its tick no larger than Config.Stage, and no larger
// than the tick: a node's memory for staging is that of its largest tick.
func TestLoop_StageSizedToTheTickWithinConfig(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ tasks, stage, want int }{{150, 100, 100}, {30, 100, 30}} {
		tl := newTestLoop(t, base.Add(-2*sizeAhead), func(c *Config) { c.Queue, c.Stage = 20, tc.stage })
		tl.add(t, 0, base.Add(-time.Second), noopProfile(task.MisfireFireOnce), "* * * * * *", ids("a", tc.tasks)...)
		tl.dispatchAll()
		tl.stageNext() // away from the tick: sized
		if got := cap(tl.staged.jobs); got != tc.want {
			t.Errorf("%d tasks on one second, stage %d: a stage's room of %d, want %d", tc.tasks, tc.stage, got, tc.want)
		}
		tl.clock.Advance(2*sizeAhead - 50*time.Millisecond)
		tl.stageNext()
		if got := len(tl.staged.jobs); got != tc.want {
			t.Errorf("%d tasks on one second, stage %d: staged %d, want %d", tc.tasks, tc.stage, got, tc.want)
		}
		// A job queued meanwhile: the pool refuses the stage whole, the
		// loop queues its jobs as it would unstaged ones, and the stage
		// keeps its slice for the next tick.
		tl.pool.push(tl.staged.jobs[:1])
		tl.clock.Advance(51 * time.Millisecond)
		tl.dispatchAll()
		if tl.pool.seg != nil || cap(tl.staged.jobs) != tc.want {
			t.Errorf("%d tasks on one second, stage %d: the stage went whole to a queue that held a job, or its room is %d, want %d",
				tc.tasks, tc.stage, cap(tl.staged.jobs), tc.want)
		}
	}
}

// The loop's timer wakes it wakeEarly before a staged tick, and the loop
// waits out the rest in a sleep that ends at the tick: a Go timer set for
// the tick itself wakes up to a millisecond after it.
func TestLoop_StagedTickAwaitedToItsInstant(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base.Add(-50*time.Millisecond), nil)
	tl.add(t, 0, base.Add(-time.Second), noopProfile(task.MisfireFireOnce), "* * * * * *", ids("a", 5)...)
	tl.dispatchAll()
	tl.stageNext()
	if tl.staged.at != base.UnixNano() {
		t.Fatalf("staged the tick %d, want %d", tl.staged.at, base.UnixNano())
	}
	tl.clock.SetSpeed(1)
	if got, most := tl.stageWake(time.Second), 50*time.Millisecond-wakeEarly; got > most || got < most-40*time.Millisecond {
		t.Errorf("the loop sleeps %v before a staged tick 50 ms away, want %v less the time the test took", got, most)
	}
	tl.clock.Advance(tl.clock.Until(base) - wakeEarly/2)
	if got := tl.stageWake(time.Second); got != 0 {
		t.Errorf("the loop sleeps %v within wakeEarly of the staged tick, want 0 (it waits in awaitStage)", got)
	}
	tl.awaitStage()
	if now := tl.clock.Now(); now.Before(base) {
		t.Errorf("awaitStage returned %v before the staged tick", base.Sub(now))
	}
	// Past its instant, a staged tick the loop could not release (the
	// bounded lead, say) no longer wakes it early: that would spin.
	if got := tl.stageWake(time.Second); got != time.Second {
		t.Errorf("the loop sleeps %v past a staged tick it did not release, want the 1s it asked", got)
	}
}

// The loop computes a staged burst's next times, and takes its
// completions, only once the workers took the burst (or its bound
// passed): beside them, on a machine of two cores, it left them one.
func TestLoop_StagedBurstTakenBeforeItsNextTimes(t *testing.T) {
	tl := newTestLoop(t, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), nil)
	var hold atomic.Bool
	hold.Store(true)
	tl.pool.mu.Lock()
	tl.pool.fenced = hold.Load // the workers take nothing until released below
	tl.pool.mu.Unlock()
	prof := noopProfile(task.MisfireFireOnce)
	seg := make([]job, 5)
	for i := range seg {
		seg[i] = job{id: "t", prof: prof, rec: uint32(i), attempt: 1}
	}
	end, ok := tl.pool.pushStaged(seg)
	if !ok {
		t.Fatal("an empty queue refused a staged segment")
	}
	tl.segEnd, tl.segLen = end, 1_000_000 // a bound of 100 ms
	go func() {
		time.Sleep(10 * time.Millisecond)
		tl.pool.mu.Lock()
		hold.Store(false)
		tl.pool.ready.Broadcast()
		tl.pool.mu.Unlock()
	}()
	tl.rescheduleReleased()
	tl.pool.mu.Lock()
	taken := tl.pool.taken
	tl.pool.mu.Unlock()
	if taken < end {
		t.Errorf("the loop went on with %d of the staged burst's %d fires taken, want all", taken, end)
	}
	if tl.segEnd != 0 {
		t.Errorf("the burst is still awaited after its next times")
	}
}

// Only a task at rest is staged: one whose fire still runs ends the
// stage, and at its second its policy decides its fire (forbid skips it),
// as without a stage; staged, the fire bypassed the policy. A paused
// task's fire comes through neither.
func TestLoop_StageEndsAtATaskNotAtRest(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, state := range []string{"running", "paused"} {
		t.Run(state, func(t *testing.T) {
			tl := newTestLoop(t, base.Add(-50*time.Millisecond), nil)
			prof := noopProfile(task.MisfireFireOnce)
			prof.key, prof.noop, prof.concurrency = "forbid", false, task.ConcurrencyForbid
			tl.add(t, 0, base.Add(-2*time.Second), prof, "* * * * * *", "t")
			tl.dispatchAll() // its fire of the second before: queued, so running
			if state == "paused" {
				_, r, _ := tl.tab.lookup("t")
				tl.end(tl.takeQueued(), statusOK)
				tl.handle(&eventsCmd{part: 0, upserts: []taskDef{{id: "t", hash: xxhash.Sum64String("t"), part: 0, sched: r.sched, prof: prof, paused: true}}})
				tl.handle(wakeCmd{})
			}
			before := tl.dispatched(0)
			tl.stageNext()
			if len(tl.staged.jobs) != 0 {
				t.Fatalf("staged %d fires of a task %s", len(tl.staged.jobs), state)
			}
			tl.clock.Advance(51 * time.Millisecond)
			tl.dispatchAll()
			if got := tl.dispatched(0); !slices.Equal(got, before) {
				t.Errorf("queued %v after the second, want %v: the task was %s", got, before, state)
			}
		})
	}
}
