package engine

import (
	"context"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/timerwheel"
)

// retryBase splits the wheel's ids: below it a task record's next fire,
// from it a waiting retry.
const retryBase = 1 << 30

// taskDef is a task as the loop takes it: parsed and interned by the
// goroutine that read it from etcd or Badger, off the loop.
type taskDef struct {
	id     string
	hash   uint64 // xxhash64 of id; hash % P is the partition
	part   int
	sched  schedule.Handle
	prof   *profile
	paused bool
}

// Commands to the dispatch loop.
type (
	// loadCmd adds the tasks of an acquired partition, resuming after the
	// watermark resume (unix ns).
	loadCmd struct {
		part   int
		fence  int64
		resume int64
		defs   []taskDef
		first  bool // the first chunk of the partition: it becomes owned
		done   chan struct{}
	}
	// eventsCmd applies task changes seen by a partition's watch. With
	// replace, upserts are the whole partition: tasks not among them go.
	eventsCmd struct {
		part    int
		upserts []taskDef
		deletes []string
		replace bool
	}
	// releaseCmd takes partitions' tasks out of the wheel; the loop
	// answers with what to hand over (releaseParts).
	releaseCmd struct {
		parts []int
		reply chan release
	}
	// handOverQueuedCmd hands over the queued fires of released partitions
	// unrun, when workers did not take them in time (handOverQueued).
	handOverQueuedCmd struct {
		hand  map[int]*handOver
		reply chan struct{}
	}
	// takeOverCmd runs the fires a previous owner handed over.
	takeOverCmd struct {
		part  int
		fires []pendingFire
	}
	// triggerCmd fires a task once, outside its schedule.
	triggerCmd struct {
		part  int
		id    string
		at    int64
		reply chan bool // whether the loop took it: fired, or held for its task
	}
	// throughCmd asks for the dispatch point.
	throughCmd struct{ reply chan int64 }
	// stateCmd asks for a task's state.
	stateCmd struct {
		id    string
		reply chan *TaskState
	}
)

type partState struct {
	owned bool
	fence int64
}

type retryState struct {
	rec, gen uint32
	sched    int64
	attempt  uint16
}

// memoEntry caches one Next: in a burst a million tasks sharing a schedule
// share its next time.
type memoEntry struct {
	h        schedule.Handle
	from, to int64
}

// loop is the dispatch loop: the one goroutine that owns the wheel and the
// task table (state with many transitions belongs to one
// goroutine). Everything else talks to it through cmds.
type loop struct {
	cfg     Config
	wheel   *timerwheel.Wheel
	tab     *taskTable
	profs   *profileTable
	scheds  *schedule.Table
	parts   []partState
	retries []retryState
	rfree   []uint32
	pending map[uint32]int64 // buffer_one: the fire waiting for the running one, by record
	pool    *pool
	holds   *holds
	stats   *stats
	history *store.Store
	fenced  func() bool
	acked   *atomic.Int64 // the watermark etcd last acknowledged, unix ns; 0 before the first
	ackCh   chan struct{} // signalled after each acknowledgement
	cmds    chan command

	through  int64 // every fire due up to here was released by the wheel and handed to the pool
	lowArm   int64 // earliest release time armed at or before the wheel's time and not yet released, or math.MaxInt64
	expired  []timerwheel.Expired
	jobs     []job
	unpushed []job // jobs the full queue did not take yet
	memo     [256]memoEntry

	early     []earlyTrigger       // triggers that came before their task
	triggered map[triggerKey]int64 // triggers fired, to when they are remembered (unix ns)

	tasks atomic.Int64 // records, for Stats
	owned atomic.Int64 // partitions owned, for Stats
}

func newLoop(cfg Config, scheds *schedule.Table, p *pool, h *holds, st *stats, history *store.Store,
	fenced func() bool, acked *atomic.Int64, ackCh chan struct{}, now int64) *loop {
	w, err := timerwheel.New(cfg.Tick, now)
	if err != nil {
		panic(err) // Config.Validate checked the tick
	}
	return &loop{
		cfg: cfg, wheel: w, tab: newTaskTable(cfg.Partitions), profs: newProfileTable(), scheds: scheds,
		parts: make([]partState, cfg.Partitions), pending: make(map[uint32]int64),
		pool: p, holds: h, stats: st, history: history, fenced: fenced, acked: acked, ackCh: ackCh,
		cmds: make(chan command, 256), through: now, lowArm: math.MaxInt64, triggered: make(map[triggerKey]int64),
		expired: make([]timerwheel.Expired, 0, cfg.BatchSize), jobs: make([]job, 0, cfg.BatchSize),
	}
}

// run dispatches until ctx ends.
func (l *loop) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.service()
		if l.dispatch() {
			continue // more is due now: commands are served between batches
		}
		timer.Reset(l.sleep())
		select {
		case <-ctx.Done():
			return
		case c := <-l.cmds:
			l.handle(c)
		case b := <-l.pool.done:
			l.complete(&b)
		case <-l.pool.space:
		case <-l.ackCh:
		case <-timer.C:
		}
	}
}

// service handles what is waiting, without blocking and within bounds, so
// that a burst cannot starve commands or completions starve the burst.
func (l *loop) service() {
	for range 64 {
		select {
		case c := <-l.cmds:
			l.handle(c)
		case b := <-l.pool.done:
			l.complete(&b)
		default:
			return
		}
	}
}

// sleep returns how long the loop may sleep: until the next timer, and at
// most a watermark interval so that the watermark follows time when idle.
func (l *loop) sleep() time.Duration {
	d := l.cfg.WatermarkInterval
	acked := l.acked.Load()
	// A full queue wakes the loop through pool.space.
	if len(l.unpushed) > 0 || l.fenced() || acked == 0 || l.pool.free() == 0 {
		return d
	}
	// A timer beyond the lead waits for the next acknowledgement (ackCh).
	if next, ok := l.wheel.NextDeadline(); ok && next <= acked+int64(l.cfg.Lead) {
		d = min(d, l.cfg.Clock.Until(time.Unix(0, next)))
	}
	return max(d, 0)
}

// dispatch hands one batch of due fires to the pool, and reports whether
// more may be due at once.
func (l *loop) dispatch() bool {
	if l.fenced() {
		return false // the coordinator drops the partitions
	}
	if len(l.unpushed) > 0 {
		k := l.pool.push(l.unpushed)
		l.unpushed = l.unpushed[k:]
		if len(l.unpushed) > 0 {
			return false
		}
		l.publish()
	}
	acked := l.acked.Load()
	if acked == 0 {
		return false // no watermark recorded yet: no lead to run on
	}
	now := l.cfg.Clock.Now().UnixNano()
	// The bounded lead: never run more than Lead past what etcd has
	// acknowledged, so a successor repeats at most that much.
	target := min(now, acked+int64(l.cfg.Lead))
	free := l.pool.free()
	if free == 0 {
		return false
	}
	limit := min(l.cfg.BatchSize, free)
	swept := target >= l.wheel.Now() // the wheel's current tick is released first
	l.expired = l.wheel.Advance(target, limit, l.expired[:0])
	full := len(l.expired) == limit
	if swept && !full {
		// The current tick went out whole, with every timer armed into it
		// at or before the wheel's time.
		l.lowArm = math.MaxInt64
	}
	// The wheel releases whole ticks: every timer due up to the start of
	// its current tick is out, unless the batch was cut, in which case the
	// current tick may hold more, some due before its start.
	through := l.wheel.Now()
	if full {
		through -= int64(l.cfg.Tick)
	}
	// Dispatch first, then compute next times (docs/design.md, facts measured).
	l.jobs = l.jobs[:0]
	for _, e := range l.expired {
		l.release(e, now)
	}
	l.pushJobs()
	for _, e := range l.expired {
		if e.ID < retryBase {
			l.reschedule(e.ID)
		}
	}
	// Only now is the dispatch point known: a next fire armed at or before
	// the wheel's time (a fire_all catch-up chain, jitter close to the
	// period, a dispatch running late) is released by the next Advance,
	// and the point must not claim it before.
	l.through = max(l.through, min(through, l.lowArm-1))
	l.publish()
	return full
}

// publish lets the node watermark follow the dispatch point once every
// job dispatched before it is in the queue.
//
// A fire waiting in pending (buffer_one) does not hold it back: it is in
// flight with the fire it waits for, and holding the watermark would hold
// the bounded lead, and with it every task of the node, for as long as that
// fire runs. A release hands it over (releaseParts). A partition armed from
// a resume point behind the dispatch point is released at the next
// dispatch: an acquire waits until the watermark passes the point where it
// armed its partition before it names its session in the checkpoint (see
// Engine.nameSession).
func (l *loop) publish() {
	if len(l.unpushed) == 0 {
		l.pool.publish(l.through)
	}
}

// pushJobs hands l.jobs to the pool after any jobs still waiting for room,
// so that the queue stays in order; what does not fit waits in unpushed.
func (l *loop) pushJobs() {
	if len(l.unpushed) > 0 {
		l.unpushed = append(l.unpushed, l.jobs...)
	} else if k := l.pool.push(l.jobs); k < len(l.jobs) {
		l.unpushed = append(l.unpushed, l.jobs[k:]...)
	}
	clear(l.jobs)
	l.jobs = l.jobs[:0]
	l.publish()
}

// release turns one expired timer into a job, applying the misfire and
// concurrency policies.
func (l *loop) release(e timerwheel.Expired, now int64) {
	if e.ID >= retryBase {
		l.releaseRetry(e.ID - retryBase)
		return
	}
	r := l.tab.rec(e.ID)
	if r.flags&flagLive == 0 || r.flags&flagPaused != 0 {
		return
	}
	prof := l.profs.list[r.prof]
	sched := r.next
	if late := now - e.At; late > int64(l.cfg.MisfireThreshold) {
		sched = l.misfire(r, prof, sched, now)
		if sched == 0 {
			return
		}
	}
	r.lastFire = sched
	l.admit(e.ID, r, prof, sched, e.At, kindSchedule)
}

// misfire applies the task's misfire policy to a fire released late, and
// returns the scheduled time to fire now, or 0 for none. Missed times are
// those up to now and none older than the catch-up window. It leaves r.next
// where the schedule resumes from.
//
// A misfire is a decision about the past as a whole, so it looks up to now,
// past the bounded lead: after a pause longer than the misfire threshold,
// a crash right after the catch-up fire may repeat that one fire on the
// next owner (its misfire policy makes the same decision), but not the
// missed ones it stands for.
func (l *loop) misfire(r *record, prof *profile, sched, now int64) int64 {
	r.misfires++
	l.stats.misfires.Add(1)
	fire, resume := misfireFire(prof.misfire, l.scheds.Get(r.sched), sched, now, prof.catchup)
	if fire != sched {
		// sched stays the first missed time: when fire_all's window begins
		// later, or fire_once picks a later time, this one is recorded.
		l.record(r, sched, 1, statusMisfired, "missed by more than the misfire threshold ("+string(prof.misfire)+")")
	}
	r.next = resume
	return fire
}

// admit applies the concurrency policy and queues a job for the fire.
func (l *loop) admit(i uint32, r *record, prof *profile, sched, due int64, kind uint8) {
	_, waiting := l.pending[i]
	switch admit(prof.concurrency, int(r.running), waiting, false) {
	case admitSkip:
		why := "the previous fire is still running (concurrency forbid)"
		if waiting {
			why = "a fire is already waiting for the running one (concurrency buffer_one)"
		}
		l.skip(r, sched, 1, why)
		return
	case admitBuffer:
		l.pending[i] = sched
		return
	case admitReplace:
		// The running fire is canceled, and so are those still waiting for
		// a worker: only the newest runs.
		l.pool.cancelRunning(i)
		l.pool.replaceQueued(i, r.gen)
		for k := range l.unpushed {
			if u := &l.unpushed[k]; u.rec == i && u.gen == r.gen {
				u.replaced = true
			}
		}
	}
	r.running++
	if kind != kindRetry {
		r.fires++
	}
	l.jobs = append(l.jobs, job{
		id: l.tab.id(r), prof: prof, sched: sched, due: due,
		fence: l.parts[r.part].fence, rec: i, gen: r.gen, attempt: 1, kind: kind, part: r.part,
	})
}

func (l *loop) skip(r *record, sched int64, attempt uint16, why string) {
	r.skipped++
	l.stats.skipped.Add(1)
	l.stats.execs[statusSkipped].Add(1)
	l.record(r, sched, int(attempt), statusSkipped, why)
}

// record writes an execution record for a fire that did not run.
func (l *loop) record(r *record, sched int64, attempt int, status uint8, why string) {
	if l.history == nil {
		return
	}
	now := l.cfg.Clock.Now()
	l.history.RecordKeep(store.Execution{
		TaskID: l.tab.id(r), ScheduledAt: time.Unix(0, sched).UTC(), StartedAt: now, FinishedAt: now,
		Attempt: attempt, Node: l.cfg.NodeID, Status: statusNames[status], Error: why,
	}, l.profs.list[r.prof].keepFor(status))
}

// reschedule puts record i back in the wheel at its next fire after r.next.
func (l *loop) reschedule(i uint32) {
	r := l.tab.rec(i)
	if r.flags&flagLive == 0 || r.flags&flagPaused != 0 || r.next == 0 {
		return
	}
	n := l.nextMemo(r.sched, r.next)
	l.arm(i, r, n)
}

// arm schedules record i's fire at scheduled time n (0: none).
func (l *loop) arm(i uint32, r *record, n int64) {
	r.next = n
	if n == 0 {
		l.wheel.Cancel(i)
		return
	}
	due := n + l.delay(r, n)
	l.wheel.Schedule(i, due)
	if due <= l.wheel.Now() {
		l.lowArm = min(l.lowArm, due) // the dispatch point stays before it (dispatch)
	}
}

// delay is the task's jitter for the fire at n: deterministic per (id, n),
// so every node computes the same.
func (l *loop) delay(r *record, n int64) int64 {
	if r.jitter == 0 {
		return 0
	}
	h := xxhash.Sum64String(l.tab.id(r)) ^ uint64(n)*0x9e3779b97f4a7c15
	return int64(h%uint64(r.jitter)) * int64(time.Millisecond)
}

func (l *loop) nextMemo(h schedule.Handle, from int64) int64 {
	m := &l.memo[(uint64(h)*0x9e3779b97f4a7c15^uint64(from))>>56]
	if m.h == h && m.from == from {
		return m.to
	}
	to := next(l.scheds.Get(h), from)
	*m = memoEntry{h: h, from: from, to: to}
	return to
}

// firstAfter returns the first fire of r whose release (with jitter) is
// after w: the fire to resume with after the watermark w.
func (l *loop) firstAfter(r *record, w int64) int64 {
	h := l.scheds.Get(r.sched)
	n := next(h, w-int64(r.jitter)*int64(time.Millisecond))
	for n != 0 && n+l.delay(r, n) <= w {
		n = next(h, n)
	}
	return n
}

func (l *loop) releaseRetry(slot uint32) {
	rs := l.retries[slot]
	l.rfree = append(l.rfree, slot)
	r := l.tab.rec(rs.rec)
	if r.flags&flagLive == 0 || r.gen != rs.gen {
		return
	}
	l.admitRetry(rs.rec, r, rs.sched, rs.attempt)
}

// admitRetry queues a retry. While another fire of the task runs, only
// allow lets it run alongside: forbid and buffer_one keep fires apart and
// replace lets the newer fire win, so the retry is skipped.
func (l *loop) admitRetry(i uint32, r *record, sched int64, attempt uint16) {
	prof := l.profs.list[r.prof]
	if admit(prof.concurrency, int(r.running), false, true) == admitSkip {
		l.skip(r, sched, attempt, "a newer fire of the task is running (concurrency "+string(prof.concurrency)+")")
		return
	}
	r.running++
	l.jobs = append(l.jobs, job{
		id: l.tab.id(r), prof: prof, sched: sched, due: l.cfg.Clock.Now().UnixNano(),
		fence: l.parts[r.part].fence, rec: i, gen: r.gen, attempt: attempt, kind: kindRetry, part: r.part,
	})
}

// complete applies finished attempts: counters, retries, buffered fires.
func (l *loop) complete(b *completionBatch) {
	for _, c := range b.c[:b.n] {
		r := l.tab.rec(c.rec)
		if r.flags&flagLive == 0 || r.gen != c.gen {
			continue // the task is gone
		}
		r.running--
		r.status = c.status
		prof := l.profs.list[r.prof]
		if c.status == statusFailed || c.status == statusTimeout {
			r.failures++
			if int(c.attempt) < prof.maxAttempts {
				l.retry(c.rec, r, prof, c.sched, c.attempt+1)
			}
		}
		if at, waiting := l.pending[c.rec]; waiting && r.running == 0 {
			delete(l.pending, c.rec)
			l.admit(c.rec, r, prof, at, l.cfg.Clock.Now().UnixNano(), kindSchedule)
		}
	}
	if len(l.jobs) > 0 {
		l.pushJobs()
	}
}

// retry waits in the wheel, never in a worker: exponential backoff with
// jitter, capped.
func (l *loop) retry(i uint32, r *record, prof *profile, sched int64, attempt uint16) {
	backoff := prof.backoff << min(attempt-2, 30)
	if backoff <= 0 || backoff > prof.maxBackoff {
		backoff = prof.maxBackoff
	}
	// Between half and all of the backoff, so that failed fires spread.
	wait := backoff/2 + rand.N(backoff/2+1)
	var slot uint32
	if n := len(l.rfree); n > 0 {
		slot = l.rfree[n-1]
		l.rfree = l.rfree[:n-1]
	} else {
		slot = uint32(len(l.retries))
		l.retries = append(l.retries, retryState{})
	}
	l.retries[slot] = retryState{rec: i, gen: r.gen, sched: sched, attempt: attempt}
	l.wheel.Schedule(retryBase+slot, l.cfg.Clock.Now().UnixNano()+int64(wait))
}

// command is a request to the dispatch loop: run carries it out on the
// loop's goroutine. A command that answers does so on a channel of its own
// with room for the answer, so that run never blocks (Engine's request
// waits for it).
type command interface{ run(l *loop) }

func (c *loadCmd) run(l *loop)   { l.load(c); l.retryTriggers() }
func (c *eventsCmd) run(l *loop) { l.events(c); l.retryTriggers() }
func (c *releaseCmd) run(l *loop) {
	c.reply <- l.releaseParts(c.parts)
}
func (c *handOverQueuedCmd) run(l *loop) { l.handOverQueued(c.hand); c.reply <- struct{}{} }
func (c *triggerCmd) run(l *loop)        { c.reply <- l.trigger(c) }
func (c *stateCmd) run(l *loop)          { c.reply <- l.state(c.id) }
func (c *throughCmd) run(l *loop)        { c.reply <- l.through }
func (c *takeOverCmd) run(l *loop)       { l.takeOver(c) }
func (wakeCmd) run(*loop)                {}

// wakeCmd only wakes the loop, so that it looks at the clock again.
type wakeCmd struct{}

func (l *loop) handle(c command) {
	c.run(l)
	l.tasks.Store(int64(l.tab.n))
}

func (l *loop) load(c *loadCmd) {
	defer close(c.done)
	if c.first {
		if !l.parts[c.part].owned {
			l.owned.Add(1)
		}
		l.parts[c.part] = partState{owned: true, fence: c.fence}
	}
	if !l.parts[c.part].owned {
		return // released while loading
	}
	for i := range c.defs {
		l.upsert(&c.defs[i], c.resume)
	}
}

// upsert adds or updates a task. A new task resumes after resume; a task
// whose schedule changed resumes after now.
func (l *loop) upsert(d *taskDef, resume int64) {
	i, r, ok := l.tab.lookup(d.id)
	if !ok {
		i, r = l.tab.add(d.id, d.hash, d.part)
		r.sched = d.sched
		r.prof = l.profs.ref(d.prof)
		r.jitter = uint32(d.prof.jitter / time.Millisecond)
		if d.paused {
			r.flags |= flagPaused
			return
		}
		l.arm(i, r, l.firstAfter(r, resume))
		return
	}
	old := r.prof
	r.prof = l.profs.ref(d.prof) // before unref, which would drop an unchanged profile
	l.profs.unref(old)
	jitter := uint32(d.prof.jitter / time.Millisecond)
	wasPaused := r.flags&flagPaused != 0
	if r.sched == d.sched && r.jitter == jitter && wasPaused == d.paused {
		return // the timer stands
	}
	r.sched, r.jitter = d.sched, jitter
	if d.paused {
		r.flags |= flagPaused
		l.wheel.Cancel(i)
		r.next = 0
		return
	}
	r.flags &^= flagPaused
	l.arm(i, r, l.firstAfter(r, max(l.through, l.cfg.Clock.Now().UnixNano())))
}

func (l *loop) events(c *eventsCmd) {
	if !l.parts[c.part].owned {
		return
	}
	now := l.cfg.Clock.Now().UnixNano()
	for i := range c.upserts {
		l.upsert(&c.upserts[i], max(l.through, now))
	}
	gone := map[uint32]uint32{} // record -> generation of the deleted tasks
	for _, id := range c.deletes {
		if i, r, ok := l.tab.lookup(id); ok {
			gone[i] = r.gen
			l.remove(i)
		}
	}
	if c.replace {
		keep := make(map[string]bool, len(c.upserts))
		for i := range c.upserts {
			keep[c.upserts[i].id] = true
		}
		l.tab.eachIn(c.part, func(i uint32, r *record) {
			if !keep[l.tab.id(r)] {
				gone[i] = r.gen
				l.remove(i)
			}
		})
	}
	// The fires of deleted tasks that wait for a worker must not run: a
	// delete takes effect on the owner within a watch delivery (invariant
	// 6), not after a queue that a slow executor may hold for long.
	// remove() does not drop them itself because a release removes whole
	// partitions and hands their queued fires over instead.
	if len(gone) > 0 {
		l.dropJobs(func(j *job) bool {
			gen, ok := gone[j.rec]
			return ok && j.gen == gen
		})
	}
}

// dropJobs takes the jobs for which drop returns true out of those waiting
// for room, and marks those queued to be skipped by workers.
func (l *loop) dropJobs(drop func(j *job) bool) {
	keep := l.unpushed[:0]
	for i := range l.unpushed {
		if !drop(&l.unpushed[i]) {
			keep = append(keep, l.unpushed[i])
		}
	}
	clear(l.unpushed[len(keep):])
	l.unpushed = keep
	l.pool.dropQueued(drop)
}

func (l *loop) remove(i uint32) {
	r := l.tab.rec(i)
	l.wheel.Cancel(i)
	delete(l.pending, i)
	l.profs.unref(r.prof)
	l.tab.remove(i, xxhash.Sum64String(l.tab.id(r)))
}

// triggerWait is how long a trigger waits for its task to be loaded, and
// how long a fired trigger is remembered.
const triggerWait = 10 * time.Second

type triggerKey struct {
	id string
	at int64
}

type earlyTrigger struct {
	triggerCmd
	until int64 // dropped after this (unix ns)
}

// trigger fires a trigger once. The trigger watch and a partition's watch
// are separate streams: a trigger written right after its task's put can
// come before the task, and one can come while its partition loads, so it
// waits for its task (triggerWait at most). The watch and an acquire's
// read of pending triggers can both deliver one trigger: it fires once.
func (l *loop) trigger(c *triggerCmd) bool {
	if !l.parts[c.part].owned || l.fenced() {
		return false // its key stays for the owner's load to find
	}
	if _, fired := l.triggered[triggerKey{c.id, c.at}]; fired {
		return true
	}
	for i := range l.early {
		if l.early[i].id == c.id && l.early[i].at == c.at {
			return true
		}
	}
	now := l.cfg.Clock.Now().UnixNano()
	if !l.triggerNow(c, now) {
		l.early = append(l.early, earlyTrigger{triggerCmd: *c, until: now + int64(triggerWait)})
	}
	l.retryTriggers()
	return true
}

// triggerNow fires c if the loop holds its task, and reports whether it did.
func (l *loop) triggerNow(c *triggerCmd, now int64) bool {
	if !l.parts[c.part].owned {
		return false
	}
	i, r, ok := l.tab.lookup(c.id)
	if !ok {
		return false
	}
	l.triggered[triggerKey{c.id, c.at}] = now + int64(triggerWait)
	l.admit(i, r, l.profs.list[r.prof], c.at, now, kindTrigger)
	l.pushJobs()
	return true
}

// retryTriggers fires the early triggers whose task came, drops those that
// waited too long, and forgets fired ones past triggerWait.
func (l *loop) retryTriggers() {
	if len(l.early) == 0 && len(l.triggered) == 0 {
		return
	}
	now := l.cfg.Clock.Now().UnixNano()
	keep := l.early[:0]
	for _, t := range l.early {
		if !l.triggerNow(&t.triggerCmd, now) && now < t.until {
			keep = append(keep, t)
		}
	}
	clear(l.early[len(keep):])
	l.early = keep
	for k, until := range l.triggered {
		if now >= until {
			delete(l.triggered, k)
		}
	}
}

func (l *loop) state(id string) *TaskState {
	_, r, ok := l.tab.lookup(id)
	if !ok {
		return nil
	}
	s := &TaskState{
		Owner:      l.cfg.NodeID,
		LastStatus: statusNames[r.status],
		Fires:      uint64(r.fires),
		Failures:   uint64(r.failures),
		Misfires:   uint64(r.misfires),
		Skipped:    uint64(r.skipped),
	}
	if r.next != 0 && r.flags&flagPaused == 0 {
		s.NextFireAt = time.Unix(0, r.next).UTC()
	}
	if r.lastFire != 0 {
		s.LastFireAt = time.Unix(0, r.lastFire).UTC()
	}
	return s
}
