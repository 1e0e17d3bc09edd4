package engine

import (
	"context"
	"slices"
	"time"

	"github.com/shardcron/shardcron/timerwheel"
)

// Staging: a burst's jobs built before it is due.
//
// When the loop is idle and its next tick with timers is near, it builds
// the jobs of that tick ahead (stage), so that at the boundary it hands
// them to the workers first and applies their bookkeeping to the records
// only then (releaseStaged): what stands between the second and a worker
// taking its fire is the wheel's Advance and a copy into the queue, not
// the fire policies.
//
// Staging changes nothing: the timers stay in the wheel, the records as
// they were. The staged jobs are used only if nothing happened in the loop
// since (no command but a wake, no completion, no release), and only if the
// Advance that reaches the tick delivers exactly the staged timers, in
// order: the fires released are then those the wheel releases, as they are
// released, before the dispatch point moves past them. Otherwise the stage
// is dropped and the tick is released as any other.
//
// Only a prefix of plain fires is staged: a task at rest (not running, not
// paused, its last fire not late), whose fire runs whatever its policies
// say. The first timer that is not one ends the stage.

// A burst is staged between stageAhead and stageLast before its tick:
// late enough that the last burst's completions are in, early enough that
// staging (some 30 ns a fire) ends before the tick.
const (
	stageAhead = 100 * time.Millisecond
	stageLast  = 10 * time.Millisecond
)

// sizeAhead is how far from the next tick the loop must be to size the
// stage (sizeStage): making a million fires' room ready took 106 to 440 ms
// on a virtual machine, page faults included, and must not delay the tick.
// A node whose ticks come every second has some 900 ms between them.
const sizeAhead = 500 * time.Millisecond

// stageTries bounds the stages built for one tick, so that a loop that
// keeps seeing events before a tick does not build it over and over: a
// stage of 65 536 fires costs some 2 ms, and three leave room for the last
// burst's completions to drop one or two.
const stageTries = 3

// Why a tick came with a stage that could not be used: stats.stageDrops
// counts each, so that a p99 above its usual can be read off the metrics.
const (
	dropChanged  = iota // something happened in the loop since the stage was built
	dropLate            // the tick came past the misfire threshold
	dropMismatch        // the Advance released other timers than those staged
	numStageDrops
)

var stageDropNames = [numStageDrops]string{"changed", "late", "mismatch"}

// stage is the staged tick.
type stage struct {
	at     int64                // when the tick is due, unix ns; 0: nothing staged
	minDue int64                // the earliest due time among the jobs
	epoch  uint64               // loop.epoch when built
	jobs   []job                // the staged fires' jobs, in the wheel's order
	peek   []timerwheel.Expired // the tick's timers as Peek saw them: jobs are their prefix
	tick   int64                // the tick the tries count for
	tries  int                  // stages built for tick (stageTries)
	lent   bool                 // the pool holds jobs' slice: the workers take the last stage
}

// stageNext stages the next tick with timers if it is due within
// stageAhead and the queue has room. Called only from the dispatch loop,
// when it is about to sleep.
//
// A stage holds as many fires as the queue has room for, or as its slice
// already holds, up to Config.Stage; the slice is sized to the tick while
// no tick is near (sizeStage).
func (l *loop) stageNext() {
	s := &l.staged
	if l.stageStands() {
		return // still good
	}
	s.drop()
	if s.lent {
		s.jobs = l.pool.spareSlice()
		s.lent = s.jobs == nil
	}
	now := l.cfg.Clock.Now().UnixNano()
	next, ok := l.wheel.NextDeadline()
	if !s.lent && (!ok || next-now > int64(sizeAhead)) {
		l.sizeStage()
	}
	if !ok || next-now < int64(stageLast) || next-now > int64(stageAhead) || len(l.unpushed) > 0 || l.fenced() {
		return
	}
	if s.tick != next {
		s.tick, s.tries = next, 0
	}
	if s.tries >= stageTries {
		return
	}
	free := l.pool.free()
	if free == 0 {
		return
	}
	s.tries++
	room := min(max(free, cap(s.jobs)), l.cfg.Stage)
	at, peek := l.wheel.Peek(room, s.peek[:0])
	s.peek = peek
	if at != next {
		return
	}
	s.minDue = at
	for _, e := range peek {
		if e.ID >= retryBase {
			break
		}
		r := l.tab.rec(e.ID)
		if r.flags&(flagLive|flagPaused|flagLate) != flagLive || r.running > 0 {
			break
		}
		s.minDue = min(s.minDue, e.At)
		s.jobs = append(s.jobs, l.jobOf(e.ID, r, l.profs.list[r.prof], r.next, e.At, kindSchedule))
	}
	if len(s.jobs) > 0 {
		s.at, s.epoch = at, l.epoch
	}
}

// sizeStage makes ready, while no tick is near, all that the next tick
// with timers needs, up to Config.Stage fires: the stage's jobs, its Peek,
// the Advance that releases it and the completions' batches. At the tick
// these cost their first use of fresh memory: a slice grown by appends
// copies itself over and over (26 to 138 ms at the second of a million
// tasks), and each page's first write faults it in. A slice grows by a
// quarter at least, so that a partition loaded in chunks does not
// reallocate it for each. Called with the stage empty.
func (l *loop) sizeStage() {
	s := &l.staged
	if cap(s.jobs) >= min(l.wheel.Len(), l.cfg.Stage) {
		return // no tick can need more: spare the loop a count of the next one at each idle pass
	}
	_, n := l.wheel.PeekLen()
	n = min(n, l.cfg.Stage)
	if cap(s.jobs) < n {
		n = max(n, min(cap(s.jobs)*5/4, l.cfg.Stage))
	}
	s.jobs = roomFor(s.jobs, n)
	s.peek = roomFor(s.peek, n)
	l.expired = roomFor(l.expired, n)
	l.pool.reserve(n)
}

// roomFor returns s, emptied, if it holds n; else an empty slice of
// capacity n, written once so that its pages fault in now, not at the tick
// (pool.newBatch).
func roomFor[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:0]
	}
	s = make([]T, n)
	clear(s)
	return s[:0]
}

// wakeEarly is how long before a staged tick the loop's timer wakes it,
// to wait out the rest in awaitStage: Go's timers sleep in whole
// milliseconds (the runtime's poller rounds a wait up to one), so a timer
// set for the tick fired 0.6 ms after it at the median and 1.1 ms at p99
// on an idle 2-core machine (BenchmarkWake), and up to 2.8 ms after it in
// a node sharing its process with etcd, where a burst of 100 000 fires
// takes some 3 ms from the second to the last fire taken. The loop's
// thread sleeps the rest; commands wait for as long.
const wakeEarly = 3 * time.Millisecond

// stageWake returns how long the loop may sleep: until the middle of the
// staging window when there is a tick to stage, until wakeEarly before
// the staged tick while it is ahead, or d.
func (l *loop) stageWake(d time.Duration) time.Duration {
	s := &l.staged
	next, ok := l.wheel.NextDeadline()
	if ok && l.stageStands() && s.at == next {
		if until := l.cfg.Clock.Until(time.Unix(0, next)); until > 0 {
			return min(d, max(until-wakeEarly, 0))
		}
		return d // past it: a tick the loop could not release at once (the lead) waits as any other
	}
	if !ok || s.tick == next && s.tries >= stageTries {
		return d
	}
	until := l.cfg.Clock.Until(time.Unix(0, next-int64(stageAhead+stageLast)/2))
	if until <= 0 {
		return d // in the window or past it: the loop stages before it sleeps
	}
	return min(d, until)
}

// awaitStage waits until the staged tick's instant when it is due within
// wakeEarly (stageWake woke the loop that early), in a sleep the kernel
// times to some 0.1 ms (sleepPrecise): the tick's release then starts on
// time. Commands wait for as long.
func (l *loop) awaitStage() {
	if !l.stageStands() {
		return
	}
	if d := l.cfg.Clock.Until(time.Unix(0, l.staged.at)); d > 0 && d <= wakeEarly {
		sleepPrecise(d)
	}
}

// stageStands reports whether a stage is built and nothing happened in the
// loop since.
func (l *loop) stageStands() bool { return l.staged.at != 0 && l.staged.epoch == l.epoch }

// drop forgets the staged jobs.
func (s *stage) drop() {
	clear(s.jobs)
	s.jobs = s.jobs[:0]
	s.at = 0
}

// useStage returns how many timers the next Advance should deliver to
// release the staged tick, or 0 when there is no usable stage for an
// Advance to target; it drops a stage that can no longer be used.
func (l *loop) useStage(target, now int64) int {
	s := &l.staged
	if s.at == 0 {
		return 0
	}
	switch {
	case s.epoch != l.epoch:
		// Stale: something happened in the loop since it was built. Before
		// its tick, the idle loop may build it again.
		if target >= s.at {
			l.stats.stageDrops[dropChanged].Add(1)
		}
		s.drop()
		return 0
	case target < s.at:
		return 0 // not due yet: kept for the Advance that reaches it
	case now-s.minDue > int64(l.cfg.MisfireThreshold):
		l.stats.stageDrops[dropLate].Add(1)
		s.drop() // late enough that some are misfires: release decides
		return 0
	}
	return len(s.jobs)
}

// releaseStaged hands the staged jobs to the pool if the wheel released
// exactly their timers, then applies to their records what release would
// have; it reports whether it did. Otherwise it drops the stage, and the
// caller releases the timers as usual.
func (l *loop) releaseStaged() bool {
	s := &l.staged
	if s.at == 0 || len(l.expired) == 0 {
		return false
	}
	defer s.drop()
	if len(l.released) > 0 || len(l.expired) != len(s.jobs) || !slices.Equal(l.expired, s.peek[:len(s.jobs)]) {
		// A stage is built only when released is empty (the loop was
		// about to sleep).
		l.stats.stageDrops[dropMismatch].Add(1)
		return false
	}
	l.stats.staged.Add(uint64(len(s.jobs)))
	if end, ok := l.pool.pushStaged(s.jobs); ok {
		l.segEnd, l.segLen = end, len(s.jobs)
		s.jobs, s.lent = nil, true // the pool's now
	} else {
		l.jobs, s.jobs = s.jobs, l.jobs[:0]
		l.pushJobs()
		l.jobs, s.jobs = s.jobs, l.jobs // the stage keeps its sized slice
	}
	l.stagedFires = len(l.expired) // dispatch appends them to released next
	return true
}

// segmentWaitPerFire bounds awaitSegment's wait: a noop fire takes a
// worker some 30 to 50 ns, an HTTP fire far longer, and those the bound
// leaves to the workers as before.
const segmentWaitPerFire = 100 * time.Nanosecond

// awaitSegment waits until the workers took the staged burst the loop
// pushed whole, or segmentWaitPerFire a fire, before the loop computes
// the burst's next times and takes its completions. Execution traces of
// a burst of 100 000 on two cores (bench burst --trace) showed the loop
// at that work for up to 8.8 ms on one core while one worker at a time
// took the burst on the other, the first up to 2.3 ms after the push: the
// thread of an idle core took that long to wake. Parked, the loop hands
// its own core to the worker it woke at once, and the workers have both.
func (l *loop) awaitSegment() {
	if l.segEnd == 0 {
		return
	}
	_ = l.pool.waitTaken(context.Background(), l.segEnd, time.Duration(l.segLen)*segmentWaitPerFire)
	l.segEnd = 0
}

// startStagedFires applies to the records of the staged fires released
// what admit would have when they were released. It is left until the rest
// of their burst went to the pool, and runs before anything reads those
// records: a command, a completion (neither is taken while released holds
// records) or a retry of one of their tasks (releaseRetry).
func (l *loop) startStagedFires() {
	for _, i := range l.released[:l.stagedFires] {
		r := l.tab.rec(i)
		r.lastFire = r.next
		startFire(r)
	}
	l.stagedFires = 0
}
