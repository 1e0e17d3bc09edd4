package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// TestJob_Size: a job is 72 bytes. Every fire of a burst is one, queued or
// staged (a million at the second of a 1 M fleet), so what only a
// trigger's, a retry's or a backfill's fire needs is behind one pointer
// (fireExtra), not in every plain fire's job: with them inline a job was
// 88 bytes.
func TestJob_Size(t *testing.T) {
	if got := unsafe.Sizeof(job{}); got > 72 {
		t.Fatalf("job is %d bytes, want at most 72", got)
	}
}

// A staged segment is queued ahead of the jobs pushed after it, counts
// against the queue's room, and is taken, dropped and reset as queued jobs
// are; once taken, its slice comes back emptied for the next stage.
func TestPool_StagedSegmentIsQueuedFirst(t *testing.T) {
	cfg := DefaultConfig("n").withDefaults()
	cfg.Workers, cfg.Queue = 1, 32
	var hold atomic.Bool
	hold.Store(true) // the worker takes nothing until the queue is set up
	p := newPool(cfg, nil, &stats{}, hold.Load, 0)
	t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
	prof := &profile{key: "noop", exec: executor.Noop, noop: true, timeout: time.Minute, maxAttempts: 1,
		misfire: task.MisfireFireOnce, catchup: time.Minute, concurrency: task.ConcurrencyAllow}
	jobs := func(from, to uint32) []job {
		var js []job
		for i := from; i < to; i++ {
			js = append(js, job{id: "t", prof: prof, sched: int64(i), rec: i, attempt: 1})
		}
		return js
	}
	seg := jobs(0, 10)
	if _, ok := p.pushStaged(seg); !ok {
		t.Fatal("an empty queue refused a staged segment")
	}
	if k := p.push(jobs(10, 15)); k != 5 {
		t.Fatalf("pushed %d jobs behind the segment, want 5", k)
	}
	if _, ok := p.pushStaged(jobs(20, 22)); ok {
		t.Fatal("a second segment was queued while jobs wait")
	}
	if d, f := p.depth(), p.free(); d != 15 || f != 17 {
		t.Fatalf("depth %d and room %d, want 15 and 17", d, f)
	}
	p.dropQueued(func(j *job) bool { return j.rec == 3 || j.rec == 12 })

	p.mu.Lock()
	hold.Store(false)
	p.ready.Broadcast()
	p.mu.Unlock()
	var order []uint32
	for len(order) < 13 {
		select {
		case b := <-p.done:
			for _, c := range b.c[:b.n] {
				order = append(order, c.rec)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the worker ran %v, then nothing", order)
		}
	}
	want := []uint32{0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14}
	if !slices.Equal(order, want) {
		t.Fatalf("ran %v, want %v: the segment first, in order, without the dropped jobs", order, want)
	}
	if s := p.spareSlice(); cap(s) != cap(seg) || len(s) != 0 || slices.ContainsFunc(s[:cap(s)], func(j job) bool { return j.prof != nil }) {
		t.Errorf("the taken segment came back with length %d, capacity %d (want 0, %d), or not emptied", len(s), cap(s), cap(seg))
	}

	hold.Store(true)
	p.push(jobs(20, 21))
	if _, ok := p.pushStaged(jobs(21, 23)); ok {
		t.Fatal("a segment was queued ahead of a job pushed before it")
	}
	p.reset()
	if _, ok := p.pushStaged(jobs(30, 40)); !ok {
		t.Fatal("an empty queue refused a staged segment")
	}
	p.reset()
	if d := p.depth(); d != 0 || p.seg != nil {
		t.Errorf("after a reset %d jobs wait (segment %v)", d, p.seg != nil)
	}
}

// The batches a burst's completions need are made before it (reserve) and
// kept: a burst of reserved size allocates none, and each comes back to
// the free list once the loop applied it. A completion's error, override
// and backfill travel beside it.
func TestPool_ReservedBatchesServeTheBurst(t *testing.T) {
	cfg := DefaultConfig("n").withDefaults()
	cfg.Workers, cfg.Queue = 2, 64
	var hold atomic.Bool
	hold.Store(true)
	p := newPool(cfg, nil, &stats{}, hold.Load, 0)
	t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
	for deadline := time.Now().Add(10 * time.Second); p.made.Load() < int64(cfg.Workers); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the workers never took their first batch")
		}
	}
	const fires = 640
	p.reserve(fires)
	reserved := p.made.Load()
	if want := int64(fires/chunkMax + cfg.Workers); reserved < want || len(p.batches) < int(want)-cfg.Workers {
		t.Fatalf("reserve(%d) made %d batches, %d free, want %d", fires, reserved, len(p.batches), want)
	}
	p.reserve(fires)
	if p.made.Load() != reserved {
		t.Fatalf("a second reserve of the same burst made %d more batches", p.made.Load()-reserved)
	}

	var b completionBatch
	over := &task.Override{}
	b.add(&job{rec: 1}, statusOK, "", false)
	b.add(&job{rec: 2, extra: extraOf(over, nil)}, statusFailed, "boom", false)
	if x := b.extra(&b.c[0]); x != (completionExtra{}) {
		t.Errorf("a plain fire's completion carries %+v", x)
	}
	if x := b.extra(&b.c[1]); x.err != "boom" || x.extra.override() != over {
		t.Errorf("a failure's completion carries %+v, want its error and override", x)
	}
	b.empty()
	if b.n != 0 || len(b.extras) != 0 {
		t.Errorf("an emptied batch holds %d completions and %d extras", b.n, len(b.extras))
	}

	free := len(p.batches)
	for range 3 * free {
		p.recycle(p.batch())
	}
	if p.made.Load() != reserved || len(p.batches) != free {
		t.Fatalf("batches taken and given back: %d made, %d free; want %d and %d", p.made.Load(), len(p.batches), reserved, free)
	}
}

// trackingPool returns a pool, and run, which starts a run of j taken
// when there had been cuts cuts by worker 0 (track), and returns its
// context.
func trackingPool(t *testing.T) (*pool, func(j *job, cuts uint64) context.Context) {
	cfg := DefaultConfig("n").withDefaults()
	p := newPool(cfg, nil, &stats{}, func() bool { return false }, 0)
	t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
	return p, func(j *job, cuts uint64) context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		key := p.track(0, j, cancel, cuts)
		t.Cleanup(func() { p.untrack(key) })
		return ctx
	}
}

// A fence cuts the runs of tasks whose policy keeps their fires apart,
// and those taken before it that start after it; a replace cancels only
// the runs of its record.
func TestPool_CutRunningCancelsTheRunsKeptApart(t *testing.T) {
	p, run := trackingPool(t)
	forbid := &job{rec: 1, prof: &profile{concurrency: task.ConcurrencyForbid}}
	replace := &job{rec: 2, prof: &profile{concurrency: task.ConcurrencyReplace}}
	before := p.cuts.Load()
	a, b := run(forbid, before), run(replace, before)
	p.replaceRunning(2, 0)
	if a.Err() != nil || !errors.Is(context.Cause(b), errReplaced) {
		t.Fatalf("replace's record canceled: forbid's run %v, replace's %v; want forbid's running, replace's %v", context.Cause(a), context.Cause(b), errReplaced)
	}
	if n := p.cutRunning(); n != 1 {
		t.Errorf("the cut canceled %d runs, want 1 (forbid's; replace's was canceled before)", n)
	}
	if !errors.Is(context.Cause(a), errFenced) {
		t.Fatalf("after the cut forbid's run: %v, want %v", context.Cause(a), errFenced)
	}
	if late := run(forbid, before); !errors.Is(context.Cause(late), errFenced) {
		t.Fatalf("a run taken before the cut, started after it: %v, want %v", context.Cause(late), errFenced)
	}
	if next := run(forbid, p.cuts.Load()); next.Err() != nil {
		t.Fatalf("a run taken after the cut: %v, want it running", context.Cause(next))
	}
}

// An undone acquire cuts the runs kept apart of its partition alone, and
// those of it taken before the cut that start after it; the runs of other
// partitions go on, and so does one of theirs taken before the cut.
func TestPool_CutPartitionCancelsItsRunsAlone(t *testing.T) {
	p, run := trackingPool(t)
	prof := &profile{concurrency: task.ConcurrencyForbid}
	undone, other := &job{rec: 1, part: 3, prof: prof}, &job{rec: 2, part: 4, prof: prof}
	before := p.cuts.Load()
	a, b := run(undone, before), run(other, before)
	if n := p.cutPartition(3); n != 1 {
		t.Errorf("the cut canceled %d runs, want 1 (partition 3's)", n)
	}
	if !errors.Is(context.Cause(a), errUndone) || b.Err() != nil {
		t.Fatalf("after partition 3's cut: its run %v, partition 4's %v; want %v and running", context.Cause(a), context.Cause(b), errUndone)
	}
	if late := run(undone, before); !errors.Is(context.Cause(late), errUndone) {
		t.Fatalf("partition 3's run taken before the cut, started after it: %v, want %v", context.Cause(late), errUndone)
	}
	if late := run(other, before); late.Err() != nil {
		t.Fatalf("partition 4's run taken before the cut, started after it: %v, want it running", context.Cause(late))
	}
	if next := run(undone, p.cuts.Load()); next.Err() != nil {
		t.Fatalf("partition 3's run taken after the cut: %v, want it running", context.Cause(next))
	}
}

// A fence that comes while a worker takes a job, after the take found the
// node not fenced, cuts that job's run too: the next owner may fire its
// task once the lease ends.
func TestPool_FenceDuringATakeCutsItsJob(t *testing.T) {
	cfg := DefaultConfig("n").withDefaults()
	cfg.Workers = 1
	var p *pool
	var fence sync.Once
	p = newPool(cfg, nil, &stats{}, func() bool {
		fence.Do(func() { p.cutRunning() }) // the deadline passes just after the check
		return false
	}, 0)
	t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
	ended := make(causeExec, 1)
	prof := &profile{exec: ended, timeout: time.Minute, maxAttempts: 1, concurrency: task.ConcurrencyForbid}
	p.push([]job{{id: "t", rec: 1, prof: prof, attempt: 1}})
	select {
	case cause := <-ended:
		if !errors.Is(cause, errFenced) {
			t.Fatalf("the run taken across the fence ended for %v, want %v", cause, errFenced)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not run within 10 s")
	}
}

// A trigger's job of a task kept apart that a cut cancels before it
// starts leaves its key for the partition's next owner: the pool queues
// no delete of it, and hands its put to the drop or the undo
// (takeUnstarted), whether a fence came during the take, after the take's
// check, or once the worker held the job, or an undone acquire of its
// partition cut it. The take queued the delete, and nobody fired the
// trigger (TestEngine_TriggerTakenAndNotStartedAtAFenceFires,
// TestEngine_TriggerTakenAndNotStartedAtAnUndoneAcquireFires). Its
// completion says so, for the loop not to end its trigger
// (TestEngine_TriggerPutAgainWhileTakenAndCutAtAFenceFires). One that
// starts has its key deleted, as before.
func TestPool_TriggerCutBeforeItStartsKeepsItsKey(t *testing.T) {
	end := triggerEnd{triggerKey{part: 0, id: "t", at: 5}, 9}
	fence := func(p *pool) { p.cutRunning() }
	for _, tc := range []struct {
		name       string
		duringTake func(p *pool) // cuts just after the take's check
		onceHeld   func(p *pool) // cuts once the worker holds the job
		cut        bool          // the job is cut
	}{
		{name: "no cut"},
		{name: "fence during the take", duringTake: fence, cut: true},
		{name: "fence once held", onceHeld: fence, cut: true},
		{name: "undo of its partition once held", onceHeld: func(p *pool) { p.cutPartition(0) }, cut: true},
		{name: "undo of another partition once held", onceHeld: func(p *pool) { p.cutPartition(1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig("n").withDefaults()
			cfg.Workers = 1
			var p *pool
			var once sync.Once
			if tc.onceHeld != nil {
				cfg.Clock = cutClock{func() { once.Do(func() { tc.onceHeld(p) }) }} // the worker reads the time once it took the job
			}
			p = newPool(cfg, nil, &stats{}, func() bool {
				if tc.duringTake != nil {
					once.Do(func() { tc.duringTake(p) })
				}
				return false
			}, 0)
			t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
			prof := &profile{exec: executor.Noop, timeout: time.Minute, maxAttempts: 1, concurrency: task.ConcurrencyForbid}
			wantEnds, wantUnstarted := []triggerEnd{end}, []triggerEnd(nil)
			if tc.cut {
				prof.exec = make(causeExec, 1)
				wantEnds, wantUnstarted = nil, wantEnds
			}
			p.push([]job{{id: "t", rec: 1, prof: prof, attempt: 1, sched: 5, kind: kindTrigger, extra: &fireExtra{trig: 9}}})
			select {
			case b := <-p.done:
				if got := b.extra(&b.c[0]).unstarted; got != tc.cut {
					t.Errorf("its completion says it was cut before it started: %v, want %v", got, tc.cut)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the job did not end within 10 s")
			}
			if got := p.ends.take(10); !slices.Equal(got, wantEnds) {
				t.Errorf("trigger keys to delete: %v, want %v", got, wantEnds)
			}
			if got := p.takeUnstarted(1); len(got) > 0 {
				t.Errorf("triggers of partition 1 left unstarted: %v, want none", got)
			}
			if got := p.takeUnstarted(0); !slices.Equal(got, wantUnstarted) {
				t.Errorf("triggers of partition 0 left unstarted: %v, want %v", got, wantUnstarted)
			}
		})
	}
}

// cutClock is a clock that calls cut at each reading.
type cutClock struct{ cut func() }

func (c cutClock) Now() time.Time                  { c.cut(); return time.Now() }
func (c cutClock) Until(t time.Time) time.Duration { return time.Until(t) }

// A backfill's fire that a fence cut did not end: its runner, which the
// node stops as it drops its partitions, must not count it done first.
// Counted, it could be recorded done while etcd still answers (the lease
// lost, not etcd), and the next owner, resuming after it, would never run
// it.
func TestPool_BackfillFireCutByAFenceDoesNotEnd(t *testing.T) {
	cfg := DefaultConfig("n").withDefaults()
	cfg.Workers = 1
	var p *pool
	var fence sync.Once
	p = newPool(cfg, nil, &stats{}, func() bool {
		fence.Do(func() { p.cutRunning() })
		return false
	}, 0)
	t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
	prof := &profile{exec: make(causeExec, 1), timeout: time.Minute, maxAttempts: 1, concurrency: task.ConcurrencyForbid}
	bf := &backfillRun{id: "t", ended: make(chan int64, 2)}
	p.push([]job{{id: "t", rec: 1, prof: prof, attempt: 1, sched: 7, extra: extraOf(nil, bf)}})
	select {
	case b := <-p.done:
		if st := b.c[0].status; st != statusCanceled {
			t.Fatalf("the cut fire ended %s, want canceled", statusNames[st])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not end within 10 s")
	}
	if len(bf.ended) > 0 {
		t.Errorf("the backfill was told its fire at %d ended, though a fence cut it", <-bf.ended)
	}
}

// A job a worker takes once the node's stop canceled the executions (the
// drain timeout, Hurry), of a task whose partition was released with the
// attempt under way, is not run: it is handed on as the attempt it is,
// due at once, as the retry of an attempt the stop canceled. It ran, was
// canceled at once, and its retry was handed on as the next attempt: an
// attempt spent on nothing, and the last one's fire lost.
func TestPool_JobTakenAfterTheStopIsHandedOnUnrun(t *testing.T) {
	for _, attempt := range []uint16{1, 3} {
		t.Run(fmt.Sprintf("attempt %d of 3", attempt), func(t *testing.T) {
			ran := make(causeExec, 1)
			prof := retryingProfile()
			prof.exec, prof.noop = ran, false
			p := takenAfterTheStop(t, func(p *pool) {
				// Its partition released, the release sealed: the worker
				// hands its retry on through etcd.
				p.leaving.m[leavingKey(1, 0)] = &leaver{id: "flaky", prof: prof, created: 7, run: &running{n: 1, ended: make(chan struct{})}, n: 1}
			}, job{id: "flaky", rec: 1, prof: prof, attempt: attempt, sched: 5})
			wantCanceledHandedOn(t, p)
			if len(ran) > 0 {
				t.Errorf("the job ran (canceled for %v), taken after the stop", <-ran)
			}
			var got []string
			for _, f := range p.chains.take() {
				got = append(got, fmt.Sprintf("%s@%d attempt %d created %d", f.from, f.sched, f.retry.Attempt, f.created))
			}
			if want := []string{fmt.Sprintf("flaky@5 attempt %d created 7", attempt)}; !slices.Equal(got, want) {
				t.Errorf("handed on %v, want %v", got, want)
			}
		})
	}
}

// takenAfterTheStop has a pool of one worker take j only once the node's
// stop canceled the executions, prepare having set the pool up before.
func takenAfterTheStop(t *testing.T, prepare func(p *pool), j job) *pool {
	t.Helper()
	cfg := DefaultConfig("n").withDefaults()
	cfg.Workers = 1
	var hold atomic.Bool // a fenced pool takes nothing
	hold.Store(true)
	p := newPool(cfg, nil, &stats{}, hold.Load, 0)
	t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
	prepare(p)
	p.push([]job{j})
	p.stopExecutions()
	p.mu.Lock()
	hold.Store(false)
	p.ready.Broadcast()
	p.mu.Unlock()
	return p
}

// A stop that comes after the worker's check but before the executor
// started any work (executor.ErrNotStarted) leaves the attempt done with
// nothing: it is handed on as the attempt it is, as stopUnrun hands one
// on, by its leaver, or, for a task the release did not note as leaving,
// by its partition's release (leavers.unrun). It was handed on as the
// next attempt, so that a task of one attempt, or a last attempt, was
// lost.
func TestPool_AttemptTheStopCameBeforeIsHandedOnAsItself(t *testing.T) {
	for _, tc := range []struct {
		attempt, max uint16
		leaver       bool // else its task is not one, its partition released
	}{{1, 1, true}, {3, 3, true}, {1, 3, true}, {1, 1, false}} {
		t.Run(fmt.Sprintf("attempt %d of %d, leaver %t", tc.attempt, tc.max, tc.leaver), func(t *testing.T) {
			cfg := DefaultConfig("n").withDefaults()
			cfg.Workers = 1
			p := newPool(cfg, nil, &stats{}, func() bool { return false }, 0)
			t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
			var h executor.Handlers
			called := false
			h.Handle("h", func(context.Context, executor.Fire) error { called = true; return nil })
			prof := retryingProfile()
			prof.exec, prof.noop, prof.maxAttempts = stopFirst{p, executor.NewHandler(&h, "h", nil)}, false, int(tc.max)
			if tc.leaver {
				p.leaving.m[leavingKey(1, 0)] = &leaver{id: "t", prof: prof, created: 7, run: &running{n: 1, ended: make(chan struct{})}, n: 1}
			} else {
				p.leaving.released[0] = releasedPart{fence: 9, created: 7}
			}
			p.push([]job{{id: "t", rec: 1, prof: prof, attempt: tc.attempt, sched: 5, fence: 9}})
			wantCanceledHandedOn(t, p)
			if called {
				t.Error("the handler was called after the stop")
			}
			var got []string
			for _, f := range p.chains.take() {
				got = append(got, fmt.Sprintf("%s@%d attempt %d created %d", f.from, f.sched, f.retry.Attempt, f.created))
			}
			if want := []string{fmt.Sprintf("t@5 attempt %d created 7", tc.attempt)}; !slices.Equal(got, want) {
				t.Errorf("handed on %v, want %v", got, want)
			}
		})
	}
}

// stopFirst is an executor that stops its pool's executions, as Close
// does after the worker's own check, then runs exec.
type stopFirst struct {
	p    *pool
	exec executor.Executor
}

func (s stopFirst) Execute(ctx context.Context, f *executor.Fire) error {
	s.p.stopExecutions()
	return s.exec.Execute(ctx, f)
}

// A replace canceled the runs of its task and the jobs still queued, but
// not a job a worker had taken and not yet started (track): that one ran
// beside the newer fire, or, met unrun by the node's stop, was handed on
// to run after it. Now the replace cancels it as it starts, unrun. Here
// the worker is held between its take and its start (takenGate), the
// replace comes, and the worker goes on.
func TestPool_ReplaceCancelsAJobTakenAndNotStarted(t *testing.T) {
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("stop %t", stop), func(t *testing.T) {
			cfg := DefaultConfig("n").withDefaults()
			cfg.Workers = 1
			gate := newTakenGate()
			gate.Clock, cfg.Clock = cfg.Clock, gate
			p := newPool(cfg, nil, &stats{}, func() bool { return false }, 0)
			t.Cleanup(func() { close(p.quit); gate.let(); p.drain(time.Second) })
			ran := make(causeExec, 1)
			prof := &profile{exec: ran, timeout: time.Minute, maxAttempts: 1, concurrency: task.ConcurrencyReplace}
			p.leaving.released[0] = releasedPart{fence: 9, created: 7} // its partition released: the stop would hand it on
			p.push([]job{{id: "r", rec: 1, prof: prof, attempt: 1, sched: 5, fence: 9}})
			etcdtest.WaitFor(t, 10*time.Second, gate.held.Load)
			p.replaceRunning(1, 0) // a newer fire of the task
			if stop {
				p.stopExecutions()
			}
			gate.let()
			select {
			case b := <-p.done:
				if c := b.c[0]; c.status != statusCanceled || b.extra(&c).handed {
					t.Errorf("the job ended %s, handed on %t; want canceled, not handed on", statusNames[c.status], b.extra(&c).handed)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the job did not end within 10 s")
			}
			if len(ran) > 0 {
				if cause := <-ran; !errors.Is(cause, errReplaced) {
					t.Errorf("the job ran (its context's cause %v), want it canceled as replaced before it started", cause)
				}
			}
			if got := p.chains.take(); len(got) > 0 {
				t.Errorf("handed on %d fires, want none: the newer fire runs", len(got))
			}
		})
	}
}

// wantCanceledHandedOn waits for p's one job to end, canceled and handed on.
func wantCanceledHandedOn(t *testing.T, p *pool) {
	t.Helper()
	select {
	case b := <-p.done:
		if c := b.c[0]; c.status != statusCanceled || !b.extra(&c).handed {
			t.Errorf("the job ended %s, handed on %t; want canceled, handed on", statusNames[c.status], b.extra(&c).handed)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not end within 10 s")
	}
}

// The retry of an attempt the node's stop cancels is handed on by the
// task's definition at its partition's release, as the retry of a failure
// is (leavers.handOn), and as the owner retries by the definition it
// holds: a task edited from one attempt to three while attempt 1 ran
// hands attempt 2 on. It was lost, the attempt's own definition having
// none left. Edited the other way, from three to one, nothing is handed
// on; nor when the last attempt is canceled, and a backfill's fire then
// ends.
func TestPool_RetryOfAnAttemptTheStopCancelsGoesByTheTasksDefinitionAtTheRelease(t *testing.T) {
	for _, tc := range []struct {
		ran, held int    // max_attempts of the attempt's definition, and of the one held at the release
		attempt   uint16 // the attempt canceled
		want      []string
	}{
		{ran: 1, held: 3, attempt: 1, want: []string{"flaky@5 attempt 2"}},
		{ran: 3, held: 1, attempt: 1},
		{ran: 3, held: 3, attempt: 3},
	} {
		t.Run(fmt.Sprintf("attempt %d of %d, edited to %d", tc.attempt, tc.ran, tc.held), func(t *testing.T) {
			cfg := DefaultConfig("n").withDefaults()
			cfg.Workers = 1
			p := newPool(cfg, nil, &stats{}, func() bool { return false }, 0)
			t.Cleanup(func() { close(p.quit); p.drain(time.Second) })
			started := make(startedExec, 1)
			prof, held := retryingProfile(), retryingProfile()
			prof.exec, prof.noop, prof.maxAttempts = started, false, tc.ran
			held.maxAttempts = tc.held
			k := leavingKey(1, 0)
			p.leaving.m[k] = &leaver{id: "flaky", prof: held, created: 7, run: &running{n: 1, ended: make(chan struct{})}, n: 1}
			bf := &backfillRun{id: "flaky", ended: make(chan int64, 2)}
			p.push([]job{{id: "flaky", rec: 1, prof: prof, attempt: tc.attempt, sched: 5, extra: extraOf(nil, bf)}})
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("the attempt did not start within 10 s")
			}
			p.stopExecutions()
			select {
			case b := <-p.done:
				if c := b.c[0]; c.status != statusCanceled || b.extra(&c).handed != (tc.want != nil) {
					t.Errorf("the attempt ended %s, handed on %t; want canceled, handed on %t", statusNames[c.status], b.extra(&c).handed, tc.want != nil)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the attempt did not end within 10 s")
			}
			var got []string
			for _, f := range p.chains.take() {
				got = append(got, fmt.Sprintf("%s@%d attempt %d", f.from, f.sched, f.retry.Attempt))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("handed on %v, want %v", got, tc.want)
			}
			if ended := len(bf.ended) > 0; ended != (tc.want == nil) {
				t.Errorf("the backfill's fire ended: %t, want %t (no retry runs on)", ended, tc.want == nil)
			}
		})
	}
}

// A trigger's first attempt that the node's stop meets unrun is handed on
// as a trigger's (registry.Retry.Trigger), so that it runs while its task
// is paused, as the trigger would have here: handed on as any first
// attempt, the next owner skipped it for the pause. A first attempt of the
// schedule's is handed on as before.
func TestPool_TriggerTheStopMetUnrunIsHandedOnAsATriggers(t *testing.T) {
	for _, kind := range []uint8{kindTrigger, kindSchedule} {
		t.Run(fmt.Sprintf("kind %d", kind), func(t *testing.T) {
			prof := retryingProfile()
			prof.exec, prof.noop, prof.maxAttempts = make(causeExec, 1), false, 1
			var x *fireExtra
			if kind == kindTrigger {
				x = &fireExtra{trig: 4}
			}
			p := takenAfterTheStop(t, func(p *pool) { p.leaving.released[0] = releasedPart{fence: 9, created: 7} },
				job{id: "t", rec: 1, prof: prof, attempt: 1, sched: 5, fence: 9, kind: kind, extra: x})
			wantCanceledHandedOn(t, p)
			fs := p.chains.take()
			if len(fs) != 1 || fs[0].retry == nil {
				t.Fatalf("handed on %v, want t's first attempt", fs)
			}
			if got, want := fs[0].retry.Trigger, kind == kindTrigger; got != want {
				t.Errorf("handed on as a trigger's: %t, want %t", got, want)
			}
		})
	}
}

// causeExec runs a fire until its context ends, 2 s at most, and sends
// why it ended: the context's cause, or nil.
type causeExec chan error

func (c causeExec) Execute(ctx context.Context, _ *executor.Fire) error {
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
	c <- context.Cause(ctx)
	return ctx.Err()
}

// startedExec runs a fire until its context ends, once it said on its
// channel that it started.
type startedExec chan struct{}

func (s startedExec) Execute(ctx context.Context, _ *executor.Fire) error {
	s <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// BenchmarkExecute measures the start and end of one run of a task that
// is not a noop (the executor itself does nothing), by policy: the runs
// of tasks that keep their fires apart are tracked for cancels (track),
// those of allow tasks are not. Run in parallel, as the pool's workers
// run.
func BenchmarkExecute(b *testing.B) {
	for _, c := range []task.ConcurrencyPolicy{task.ConcurrencyAllow, task.ConcurrencyForbid, task.ConcurrencyReplace} {
		b.Run("policy="+string(c), func(b *testing.B) {
			b.ReportAllocs()
			cfg := DefaultConfig("n").withDefaults()
			p := newPool(cfg, nil, &stats{}, func() bool { return false }, 0)
			b.Cleanup(func() { close(p.quit); p.drain(time.Second) })
			prof := &profile{exec: executor.Noop, timeout: time.Minute, maxAttempts: 1, concurrency: c}
			b.RunParallel(func(pb *testing.PB) {
				j := &job{id: "t", rec: 1, prof: prof, attempt: 1}
				for pb.Next() {
					if err := p.execute(0, j, nil, 0); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
