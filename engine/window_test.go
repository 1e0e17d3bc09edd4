package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"
)

func TestWindow_Next(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	ns := func(s string) int64 { return at(s).UnixNano() }
	every, err := schedule.Parse("@every 10s", "", "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		w    window
		from string
		want string // "" for none
	}{
		{"before the window: its first fire", window{s: every, from: ns("2027-01-01T00:00:00Z")}, "2026-06-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"not_before itself counts", window{s: every, from: ns("2027-01-01T00:00:05Z")}, "2026-06-01T00:00:00Z", "2027-01-01T00:00:10Z"},
		{"inside", window{s: every, from: ns("2027-01-01T00:00:00Z"), to: ns("2027-01-01T00:01:00Z")}, "2027-01-01T00:00:31Z", "2027-01-01T00:00:40Z"},
		{"the last fire is the end", window{s: every, to: ns("2027-01-01T00:01:00Z")}, "2027-01-01T00:00:59Z", "2027-01-01T00:01:00Z"},
		{"past the end", window{s: every, to: ns("2027-01-01T00:01:00Z")}, "2027-01-01T00:01:00Z", ""},
		{"a one-shot: every second bounded to one", window{s: every, from: ns("2027-01-01T00:00:00Z"), to: ns("2027-01-01T00:00:00Z"), once: true}, "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"a one-shot fires once", window{s: every, from: ns("2027-01-01T00:00:00Z"), to: ns("2027-01-01T00:00:00Z"), once: true}, "2027-01-01T00:00:00Z", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.w.Next(at(tt.from))
			if tt.want == "" && !got.IsZero() || tt.want != "" && !got.Equal(at(tt.want)) {
				t.Errorf("Next(%s) = %v, want %q", tt.from, got, tt.want)
			}
		})
	}
	a := &window{s: every, from: 1, to: 2}
	if !a.same(&window{s: every, from: 1, to: 2}) || a.same(&window{s: every, from: 1, to: 3}) || a.same(nil) || !(*window)(nil).same(nil) {
		t.Error("same compares wrongly")
	}
}

// TestMisfireFire_Window: a misfire decision never picks a time outside the
// task's window, so a one-shot put after its time fires by its policy.
func TestMisfireFire_Window(t *testing.T) {
	every, _ := schedule.Parse("@every 1s", "", "x")
	now := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC).UnixNano()
	sec := int64(time.Second)
	once := &window{s: every, from: now - 10*sec, to: now - 10*sec, once: true}
	ended := &window{s: every, to: now - 5*sec}
	for _, tt := range []struct {
		name         string
		p            task.MisfirePolicy
		h            schedule.Schedule
		sched        int64
		fire, resume int64
	}{
		{"one-shot fire_once", task.MisfireFireOnce, once, now - 10*sec, now - 10*sec, now - 10*sec},
		{"one-shot fire_all", task.MisfireFireAll, once, now - 10*sec, now - 10*sec, now - 10*sec},
		{"one-shot skip", task.MisfireSkip, once, now - 10*sec, 0, now},
		{"fire_once stops at not_after", task.MisfireFireOnce, ended, now - 20*sec, now - 5*sec, now - 5*sec},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fire, resume := misfireFire(tt.p, tt.h, tt.sched, now, time.Minute)
			if fire != tt.fire || resume != tt.resume {
				t.Errorf("misfireFire = %d, %d; want %d, %d (s from now)", (fire-now)/sec, (resume-now)/sec, (tt.fire-now)/sec, (tt.resume-now)/sec)
			}
			if fire != 0 && next(tt.h, resume) != 0 {
				t.Errorf("after the fire, the window still has %v", time.Unix(0, next(tt.h, resume)).UTC())
			}
		})
	}
}

// TestEngine_WindowsAndOneShotsAcrossAHandOver: tasks bounded by
// not_before and not_after, by max_fires, and one-shots (one in the
// future with delete_after_fire, one edited while it fires, two put after
// their time) fire exactly their times, once each by idempotency key, while
// a node joins and the first one leaves in the middle; the owner's state
// says why each one ended, and the one-shot is deleted from etcd.
func TestEngine_WindowsAndOneShotsAcrossAHandOver(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster scenario")
	}
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg, err := registry.OpenRegistry(ctx, c.Client, "/shardcron", 64)
	if err != nil {
		t.Fatal(err)
	}
	log := newFireLog()
	edited := make(chan error, 1)
	handler := func(ctx context.Context, f Fire) error {
		if f.TaskID == "once-edited" {
			// An edit while the fire runs: the owner must not delete it.
			tk, err := reg.Get(ctx, f.TaskID)
			if err == nil {
				tk.Labels = map[string]string{"edited": "yes"}
				_, err = reg.Put(ctx, tk, registry.PutOptions{})
			}
			select {
			case edited <- err:
			default: // fired again: the check below fails on the repeat
			}
		}
		return log.handler(ctx, f)
	}
	node := func(id string) func(*Config) {
		return func(cfg *Config) {
			cfg.NodeID = id
			cfg.Partitions = 64
			cfg.DrainTimeout = time.Second
			cfg.MisfireThreshold = 5 * time.Second
		}
	}
	a := startNode(t, c, "", handler, node("node-a"))
	t0 := nextSecond(time.Now().Add(3 * time.Second))
	past := time.Now().Add(-30 * time.Second).Truncate(time.Second)
	win := handlerTask("win", "* * * * * *")
	win.NotBefore, win.NotAfter, win.Misfire = t0, t0.Add(6*time.Second), task.MisfireFireAll
	count := handlerTask("count", "* * * * * *")
	count.NotBefore, count.MaxFires, count.Misfire = t0, 5, task.MisfireFireAll
	once := handlerTask("once", "@at "+t0.Add(4*time.Second).Format(time.RFC3339))
	once.DeleteAfterFire = true
	onceEdited := handlerTask("once-edited", "@at "+t0.Add(3*time.Second).Format(time.RFC3339))
	onceEdited.DeleteAfterFire = true
	late := handlerTask("late", "@at "+past.Format(time.RFC3339))
	late.DeleteAfterFire = true
	lateSkip := handlerTask("late-skip", "@at "+past.Format(time.RFC3339))
	lateSkip.Misfire = task.MisfireSkip
	for _, tk := range []*task.Task{win, count, once, onceEdited, late, lateSkip} {
		putTask(t, reg, tk)
	}

	fired := func(id string) int { return len(log.forTask(id)) }
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return fired("win") >= 2 })
	b := startNode(t, c, "", handler, node("node-b"))
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return fired("win") >= 4 })
	a.stop(t) // b owns every task from here on
	etcdtest.WaitFor(t, 30*time.Second, func() bool {
		return fired("win") >= 7 && fired("count") >= 5 && fired("once") >= 1 && fired("late") >= 1 && fired("once-edited") >= 1
	})
	// Two seconds more, in which nothing may fire any more.
	end := time.Now().Add(2 * time.Second)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return time.Now().After(end) })

	if d := log.duplicates(); len(d) > 0 {
		t.Errorf("fires repeated: %v", d)
	}
	secondsFrom := func(from time.Time, n int) []time.Time {
		var out []time.Time
		for i := range n {
			out = append(out, from.Add(time.Duration(i)*time.Second))
		}
		return out
	}
	for _, w := range []struct {
		id   string
		want []time.Time
	}{
		{"win", secondsFrom(t0, 7)},
		{"count", secondsFrom(t0, 5)},
		{"once", []time.Time{t0.Add(4 * time.Second)}},
		{"once-edited", []time.Time{t0.Add(3 * time.Second)}},
		{"late", []time.Time{past}},
		{"late-skip", nil},
	} {
		got := log.forTask(w.id)
		slices.SortFunc(got, time.Time.Compare)
		if !slices.EqualFunc(got, w.want, time.Time.Equal) {
			t.Errorf("%s fired at %v, want %v", w.id, secs(got), secs(w.want))
		}
	}
	select {
	case err := <-edited:
		if err != nil {
			t.Fatalf("editing once-edited while it fired: %v", err)
		}
	default:
		t.Fatal("once-edited never fired")
	}
	// The deleted ones are gone from etcd; the edited one stays.
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		_, e1 := reg.Get(ctx, "once")
		_, e2 := reg.Get(ctx, "late")
		return errors.Is(e1, registry.ErrNotFound) && errors.Is(e2, registry.ErrNotFound)
	})
	if _, err := reg.Get(ctx, "once-edited"); err != nil {
		t.Errorf("once-edited, edited while it fired: %v; want it kept", err)
	}
	for id, want := range map[string]string{"win": task.EndedNotAfter, "count": task.EndedMaxFires, "late-skip": task.EndedAt, "once-edited": task.EndedAt} {
		s := taskState(t, b, id)
		if s.Ended != want || !s.NextFireAt.IsZero() {
			t.Errorf("%s: ended %q, next %v; want ended %q and no next fire", id, s.Ended, s.NextFireAt, want)
		}
	}
	if n := len(b.e.loop.ended); n != 0 {
		t.Errorf("%d deletions still queued", n)
	}
}

// TestLoop_PastOneShotFiresOnceByItsMisfirePolicy: a one-shot whose time is
// past fires (by its misfire policy) when it was just put, or written after
// the point its partition resumes from; a load of one written before that
// point leaves it ended, as a previous owner decided it.
func TestLoop_PastOneShotFiresOnceByItsMisfirePolicy(t *testing.T) {
	now := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl, at, oneShot := pastOneShotLoop(t, now)
	resume := now.Add(-2 * time.Second)
	tl.handle(&loadCmd{part: 0, resume: resume.UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{
		oneShot("decided", now.Add(-time.Minute)), // written before the resume point: decided before
		oneShot("moved", now.Add(-time.Second)),   // written while the partition moved
	}})
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{oneShot("put", now.Add(-time.Minute))}})
	tl.clock.Advance(time.Second)
	tl.dispatch()
	key := func(id string) string { return fmt.Sprintf("%s@%d", id, at.UnixMilli()) }
	if got, want := tl.dispatched(0), []string{key("moved"), key("put")}; !slices.Equal(sorted(got), want) {
		t.Errorf("dispatched %v, want %v", got, want)
	}
	for _, id := range []string{"decided", "moved", "put"} {
		if s := tl.state(id); s == nil || s.Ended != task.EndedAt || !s.NextFireAt.IsZero() {
			t.Errorf("%s: state %+v, want ended at", id, s)
		}
	}
}

func sorted(s []string) []string { slices.Sort(s); return s }

// pastOneShotLoop returns a test loop at now, the time at 10 s before it,
// and a maker of one-shots of partition 0 at that time, written at
// written.
func pastOneShotLoop(t *testing.T, now time.Time) (*testLoop, time.Time, func(id string, written time.Time) taskDef) {
	t.Helper()
	tl := newTestLoop(t, now, nil)
	at := now.Add(-10 * time.Second)
	h, err := tl.scheds.Intern(atSchedule, "UTC", "x")
	if err != nil {
		t.Fatal(err)
	}
	return tl, at, func(id string, written time.Time) taskDef {
		prof := noopProfile(task.MisfireFireOnce)
		prof.key += "/" + id
		prof.win = &window{s: tl.scheds.Get(h), from: at.UnixNano(), to: at.UnixNano(), end: task.EndedAt, once: true, written: written.UnixNano()}
		return taskDef{id: id, hash: xxhash.Sum64String(id), part: 0, sched: h, prof: prof}
	}
}

// A watermark goes with the applied revisions as they stood when the
// loop's dispatch point reached it. A one-shot put into the past while the
// point stands is due before it and not yet released: a point published
// then (the jobs a command pushed) still goes with the revisions before
// the put, which a successor after a crash would otherwise take for
// fired, and the first to go with the put is the one that the put's fire
// is pushed before.
func TestLoop_WatermarkGoesWithTheRevisionsArmedBehindIt(t *testing.T) {
	now := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl, _, oneShot := pastOneShotLoop(t, now)
	revs := map[int]int64{}
	published := func() mark { // the last point published, its revisions folded into revs
		tl.pool.mu.Lock()
		m := mark{end: tl.pool.taken, through: tl.pool.watermark.Load(), seq: tl.pool.seq}
		if len(tl.pool.marks) > tl.pool.mhead {
			m = tl.pool.marks[len(tl.pool.marks)-1]
		}
		tl.pool.mu.Unlock()
		tl.applieds.mu.Lock()
		tl.applieds.foldTo(m.seq, revs)
		tl.applieds.mu.Unlock()
		return m
	}
	tl.handle(&loadCmd{part: 0, resume: now.UnixNano(), rev: 10, first: true, done: make(chan struct{})})
	tl.clock.Advance(time.Millisecond)
	tl.dispatchAll()
	if m := published(); revs[0] != 10 || m.through < now.UnixNano() {
		t.Fatalf("after the load: point %v with revisions %v, want past %v with partition 0's at 10", time.Unix(0, m.through).UTC(), revs, now)
	}

	tl.handle(&eventsCmd{part: 0, rev: 20, upserts: []taskDef{oneShot("put", now)}})
	tl.publish()
	if m := published(); revs[0] != 10 || m.end != 0 {
		t.Errorf("the put armed, not released: the point goes with revisions %v and %d jobs, want partition 0's at 10, none", revs, m.end)
	}
	tl.clock.Advance(time.Millisecond)
	tl.dispatchAll()
	if m := published(); revs[0] != 20 || m.end != 1 || len(tl.dispatched(0)) != 1 {
		t.Errorf("the put's fire released: the point goes with revisions %v and %d jobs (queued %v), want partition 0's at 20, its fire",
			revs, m.end, tl.dispatched(0))
	}
}

// A delete_after_fire task whose last fire ends while the retry of an
// earlier fire waits out its backoff is not ended yet: it is deleted once
// that retry's fire ends. It was handed to the deleter at once, and the
// delete dropped the waiting retry, so that fire never got its attempts.
func TestLoop_DeleteAfterFireWaitsForTheRetryOfAnEarlierFire(t *testing.T) {
	tl, _, take, end := retryOfAnEarlierFire(t)
	if n := len(tl.ended); n != 0 {
		t.Fatalf("%d deletions queued while the retry of t@+0s waits; want none until it ends", n)
	}
	tl.clock.Advance(time.Minute)
	tl.dispatchAll()
	if got := tl.dispatched(0); len(got) != 1 {
		t.Fatalf("dispatched %v, want the retry of t@+0s", got)
	}
	end(take(), statusOK)
	if n := len(tl.ended); n != 1 {
		t.Errorf("%d deletions queued once the retry ended, want 1", n)
	}
}

// A delete_after_fire task edited while the retry of an earlier fire
// waits out its backoff stays after that retry: it was written since that
// fire began, and an edit wins (docs/api.md). Only an edit while an
// attempt ran counted, and the task edited between two attempts was
// deleted after the second.
func TestLoop_DeleteAfterFireEditedWhileARetryWaitsStays(t *testing.T) {
	tl, def, take, end := retryOfAnEarlierFire(t)
	edited := def(false)
	prof := *edited.prof
	prof.key, prof.updatedAt = "noop/delete-after-edited", prof.updatedAt.Add(time.Hour)
	edited.prof = &prof
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{edited}})
	tl.clock.Advance(time.Minute)
	tl.dispatchAll()
	if got := tl.dispatched(0); len(got) != 1 {
		t.Fatalf("dispatched %v, want the retry of t@+0s", got)
	}
	end(take(), statusOK)
	if n := len(tl.ended); n != 0 {
		t.Errorf("%d deletions queued once the retry ended; want none, t was edited while it waited", n)
	}
}

// One write that pauses a delete_after_fire task and edits it besides
// while the retry of an earlier fire waits out its backoff, or for a
// worker, is an edit: the task stays after its resume, as after an edit
// alone. It was taken for a pause, which is not an edit that wins (the
// pause skips that retry), and the resume deleted the task. A write that
// only pauses it (its updated_at changes too) still leaves the delete to
// the resume.
func TestLoop_DeleteAfterFirePausedAndEditedWhileARetryWaitsStays(t *testing.T) {
	for _, c := range []struct {
		name    string
		queued  bool
		edit    bool
		deletes int
	}{
		{"paused and edited", false, true, 0},
		{"paused and edited, the retry queued", true, true, 0},
		{"paused only", false, false, 1},
		{"paused only, the retry queued", true, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			tl, def, _, _ := retryOfAnEarlierFire(t)
			if c.queued {
				tl.clock.Advance(time.Minute)
				tl.dispatchAll()
			}
			written := def(true)
			prof := *written.prof
			prof.key, prof.updatedAt = prof.key+",d1", prof.updatedAt.Add(time.Hour)
			if c.edit {
				prof.key, prof.timeout = "noop/delete-after-timeout-1s,d1", time.Second
				prof.defLen = len("noop/delete-after-timeout-1s")
			}
			written.prof = &prof
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{written}})
			tl.clock.Advance(time.Minute)
			tl.dispatchAll() // the retry comes due while t is paused: skipped
			if _, r, _ := tl.tab.lookup("t"); r.skipped != 1 || r.running != 0 {
				t.Fatalf("paused: %d skipped, %d running; want the retry skipped", r.skipped, r.running)
			}
			resumed := written
			resumed.paused = false
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{resumed}})
			if n := len(tl.ended); n != c.deletes {
				t.Errorf("%d deletions queued at the resume of t; want %d", n, c.deletes)
			}
		})
	}
}

// A pause skips the retry a delete_after_fire task's delete waits for,
// whether it comes due while the task is paused or waits for a worker when
// the pause lands: that fire is over. A paused task stays (its pause
// record says who holds it, and why); its resume deletes it, ended. The
// skip looked no more at the task's end, nor did the resume: the task
// stayed, ended, for good. A pause that lands while the retry runs is an
// edit while a fire runs, which wins: the task stays after its resume.
func TestLoop_DeleteAfterFireOfARetrySkippedWhilePausedComesWithTheResume(t *testing.T) {
	for _, c := range []struct {
		when    string
		skipped uint32
		deletes int
	}{
		{"due while paused", 1, 1},
		{"queued at the pause", 1, 1},
		{"running at the pause", 0, 0},
	} {
		t.Run(c.when, func(t *testing.T) {
			tl, def, take, end := retryOfAnEarlierFire(t)
			var running *job
			if c.when != "due while paused" {
				tl.clock.Advance(time.Minute)
				tl.dispatchAll()
			}
			if c.when == "running at the pause" {
				j := take()
				running = &j
			}
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(true)}})
			if running != nil {
				end(*running, statusOK)
			}
			tl.clock.Advance(time.Minute)
			tl.dispatchAll()
			_, r, _ := tl.tab.lookup("t")
			if got := tl.dispatched(0); len(got) != 0 || r.skipped != c.skipped || r.running != 0 {
				t.Fatalf("paused: dispatched %v, %d skipped, %d running; want nothing, %d, 0", got, r.skipped, r.running, c.skipped)
			}
			if n := len(tl.ended); n != 0 {
				t.Fatalf("%d deletions queued while t is paused, want none", n)
			}
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(false)}})
			if n := len(tl.ended); n != c.deletes {
				t.Errorf("%d deletions queued at the resume of t; want %d", n, c.deletes)
			}
		})
	}
}

// A delete_after_fire task paused before its last time and resumed after
// it did not fire: its resume leaves it, ended, to be edited or triggered.
// What the resume deletes is a task whose last fire ended while it was
// paused.
func TestLoop_DeleteAfterFireTaskPausedThroughItsTimeStays(t *testing.T) {
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	h := tl.everySecond(t)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key, prof.deleteAfter = "noop/delete-after", true
	at := base.Add(5 * time.Second).UnixNano()
	prof.win = &window{s: tl.scheds.Get(h), from: at, to: at, end: task.EndedMaxFires}
	def := func(paused bool) taskDef {
		return taskDef{id: "t", hash: xxhash.Sum64String("t"), part: 0, sched: h, prof: prof, paused: paused}
	}
	tl.handle(&loadCmd{part: 0, resume: base.UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def(false)}})
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(true)}})
	tl.clock.Advance(10 * time.Second)
	tl.dispatchAll()
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(false)}})
	if got, n := tl.dispatched(0), len(tl.ended); len(got) != 0 || n != 0 {
		t.Errorf("resumed after its time: dispatched %v, %d deletions queued; want neither", got, n)
	}
	if s := tl.state("t"); s == nil || s.Ended != task.EndedMaxFires {
		t.Errorf("state %+v, want ended max_fires", s)
	}
}

// A delete_after_fire task whose last fire ended while it was paused is
// deleted at its resume on the next owner of its partition too: the
// release hands the mark of that end over in its checkpoint, and a resume
// that came while the partition changed hands is looked at by the next
// owner's acquire. The mark was the owner's memory: the next owner never
// deleted the task, which stayed, ended, for good.
func TestLoop_DeleteAfterFireEndedWhilePausedIsDeletedAtItsResumeOnTheNextOwner(t *testing.T) {
	for _, resumed := range []string{"after the load", "while the partition changed hands"} {
		t.Run(resumed, func(t *testing.T) {
			tl, def, _, _ := retryOfAnEarlierFire(t)
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(true)}})
			tl.clock.Advance(time.Minute)
			tl.dispatchAll() // the retry of t@+0s comes due while t is paused: skipped, the fire is over
			if _, r, _ := tl.tab.lookup("t"); r.skipped != 1 || r.flags&flagEndWaits == 0 {
				t.Fatalf("paused: %d skipped, flags %b; want the retry skipped and the end left to the resume", r.skipped, r.flags)
			}
			hand := tl.releaseNow(0).hand[0]

			next := newTestLoop(t, tl.clock.Now().Add(time.Second), nil)
			h := next.everySecond(t)
			// Written at its pause and at its resume, after its last time.
			writtenAt := func(paused bool, at time.Time) taskDef {
				d := def(paused)
				prof := *d.prof
				prof.key, prof.updatedAt = fmt.Sprintf("%s@%d", prof.key, at.UnixNano()), at
				d.sched, d.prof = h, &prof
				return d
			}
			loaded := writtenAt(false, next.clock.Now())
			if resumed == "after the load" {
				loaded = writtenAt(true, tl.clock.Now())
			}
			next.handle(&loadCmd{part: 0, resume: hand.mark, handed: handedFrom(hand.after, handingCheckpoint(hand.encode("node-a"))),
				defs: []taskDef{loaded}, first: true, done: make(chan struct{})})
			next.handle(&endedCmd{part: 0})
			if loaded.paused {
				if n := len(next.ended); n != 0 {
					t.Fatalf("%d deletions queued while t is paused on the next owner, want none", n)
				}
				next.handle(&eventsCmd{part: 0, upserts: []taskDef{writtenAt(false, next.clock.Now())}})
			}
			if n := len(next.ended); n != 1 {
				t.Errorf("%d deletions queued on the next owner once t was resumed, want 1", n)
			}
		})
	}
}

// The marks of ended paused tasks go to the watermark writes with the
// revision up to which their partition's changes were armed, as the loop
// stands between commands: a successor after a crash judges them by it
// (heldEndWaits), so that an edit that took a mark takes it there too. A
// load of several chunks, whose revision comes with its last, publishes
// its marks again then; until then a value carries none of them, which a
// successor could not judge.
func TestLoop_EndWaitsArePublishedWithTheirPartitionsRevision(t *testing.T) {
	t.Run("marked, then edited", func(t *testing.T) {
		tl, def, _, _ := retryOfAnEarlierFire(t)
		tl.handle(&eventsCmd{part: 0, rev: 10, upserts: []taskDef{def(true)}})
		tl.clock.Advance(time.Minute)
		tl.dispatchAll() // the retry of t@+0s comes due while t is paused: skipped, the fire is over
		tl.publishEndWaits()
		if got, want := tl.endMarks.carried(), map[int]endWaits{0: {Applied: 10, IDs: []string{"t"}}}; !sameLists(got, want) {
			t.Fatalf("published %v once t's fire ended while it was paused, want %v", got, want)
		}
		edited := def(true)
		prof := *edited.prof
		prof.key, prof.timeout = "noop/delete-after-timeout-1s", time.Second
		prof.defLen = len(prof.key)
		edited.prof = &prof
		tl.handle(&eventsCmd{part: 0, rev: 12, upserts: []taskDef{edited}})
		tl.publishEndWaits()
		if got := tl.endMarks.carried(); got != nil {
			t.Errorf("published %v once t was edited while paused, want none", got)
		}
	})
	t.Run("loaded in chunks", func(t *testing.T) {
		tl, def, _, _ := retryOfAnEarlierFire(t)
		waits := handedTo{endWaits: map[string]bool{"u": true}}
		tl.handle(&loadCmd{part: 1, first: true, more: true, done: make(chan struct{})})
		d := def(true)
		d.id, d.hash, d.part = "u", xxhash.Sum64String("u"), 1
		tl.handle(&loadCmd{part: 1, handed: waits, defs: []taskDef{d}, more: true, done: make(chan struct{})})
		tl.publishEndWaits()
		if got := tl.endMarks.carried(); got != nil {
			t.Fatalf("published %v while the load's revision was not known, want none", got)
		}
		tl.handle(&loadCmd{part: 1, rev: 20, done: make(chan struct{})})
		tl.publishEndWaits()
		if got, want := tl.endMarks.carried(), map[int]endWaits{1: {Applied: 20, IDs: []string{"u"}}}; !sameLists(got, want) {
			t.Errorf("published %v once the load was in, want %v", got, want)
		}
	})
}

// A delete_after_fire task paused after its last fire ended, before the
// deleter's delete reached etcd, is deleted at its resume, here or, its
// partition released while it is paused, on the next owner: etcd refuses
// that delete (the pause changed the version it is conditioned on), and
// a pause is not an edit that wins. The owner forgot the task once it
// handed it to the deleter, and it stayed, ended, for good. A write that
// edits the task (its executor or its schedule, paused besides or not)
// before the delete keeps it, through a later pause and resume too.
func TestLoop_DeleteAfterFirePausedBeforeItsDeleteIsDeletedAtItsResume(t *testing.T) {
	// handed ends t, handing it to the deleter, whose delete a write
	// (written: the nth since, paused or not, with an edit or none) then
	// beats.
	handed := func(t *testing.T) (tl *testLoop, written func(n int, paused bool, edit string) taskDef) {
		t.Helper()
		tl, def, take, end := retryOfAnEarlierFire(t)
		tl.clock.Advance(time.Minute)
		tl.dispatchAll()
		end(take(), statusOK) // the retry of t@+0s: t ended
		if n := len(tl.ended); n != 1 {
			t.Fatalf("%d deletions queued once t ended, want 1", n)
		}
		<-tl.ended // the deleter's, which a write to t beats
		h, err := tl.scheds.Intern("*/2 * * * * *", "UTC", "x")
		if err != nil {
			t.Fatal(err)
		}
		written = func(n int, paused bool, edit string) taskDef {
			d := def(paused)
			prof := *d.prof
			switch edit {
			case "executor":
				prof.key, prof.timeout = "noop/delete-after-timeout-1s", time.Second
				prof.defLen = len(prof.key)
			case "schedule":
				w := *prof.win
				w.s, d.sched = tl.scheds.Get(h), h
				prof.win = &w
			}
			prof.key, prof.updatedAt = fmt.Sprintf("%s,d%d", prof.key, n), prof.updatedAt.Add(time.Duration(n)*time.Hour)
			d.prof = &prof
			return d
		}
		return tl, written
	}
	for _, c := range []struct {
		name    string
		paused  bool   // the write that beats the delete pauses t
		edit    string // and changes it so
		deletes int    // at t's resume
	}{
		{"paused", true, "", 1},
		{"paused and edited", true, "executor", 0},
		{"edited, its executor", false, "executor", 0},
		{"edited, its schedule", false, "schedule", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			tl, written := handed(t)
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{written(1, c.paused, c.edit)}})
			if !c.paused {
				tl.handle(&eventsCmd{part: 0, upserts: []taskDef{written(2, true, c.edit)}})
			}
			if n := len(tl.ended); n != 0 {
				t.Fatalf("%d deletions queued while t is paused, want none", n)
			}
			tl.handle(&eventsCmd{part: 0, upserts: []taskDef{written(3, false, c.edit)}})
			if n := len(tl.ended); n != c.deletes {
				t.Errorf("%d deletions queued at the resume of t; want %d", n, c.deletes)
			}
		})
	}
	t.Run("paused, then edited while paused", func(t *testing.T) {
		tl, written := handed(t)
		tl.handle(&eventsCmd{part: 0, upserts: []taskDef{written(1, true, "")}})
		tl.handle(&eventsCmd{part: 0, upserts: []taskDef{written(2, true, "executor")}})
		tl.handle(&eventsCmd{part: 0, upserts: []taskDef{written(3, false, "executor")}})
		if n := len(tl.ended); n != 0 {
			t.Errorf("%d deletions queued at the resume of t edited while paused, want none: an edit since the last fire wins", n)
		}
	})
	t.Run("paused, then released", func(t *testing.T) {
		tl, written := handed(t)
		tl.handle(&eventsCmd{part: 0, upserts: []taskDef{written(1, true, "")}})
		if got := tl.releaseNow(0).hand[0].endWaits; !slices.Equal(got, []string{"t"}) {
			t.Errorf("the release hands on the ends %v, want [t] for the next owner to delete at its resume", got)
		}
	})
}

// retryOfAnEarlierFire starts the delete_after_fire scenario above: t has
// a window of two fires, two attempts a fire, a minute apart; its fire of
// +0 s failed and its retry waits 30-60 s, its fire of +1 s (the last)
// succeeded. def is its definition, paused or not; take takes the first
// job queued, as a worker does, and end reports its end with a status.
func retryOfAnEarlierFire(t *testing.T) (tl *testLoop, def func(paused bool) taskDef, take func() job, end func(j job, st uint8)) {
	t.Helper()
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl = newTestLoop(t, base.Add(-time.Second/2), nil)
	h := tl.everySecond(t)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key = "noop/delete-after"
	prof.defLen = len(prof.key) // what a write that only pauses t keeps
	prof.maxAttempts, prof.backoff, prof.maxBackoff = 2, time.Minute, time.Minute
	prof.deleteAfter, prof.updatedAt = true, base.Add(-time.Hour)
	prof.win = &window{s: tl.scheds.Get(h), to: base.Add(time.Second).UnixNano(), end: task.EndedMaxFires}
	def = func(paused bool) taskDef {
		return taskDef{id: "t", hash: xxhash.Sum64String("t"), part: 0, sched: h, prof: prof, paused: paused}
	}
	tl.handle(&loadCmd{part: 0, resume: base.Add(-time.Second).UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def(false)}})
	take = func() job {
		tl.pool.mu.Lock()
		defer tl.pool.mu.Unlock()
		j := *tl.pool.at(0)
		tl.pool.pop()
		return j
	}
	end = func(j job, st uint8) {
		var b completionBatch
		b.add(&j, st, map[bool]string{true: "boom"}[st == statusFailed], false)
		tl.complete(&b)
	}
	tl.clock.Advance(time.Second / 2)
	tl.dispatchAll()
	end(take(), statusFailed)
	tl.clock.Advance(time.Second)
	tl.dispatchAll()
	end(take(), statusOK)
	return tl, def, take, end
}

// A one-shot that fired on its owner, edited (here a label) while its
// partition changes hands, after the release's mark, does not fire again
// on the next owner: its time is the one the previous owner decided, and
// the next owner, which read the partition before the edit (prepared),
// knows it. It took the write after the mark for a one-shot put after its
// time, and fired it again by its misfire policy (within the catch-up
// window): the watch path fires a one-shot again only when a write changes
// its time. A one-shot put then, or one whose time a write then moves into
// the past, still fires by its misfire policy on the next owner.
func TestEngine_OneShotEditedDuringItsHandOverDoesNotFireAgain(t *testing.T) {
	c := etcdtest.Start(t)
	log := &callLog{}
	bID := nextOwnerOfTheOnePartition(t)
	a := startNode(t, c, "", log.handler(nil), oneShotNode("node-a"))
	defer a.stop(t)
	reg := a.e.Registry()
	at := fireOneShots(t, reg, log)

	b, let := startNextOwnerHeld(t, c, log, bID)
	defer b.stop(t)
	earlier := editOneShots(t, reg, at)
	close(let)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return b.e.Owns(0) })
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("moved")) == 2 && len(log.of("fresh")) == 1 })
	time.Sleep(time.Second) // a fire armed in the past goes out at once
	oneShotsFired(t, log, at, earlier)
}

// TestEngine_DeleteAfterFireEndedWhilePausedIsDeletedByTheNextOwner: a
// delete_after_fire one-shot whose retry comes due while it is paused on
// node-a (skipped: the fire is over) is deleted at its resume on node-b,
// which took its partition from node-a meanwhile. The mark of that end
// was node-a's memory: node-b kept the task, ended, for good.
func TestEngine_DeleteAfterFireEndedWhilePausedIsDeletedByTheNextOwner(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster scenario")
	}
	c := etcdtest.Start(t)
	ctx := context.Background()
	a := endedWhilePausedOnNodeA(t, c.Client, deleteAfterFireOneShot(nextSecond(time.Now().Add(time.Second)), false))
	defer a.stop(t)
	reg := a.e.Registry()
	b := startNode(t, c, "", failing, oneShotNode(nextOwnerOfTheOnePartition(t)))
	defer b.stop(t)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return !a.e.Owns(0) && owns(b, "once") })
	if _, err := reg.SetPaused(ctx, "once", false); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		_, err := reg.Get(ctx, "once")
		return errors.Is(err, registry.ErrNotFound)
	})
}

// TestEngine_DeleteAfterFireEndedWhilePausedSurvivesACrash: a
// delete_after_fire one-shot whose fire ended while it was paused on
// node-a is deleted at its resume after node-a was cut off from etcd
// (fenced: no checkpoint, as in a crash), once its watermark carried the
// mark: on node-b, which resumes from node-a's watermark, and on node-a
// itself, which takes its partition back from the hand-over its fenced
// session kept. The mark was node-a's memory alone: the task stayed,
// ended, for good, on both. Edited while nobody owned it (its timeout),
// it stays, as after a release: node-b judges the mark by the revision it
// came with.
func TestEngine_DeleteAfterFireEndedWhilePausedSurvivesACrash(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster scenario")
	}
	for _, c := range []struct {
		next   string
		edited bool
	}{
		{"node-b", false},
		{"node-a", false},
		{"node-b", true},
	} {
		t.Run(fmt.Sprintf("on %s, edited %v", c.next, c.edited), func(t *testing.T) {
			t.Parallel()
			cl := etcdtest.Start(t)
			ctx := context.Background()
			proxy := cl.NewProxy(t)
			at := nextSecond(time.Now().Add(time.Second))
			a := endedWhilePausedOnNodeA(t, cl.NewClient(t, proxy.Endpoint()), deleteAfterFireOneShot(at, false))
			defer a.stop(t)
			key := a.e.keys.watermark("node-a", sessionID(a.e.sess.Load()))
			etcdtest.WaitFor(t, 10*time.Second, func() bool {
				m, err := a.e.readDeadMark(ctx, key)
				return err == nil && slices.Equal(m.endWaits(0).IDs, []string{"once"})
			})
			sess := a.e.sess.Load()
			crash(t, a, proxy)
			if c.edited {
				reg, err := registry.OpenRegistry(ctx, cl.Client, DefaultPrefix, 1)
				if err != nil {
					t.Fatal(err)
				}
				tk := deleteAfterFireOneShot(at, true)
				tk.Timeout = task.Duration(time.Minute + time.Second)
				putTask(t, reg, tk)
			}
			on := a
			if c.next == "node-b" {
				b := startNode(t, cl, "", failing, oneShotNode(c.next))
				defer b.stop(t)
				on = b
			} else {
				proxy.Restore()
				etcdtest.WaitFor(t, 20*time.Second, func() bool { return a.e.sess.Load() != sess && a.e.Ready() })
			}
			reg := on.e.Registry()
			etcdtest.WaitFor(t, 20*time.Second, onceOn(t, on, func(_ *loop, _ uint32, r *record) bool { return r.flags&flagPaused != 0 }))
			if _, err := reg.SetPaused(ctx, "once", false); err != nil {
				t.Fatal(err)
			}
			if !c.edited {
				etcdtest.WaitFor(t, 10*time.Second, func() bool {
					_, err := reg.Get(ctx, "once")
					return errors.Is(err, registry.ErrNotFound)
				})
				return
			}
			if deletedAtItsResume(t, on) {
				t.Errorf("once, edited while nobody owned it, was deleted at its resume on %s", c.next)
			}
		})
	}
}

// TestEngine_DeleteAfterFireEndedWhilePausedWrittenBeforeTheNextOwnerStays:
// a delete_after_fire one-shot whose fire ended while it was paused on
// node-a, released so (end_waits), then written again, paused, before
// node-b took the partition, stays at its resume on node-b, as on one
// owner. Deleted and put again, it is another task, which never fired:
// the delete took the mark with the record there. Edited (its timeout),
// the edit since the fire ended wins (upsert clears the mark). node-b
// marked the task by its id alone, and deleted it at its resume.
func TestEngine_DeleteAfterFireEndedWhilePausedWrittenBeforeTheNextOwnerStays(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster scenario")
	}
	for _, c := range []struct {
		name  string
		write func(t *testing.T, reg *registry.Registry, at time.Time)
	}{
		{"put again", func(t *testing.T, reg *registry.Registry, _ time.Time) {
			if err := reg.Delete(context.Background(), "once"); err != nil {
				t.Fatal(err)
			}
			at := nextSecond(time.Now().Add(time.Second))
			putTask(t, reg, deleteAfterFireOneShot(at, true))
			etcdtest.WaitFor(t, 10*time.Second, func() bool { return time.Now().After(at) })
		}},
		{"edited", func(t *testing.T, reg *registry.Registry, at time.Time) {
			tk := deleteAfterFireOneShot(at, true)
			tk.Timeout = task.Duration(time.Minute + time.Second)
			putTask(t, reg, tk)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cl := etcdtest.Start(t)
			ctx := context.Background()
			at := nextSecond(time.Now().Add(time.Second))
			a := endedWhilePausedOnNodeA(t, cl.Client, deleteAfterFireOneShot(at, false))
			defer a.stop(t)
			reg, keys := a.e.Registry(), a.e.keys
			a.stop(t)
			resp, err := cl.Client.Get(ctx, keys.checkpoint(0))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) == 0 || !slices.Equal(handingCheckpoint(resp.Kvs[0].Value).EndWaits, []string{"once"}) {
				t.Fatalf("node-a's release did not hand the end of once over: %s", resp.Kvs)
			}
			c.write(t, reg, at)
			b := startNode(t, cl, "", failing, oneShotNode("node-b"))
			defer b.stop(t)
			etcdtest.WaitFor(t, 20*time.Second, onceOn(t, b, func(_ *loop, _ uint32, r *record) bool { return r.flags&flagPaused != 0 }))
			if _, err := reg.SetPaused(ctx, "once", false); err != nil {
				t.Fatal(err)
			}
			if deletedAtItsResume(t, b) {
				t.Errorf("once, %s, paused, after node-a's release, was deleted at its resume on node-b", c.name)
			}
		})
	}
}

// deletedAtItsResume waits until n's loop has task once resumed, and
// reports whether the resume deleted it (handed it to the deleter).
func deletedAtItsResume(t *testing.T, n *testNode) bool {
	t.Helper()
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return inLoop(t, n, func(l *loop) bool {
			_, r, ok := l.tab.lookup("once")
			return !ok || r.flags&flagPaused == 0
		})
	})
	return inLoop(t, n, func(l *loop) bool {
		_, r, ok := l.tab.lookup("once")
		return !ok || r.flags&flagDeleting != 0
	})
}

// failing is a handler whose every attempt fails.
func failing(context.Context, Fire) error { return errors.New("boom") }

// deleteAfterFireOneShot is task once at at, deleted after its fire, with
// a retry 10s after a failed first attempt.
func deleteAfterFireOneShot(at time.Time, paused bool) *task.Task {
	tk := handlerTask("once", "@at "+at.Format(time.RFC3339))
	tk.DeleteAfterFire, tk.Paused = true, paused
	tk.Retry = task.Retry{MaxAttempts: 2, Backoff: task.Duration(10 * time.Second)}
	return tk
}

// onceOn returns whether n's loop holds task once as cond says.
func onceOn(t *testing.T, n *testNode, cond func(l *loop, i uint32, r *record) bool) func() bool {
	return func() bool {
		return inLoop(t, n, func(l *loop) bool {
			i, r, ok := l.tab.lookup("once")
			return ok && cond(l, i, r)
		})
	}
}

// endedWhilePausedOnNodeA starts node-a, the only node, with tk, whose
// first attempt fails, and pauses it while its retry waits out the backoff
// (a pause while an attempt runs would be an edit that wins): the retry
// comes due while it is paused, skipped, and the fire's end waits for the
// resume (flagEndWaits).
func endedWhilePausedOnNodeA(t *testing.T, cli *clientv3.Client, tk *task.Task) *testNode {
	t.Helper()
	a := startNodeOn(t, cli, "", failing, oneShotNode("node-a"))
	reg := a.e.Registry()
	putTask(t, reg, tk)
	etcdtest.WaitFor(t, 10*time.Second, onceOn(t, a, func(l *loop, i uint32, r *record) bool { return r.running == 0 && l.retryWaits(i, r) }))
	if _, err := reg.Pause(context.Background(), "once", task.Pause{By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 20*time.Second, onceOn(t, a, func(_ *loop, _ uint32, r *record) bool { return r.skipped == 1 && r.flags&flagEndWaits != 0 }))
	return a
}

// nextOwnerOfTheOnePartition names a node that wins the one partition of
// the one-shot tests of a hand-over from node-a.
func nextOwnerOfTheOnePartition(t *testing.T) string {
	t.Helper()
	for i := 0; ; i++ {
		id := fmt.Sprintf("node-b%d", i)
		cfg := DefaultConfig(id)
		cfg.Partitions = 1
		r, err := ring.New(cfg.ring())
		if err != nil {
			t.Fatal(err)
		}
		if a, err := r.Update([]string{"node-a", id}); err == nil && slices.Contains(a.Owned(id), 0) {
			return id
		}
	}
}

// startNextOwnerHeld starts node bID, which takes the one partition of
// the one-shot tests of a hand-over from node-a, and returns it once
// node-a released the partition (its mark is behind), with node-b's
// acquire held at its first checkpoint until let is closed.
func startNextOwnerHeld(t *testing.T, c *etcdtest.Cluster, log *callLog, bID string) (*testNode, chan struct{}) {
	t.Helper()
	cli := c.NewClient(t)
	let := make(chan struct{})
	held := injectFaults(cli).pauses(func(key, value string) bool {
		return strings.Contains(key, "/checkpoints/") && strings.Contains(value, `"node":"`+bID+`"`)
	}, let)
	b := startNodeOn(t, cli, "", log.handler(nil), oneShotNode(bID), noWait)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("node-b did not acquire the partition")
	}
	return b, let
}

// oneShotNode configures a node of the one-shot tests of a hand-over: its
// id, and one partition.
func oneShotNode(id string) func(*Config) {
	return func(cfg *Config) { cfg.NodeID, cfg.Partitions, cfg.DrainTimeout = id, 1, time.Second }
}

// fireOneShots puts the one-shots once and moved at the next second but
// one, and returns that time once both fired.
func fireOneShots(t *testing.T, reg *registry.Registry, log *callLog) time.Time {
	t.Helper()
	at := nextSecond(time.Now().Add(time.Second))
	for _, id := range []string{"once", "moved"} {
		putTask(t, reg, handlerTask(id, "@at "+at.Format(time.RFC3339)))
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("once")) == 1 && len(log.of("moved")) == 1 })
	return at
}

// editOneShots writes, while their partition changes hands (after the
// release's mark), a label on once, a time a second before at on moved,
// and fresh at that time, and returns it.
func editOneShots(t *testing.T, reg *registry.Registry, at time.Time) time.Time {
	t.Helper()
	tk, err := reg.Get(context.Background(), "once")
	if err != nil {
		t.Fatal(err)
	}
	tk.Labels = map[string]string{"seen": "yes"}
	putTask(t, reg, tk)
	earlier := at.Add(-time.Second)
	putTask(t, reg, handlerTask("moved", "@at "+earlier.Format(time.RFC3339)))
	putTask(t, reg, handlerTask("fresh", "@at "+earlier.Format(time.RFC3339)))
	return earlier
}

// oneShotsFired checks what the one-shot tests of a hand-over fired: once
// at at, on its first owner alone; moved at at there, then at earlier
// (its time moved into the past during the hand-over); fresh (put then,
// at earlier) once.
func oneShotsFired(t *testing.T, log *callLog, at, earlier time.Time) {
	t.Helper()
	firedAt(t, log, map[string][]time.Time{"once": {at}, "moved": {at, earlier}, "fresh": {earlier}})
}

// firedAt checks that each task of want fired at its times, and only then.
func firedAt(t *testing.T, log *callLog, want map[string][]time.Time) {
	t.Helper()
	for id, want := range want {
		var got []time.Time
		var where []string
		for _, f := range log.of(id) {
			got, where = append(got, f.ScheduledAt), append(where, f.Node)
		}
		if !slices.EqualFunc(got, want, time.Time.Equal) {
			t.Errorf("%s fired at %v (on %v), want %v", id, secs(got), where, secs(want))
		}
	}
}

// So does a one-shot edited before its next owner read the partition (not
// prepared ahead: here nobody was there to prepare it while its owner
// left): etcd's history of the task says it held that time as last
// written before the release's mark, so the previous owner decided it.
// The read, after the edit, could not tell it from a put after its time,
// and the next owner fired it again within its catch-up window. One put
// after the release, or whose time a write then moved into the past,
// still fires there.
func TestEngine_OneShotEditedBeforeItsNextOwnerReadItDoesNotFireAgain(t *testing.T) {
	c := etcdtest.Start(t)
	log := &callLog{}
	a := startNode(t, c, "", log.handler(nil), oneShotNode("node-a"))
	reg := a.e.Registry()
	at := fireOneShots(t, reg, log)
	a.stop(t) // the partition is released, its mark past at
	earlier := editOneShots(t, reg, at)
	b := startNode(t, c, "", log.handler(nil), oneShotNode("node-b"))
	defer b.stop(t)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("moved")) == 2 && len(log.of("fresh")) == 1 })
	// once was loaded with them, and, armed, would have gone out with them.
	if s := taskState(t, b, "once"); !s.LastFireAt.IsZero() {
		t.Errorf("node-b fired once at %v", s.LastFireAt)
	}
	oneShotsFired(t, log, at, earlier)
}

// Whether a one-shot whose time is not after the resume point fires on
// the next owner depends on what the previous owner applied of it, not on
// clocks. Its updated_at is the writing node's clock: one behind stamps a
// put that reached the previous owner only after its release (so it never
// armed it) before the release's mark, and the next owner took it for
// decided there (a miss: behind fired nowhere); one ahead stamps a put
// the previous owner fired past the mark, and the next owner took it for
// a put while it changed hands (a repeat: ahead fired on both). The
// release records the etcd revision through which its owner applied the
// partition's changes, and the next owner arms as a put what was written
// after it.
func TestEngine_OneShotHandOverGoesByWhatThePreviousOwnerApplied(t *testing.T) {
	c := etcdtest.Start(t)
	log := &callLog{}
	bID := nextOwnerOfTheOnePartition(t)
	a := startNode(t, c, "", log.handler(nil), oneShotNode("node-a"))
	defer a.stop(t)
	ahead := time.Now().Add(-time.Second).Truncate(time.Second)
	putSkewed(t, c, "ahead", ahead, time.Now().Add(time.Hour))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("ahead")) == 1 })

	b, let := startNextOwnerHeld(t, c, log, bID)
	defer b.stop(t)
	behind := time.Now().Add(-time.Second).Truncate(time.Second)
	putSkewed(t, c, "behind", behind, behind)
	close(let)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return b.e.Owns(0) })
	// Missed, behind never fires: the wait for it is bounded.
	for until := time.Now().Add(10 * time.Second); len(log.of("behind")) == 0 && time.Now().Before(until); {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // a fire armed in the past goes out at once
	firedAt(t, log, map[string][]time.Time{"ahead": {ahead}, "behind": {behind}})
}

// So after a crash: the crashed owner's watermark carries the revision up
// to which it had armed the partition's changes when its dispatch reached
// the watermark, and the next owner, resuming from the watermark, goes by
// it. By updated_at, a put the crashed owner never saw (cut off before its
// watch delivered it), stamped before its watermark by a node whose clock
// was behind, was taken as decided and fired nowhere; and one it fired,
// stamped after the watermark by a node whose clock was ahead, was taken
// as a put and fired again.
func TestEngine_OneShotAfterACrashGoesByWhatTheCrashedOwnerApplied(t *testing.T) {
	c := etcdtest.Start(t)
	log := &callLog{}
	proxy := c.NewProxy(t)
	a := startNodeOn(t, c.NewClient(t, proxy.Endpoint()), "", log.handler(nil), oneShotNode("node-a"))
	defer a.stop(t)
	ahead := time.Now().Add(-time.Second).Truncate(time.Second)
	putSkewed(t, c, "ahead", ahead, time.Now().Add(time.Hour))
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return len(log.of("ahead")) == 1 })
	fired := time.Now()
	waitNamed(t, c, a, 0)
	sess := sessionID(a.e.sess.Load())
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return readWatermark(t, c, "node-a", sess).After(fired) })

	crash(t, a, proxy)
	behind := readWatermark(t, c, "node-a", sess).Add(-time.Second).Truncate(time.Second)
	putSkewed(t, c, "behind", behind, behind)
	b := startNode(t, c, "", log.handler(nil), oneShotNode("node-b"))
	defer b.stop(t)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { return b.e.Owns(0) })
	// Missed, behind never fires: the wait for it is bounded.
	for until := time.Now().Add(10 * time.Second); len(log.of("behind")) == 0 && time.Now().Before(until); {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // a fire armed in the past goes out at once
	firedAt(t, log, map[string][]time.Time{"ahead": {ahead}, "behind": {behind}})
}

// putSkewed puts the one-shot id at at into the one partition of the
// one-shot tests, as a registry whose clock reads written puts it.
func putSkewed(t *testing.T, c *etcdtest.Cluster, id string, at, written time.Time) {
	t.Helper()
	tk := handlerTask(id, "@at "+at.Format(time.RFC3339))
	if err := tk.Validate(); err != nil { // its defaults, as a put stores them
		t.Fatal(err)
	}
	tk.CreatedAt, tk.UpdatedAt = written, written
	b, err := json.Marshal(tk)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.Put(context.Background(), DefaultPrefix+"/tasks/00000/"+id, string(b)); err != nil {
		t.Fatal(err)
	}
}

// A next owner whose read of the partition came from its Badger cache,
// synced past the revision its previous owner applied, cannot tell from
// the read which one-shots that owner had: it reads what changed since,
// once, and decides by that. Here one-shots fired before the revision
// (left alone, and labeled after it) are decided, and one put after it,
// or whose time moved after it, are armed as puts.
func TestEngine_OneShotsReadFromACachePastTheAppliedRevisionGoByWhatChanged(t *testing.T) {
	c := etcdtest.Start(t)
	a := startNode(t, c, "", nil, oneShotNode("node-a"))
	defer a.stop(t)
	reg := a.e.Registry()
	ctx := context.Background()
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	spec := "@at " + at.Format(time.RFC3339)
	for _, id := range []string{"kept", "labeled", "moved"} {
		putTask(t, reg, handlerTask(id, spec))
	}
	applied, err := reg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	labeled := handlerTask("labeled", spec)
	labeled.Labels = map[string]string{"seen": "yes"}
	putTask(t, reg, labeled)
	putTask(t, reg, handlerTask("moved", "@at "+at.Add(-time.Second).Format(time.RFC3339)))
	putTask(t, reg, handlerTask("fresh", spec))
	rev, err := reg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The definitions as a cache read gives them: no revision of their own.
	d := a.e.decoder()
	var defs []taskDef
	for _, id := range []string{"kept", "labeled", "moved", "fresh"} {
		tk, err := reg.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(tk)
		if err != nil {
			t.Fatal(err)
		}
		def, err := d.def(id, b)
		if err != nil {
			t.Fatal(err)
		}
		defs = append(defs, def)
	}
	prep := &prepared{p: 0, rev: rev, defs: defs}
	if err := a.e.decideApplied(ctx, &arming{prep: prep, defs: defs, rev: rev, resume: time.Now().UnixNano(), applied: applied}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"kept": false, "labeled": false, "moved": true, "fresh": true} // armed as a put
	for _, def := range defs {
		if def.put != want[def.id] || def.decided == want[def.id] {
			t.Errorf("%s: put %v, decided %v; want put %v", def.id, def.put, def.decided, want[def.id])
		}
	}
}

// A task bounded by not_after says it ended only once its last time
// passed: before, with fires to come, its state says nothing ended, and
// it says so again while paused.
func TestLoop_WindowEndsOnlyAfterItsLastTime(t *testing.T) {
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	h := tl.everySecond(t)
	prof := noopProfile(task.MisfireFireOnce)
	prof.key = "noop/not-after"
	prof.win = &window{s: tl.scheds.Get(h), to: base.Add(5 * time.Second).UnixNano(), end: task.EndedNotAfter}
	def := func(paused bool) taskDef {
		return taskDef{id: "t", hash: xxhash.Sum64String("t"), part: 0, sched: h, prof: prof, paused: paused}
	}
	tl.handle(&loadCmd{part: 0, resume: base.UnixNano(), first: true, done: make(chan struct{}), defs: []taskDef{def(false)}})
	ended := func(want string) {
		t.Helper()
		if s := tl.state("t"); s == nil || s.Ended != want {
			t.Errorf("state %+v, want ended %q", s, want)
		}
	}
	ended("")
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(true)}})
	ended("")
	tl.handle(&eventsCmd{part: 0, upserts: []taskDef{def(false)}})
	tl.clock.Advance(10 * time.Second)
	tl.dispatchAll()
	ended(task.EndedNotAfter)
}

// The acquire of a partition whose previous owner did not delete its
// ended delete_after_fire tasks (it crashed) deletes only those last
// written before their last time: one written after it (edited, or put
// after its time and fired late by its misfire policy) stays, ended.
func TestLoop_AcquireDeletesAnEndedTaskOnlyIfWrittenBeforeItsLastTime(t *testing.T) {
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, base, nil)
	h := tl.everySecond(t)
	at := base.Add(-10 * time.Second)
	def := func(id string, written time.Time) taskDef {
		prof := noopProfile(task.MisfireFireOnce)
		prof.key, prof.deleteAfter, prof.updatedAt = "noop/delete-after/"+id, true, written
		prof.win = &window{s: tl.scheds.Get(h), from: at.UnixNano(), to: at.UnixNano(), end: task.EndedMaxFires}
		return taskDef{id: id, hash: xxhash.Sum64String(id), part: 0, sched: h, prof: prof}
	}
	tl.handle(&loadCmd{part: 0, resume: base.UnixNano(), first: true, done: make(chan struct{}),
		defs: []taskDef{def("before", at.Add(-time.Second)), def("after", at.Add(time.Second))}})
	tl.handle(&endedCmd{part: 0})
	var deleted []string
	for len(tl.ended) > 0 {
		deleted = append(deleted, (<-tl.ended).id)
	}
	if !slices.Equal(deleted, []string{"before"}) {
		t.Errorf("deletions queued %v, want [before]", deleted)
	}
}
