package engine

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
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
	// decided: a one-shot the previous owner held at this time before the
	// resume point (a read before a write since, or etcd's history of it:
	// decideOneShots, decideApplied), so that it decided the fire; a write
	// since changed something else.
	decided bool
	// put: a one-shot whose time is not after the resume point that its
	// previous owner never had at that time (written after the revision
	// up to which it had applied the partition's changes, as its release
	// or its watermark says: decideApplied), armed at its time as the
	// watch arms a put.
	put bool
	// modRev is the etcd revision the definition was last written at, when
	// read from etcd (0: unknown; the Badger cache keeps none).
	modRev int64
	// createRev is the etcd revision the task was created at (a delete
	// and a put again create it anew), when read from etcd or the cache,
	// or seen by the watch (0: unknown: cached by a version that did not
	// keep it, or changed since the partition's read).
	createRev int64
}

// Commands to the dispatch loop.
type (
	// loadCmd adds the tasks of an acquired partition, resuming after the
	// watermark resume (unix ns).
	loadCmd struct {
		part   int
		fence  int64
		resume int64
		rev    int64 // defs are the partition's tasks as of this revision
		// created is a revision at or after which every task of defs was
		// created (partState.created)
		created int64
		handed  handedTo
		defs    []taskDef
		first   bool // the first chunk of the partition: it becomes owned
		more    bool // chunks follow: the partition's tasks are not all armed
		done    chan struct{}
	}
	// eventsCmd applies task changes seen by a partition's watch. With
	// replace, upserts are the whole partition: tasks not among them go.
	eventsCmd struct {
		part    int
		upserts []taskDef
		deletes []string
		drops   []string // changed to what this node cannot read: disarmed, their history kept
		replace bool
		rev     int64         // the changes up to this revision are these and those applied before
		created int64         // the latest revision at which a task of upserts was created (partState.created)
		applied chan struct{} // closed once applied, when not nil
	}
	// releaseCmd takes partitions' tasks out of the wheel; the loop
	// answers with what to hand over (releaseParts).
	releaseCmd struct {
		parts     []int
		backfills map[string]int // their backfills' fires under way, by task id (stopBackfills)
		reply     chan release
	}
	// sealCmd seals a release (leavers.seal), first handing over the
	// queued fires of its partitions unrun when workers did not take them
	// in time (handOverQueued).
	sealCmd struct {
		rel    release
		queued unrunJobs
		late   bool // a graceful release: retries of attempts ending later go through etcd
		reply  chan struct{}
	}
	// takeOverCmd runs the fires a previous owner handed over.
	takeOverCmd struct {
		part  int
		fires []pendingFire
		// bfs are the backfills of the fires flagged backfill, by task
		// id (Engine.handedBackfill): their retries are the backfill's.
		bfs map[string]*backfillRun
	}
	// triggersCmd fires tasks once each, outside their schedule.
	triggersCmd struct {
		fires []triggerFire
		read  *triggerRead // the acquire's read these fires are; nil: the watch's events
		reply chan struct{}
	}
	// checkedCmd is checkTriggers' answer for fires: the revision at
	// which each one's task was created (0: it does not exist), read at
	// revision rev.
	checkedCmd struct {
		fires   []triggerFire
		created map[string]int64
		rev     int64
	}
	// unstartedCmd forgets the triggers whose jobs an undone acquire's
	// cut canceled before they started (loop.forgetUnstarted).
	unstartedCmd struct{ ends []triggerEnd }
	// throughCmd asks for the dispatch point.
	throughCmd struct{ reply chan int64 }
	// stateCmd asks for a task's state.
	stateCmd struct {
		id    string
		reply chan *task.State
	}
)

type partState struct {
	owned bool
	fence int64
	// loaded names the load that armed every task of the partition (its
	// last chunk's, from loop.loads); 0 while chunks are to come. A status
	// query covers the partitions loaded under one number throughout.
	loaded uint64
	// triggersRead is the revision of the acquire's read of the partition's
	// pending triggers: the watch's events up to it were in that read.
	triggersRead int64
	// applied is the revision up to which the partition's task changes
	// are armed here (its load's, once every chunk is in, then its
	// watch's; 0: not known): a release hands it over (handOver.applied),
	// and the watermark writes carry it (setApplied).
	applied int64
	// created is a revision at or after which every task of the
	// partition held here was created: the latest creation its load read
	// from etcd or the cache and its catch-up (the load's revision where
	// that is not known: prepared.created), then the latest its watch
	// brought (a put after a delete is one). A trigger key written before
	// it may be of a task deleted and put again since, and its task's
	// creation is read before it fires (checkTriggers); one written at or
	// after it is this task's, and fires at no cost.
	created int64
}

type retryState struct {
	rec, gen uint32
	sched    int64
	due      int64 // 0: the slot is free
	attempt  uint16
	part     uint16     // its task's partition (retryIn)
	pos      uint32     // its place in retryIn[part] while it waits
	handed   bool       // a former owner handed it on (loop.handed)
	listed   bool       // in a hand-over's list, not through etcd: runs elsewhere hold it (admitRetry)
	extra    *fireExtra // the fire's: its override, and its backfill, told when its last attempt ends
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
	loads   uint64 // loads done, which number partState.loaded
	retries []retryState
	rfree   []uint32
	// waiting counts the retries in retries by leavingKey(record,
	// generation): whether a task has one waiting is then a lookup, not a
	// scan of every retry (retryWaits).
	waiting map[uint64]uint32
	pending map[uint32]waitingFire // buffer_one: the fire waiting for the running one, by record
	paused  map[uint32]uint32      // the records the command under way paused, with their generations (skipPaused)
	health  map[uint32]taskHealth  // tasks that failed since the owner took them, by record (health.go)
	pool    *pool
	holds   *holds
	stats   *stats
	history *store.Store
	fenced  func() bool
	acked   *acked        // the watermark etcd last acknowledged
	ackCh   chan struct{} // signalled after each acknowledgement
	cmds    chan command
	alerts  *notifier // nil: no alerts (tests)

	through  int64 // every fire due up to here was released by the wheel and handed to the pool
	lowArm   int64 // earliest release time armed at or before the wheel's time and not yet released, or math.MaxInt64
	expired  []timerwheel.Expired
	jobs     []job
	unpushed []job // jobs the full queue did not take yet
	memo     [256]memoEntry

	// applieds records each change of a partition's applied revision,
	// counted by appliedSeq; throughSeq is the count when through last
	// moved, which the pool's marks carry (appliedLog).
	applieds   *appliedLog
	appliedSeq uint64
	throughSeq uint64

	// released are the records whose fires went to the pool since the
	// last rescheduleReleased, their next times not yet computed, and
	// releasedThrough the wheel time those batches reached: the dispatch
	// point moves there once they are rescheduled (rescheduleReleased).
	released        []uint32
	releasedThrough int64
	staged          stage  // the next tick's jobs, built ahead (stage.go)
	stagedFires     int    // released[:stagedFires] are staged fires not yet started on their records (startStagedFires)
	segEnd          uint64 // the pool's pushed count once the last staged burst went in whole; 0 once awaited (awaitSegment)
	segLen          int    // that burst's fires
	// epoch counts what changes records, the wheel or fences: a command
	// other than a wake (handle), a completion (complete) and a dispatch
	// that releases timers. A stage is good while it stands.
	epoch uint64

	ended chan endedTask // delete_after_fire tasks that ended, for the deleter (window.go)
	// endMarked are the records marked flagEndWaits, by partition, and
	// endChanged the partitions whose marks changed since they were last
	// published to endMarks, which the watermark writes carry
	// (publishEndWaits).
	endMarked  map[int]map[uint32]struct{}
	endChanged map[int]bool
	endMarks   *endWaitMarks

	// handed are the retries a former owner handed on (waitHandedRetry):
	// 0 while they wait, and once they came due here until when they are
	// remembered, so that one that comes again by another way (its key
	// and a list) is the retry that ran. A release forgets the waiting
	// ones with their slots, and those that ran with their records (a
	// record's generation changes).
	handed map[handedRetryKey]int64
	// retryIn are the slots of retries, by partition, bufferedIn the
	// records of fires of the schedule waiting for the running one
	// (buffer_one: pending), and retryChanged the partitions whose waiting
	// fires of either kind changed since they were last published to
	// retryMarks, which the watermark writes carry (publishRetries).
	retryIn      [][]uint32
	bufferedIn   [][]uint32
	retryListed  []int // the retries and fires each partition's list as last published holds
	retryChanged map[int]bool
	retryMarks   *retryMarks
	retriesAt    int64 // when publishRetries may run next (unix ns)
	// retrySeq is the publish of retryMarks last made, and retryBuilt,
	// by partition, the last that built its list (0: none): a fire of
	// the schedule that waited since before it was listed (waitingFire.since).
	retrySeq   uint64
	retryBuilt []uint64
	gated      []gatedJob // the jobs of listed waiting fires whose running one ended, in publish order (gate)

	// elsewhere are the runs on former owners, by record, each counted
	// in its record's running but those replaced, and the fires of its
	// backfill each holds against the backfill's concurrency
	// (elsewhere.go); unmark deletes markers, or marks them replaced, to
	// cancel their runs (nil in tests without etcd).
	elsewhere map[uint32][]elsewhereRun
	unmark    func(runs []elsewhereRun)

	// deletedRuns are the attempts under way of deleted tasks, by
	// leavingKey: each deletes its task's history again when it ends, as
	// it recorded itself after the delete took the rest. Those that end
	// after the loop stopped are Close's (deletedRunsDrained).
	deletedRuns map[uint64]deletedRuns
	deletes     sync.WaitGroup // the history deletes of deletedRuns, which Close waits for (deletedRunsDrained)

	early     earlyTriggers              // triggers that came before their task, until triggered's until, or whose task's creation is read (checkTriggers)
	checks    *triggerChecks             // the triggers whose task's creation checkTriggers reads
	triggered map[triggerKey]seenTrigger // triggers fired or early
	// releasedAgain are the keys of released partitions' triggers put
	// again while their fire waited or ran, with the revision of that
	// put, until the release's seal:
	// those whose fire was not handed over unrun (forgetTrigger) started
	// here, and go before the release commits (endReleasedAgain).
	releasedAgain map[triggerKey]int64
	sweepAt       int64 // when sweepTriggers next runs (unix ns)

	tasks    atomic.Int64 // records, for Stats
	retrying atomic.Int64 // retries waiting in the wheel for their backoff, for Stats
	owned    atomic.Int64 // partitions owned, for Stats
}

func newLoop(cfg Config, scheds *schedule.Table, p *pool, h *holds, st *stats, history *store.Store,
	fenced func() bool, acked *acked, ackCh chan struct{}, now int64) (*loop, error) {
	w, err := timerwheel.New(cfg.Tick, now)
	if err != nil {
		return nil, err
	}
	return &loop{
		cfg: cfg, wheel: w, tab: newTaskTable(cfg.Partitions), profs: newProfileTable(), scheds: scheds,
		parts: make([]partState, cfg.Partitions), pending: make(map[uint32]waitingFire), paused: make(map[uint32]uint32), waiting: make(map[uint64]uint32), health: make(map[uint32]taskHealth),
		pool: p, holds: h, stats: st, history: history, fenced: fenced, acked: acked, ackCh: ackCh,
		cmds: make(chan command, 256), through: now, applieds: &appliedLog{pool: p}, lowArm: math.MaxInt64, triggered: make(map[triggerKey]seenTrigger), checks: newBatchQueue[triggerFire](),
		handed: make(map[handedRetryKey]int64), elsewhere: make(map[uint32][]elsewhereRun), deletedRuns: make(map[uint64]deletedRuns),
		expired: make([]timerwheel.Expired, 0, cfg.BatchSize), jobs: make([]job, 0, cfg.BatchSize),
		ended: make(chan endedTask, endedQueue), endMarked: map[int]map[uint32]struct{}{}, endChanged: map[int]bool{}, endMarks: &endWaitMarks{},
		retryIn: make([][]uint32, cfg.Partitions), bufferedIn: make([][]uint32, cfg.Partitions), retryListed: make([]int, cfg.Partitions),
		retryBuilt: make([]uint64, cfg.Partitions), retryChanged: map[int]bool{}, retryMarks: &retryMarks{},
	}, nil
}

// run dispatches until ctx ends.
func (l *loop) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if len(l.endChanged) > 0 {
			l.publishEndWaits()
		}
		l.publishRetriesDue()
		l.openGate()
		l.service()
		l.awaitStage()
		if l.dispatch() {
			continue // more is due now: commands are served between batches
		}
		if len(l.released) > 0 {
			l.rescheduleReleased() // dispatch returned early
		}
		l.stageNext()
		l.sweepTriggers()
		timer.Reset(l.stageWake(l.sleep()))
		select {
		case <-ctx.Done():
			return
		case c := <-l.cmds:
			l.handle(c)
		case b := <-l.pool.done:
			l.complete(b)
		case <-l.pool.space:
		case <-l.ackCh:
		case <-timer.C:
		}
	}
}

// service handles what is waiting, without blocking and within bounds, so
// that a burst cannot starve commands or completions starve the burst.
//
// Within a burst (records released and not yet rescheduled) completions
// wait: the loop's time goes to handing the rest of the burst to the
// workers, and it takes the completions once the queue is full or the
// burst is out.
func (l *loop) service() {
	done := l.pool.done
	if len(l.released) > 0 {
		done = nil
	}
	for range 64 {
		select {
		case c := <-l.cmds:
			l.handle(c)
		case b := <-done:
			l.complete(b)
		default:
			return
		}
	}
}

// sleep returns how long the loop may sleep: until the next timer, and at
// most a watermark interval so that the watermark follows time when idle.
func (l *loop) sleep() time.Duration {
	d := l.cfg.WatermarkInterval
	reach, ok := l.reach(math.MaxInt64)
	// A full queue wakes the loop through pool.space.
	if len(l.unpushed) > 0 || l.fenced() || !ok || l.pool.free() == 0 {
		return d
	}
	// A timer beyond the lead waits for the next acknowledgement (ackCh).
	if next, ok := l.wheel.NextDeadline(); ok && next <= reach {
		d = min(d, l.cfg.Clock.Until(time.Unix(0, next)))
	}
	return max(d, 0)
}

// command is a request to the dispatch loop: run carries it out on the
// loop's goroutine. A command that answers does so on a channel of its own
// with room for the answer, so that run never blocks (Engine's request
// waits for it).
type command interface{ run(l *loop) }

func (c *loadCmd) run(l *loop)   { l.load(c); l.retryTriggers(c.defs) }
func (c *eventsCmd) run(l *loop) { l.events(c); l.retryTriggers(c.upserts) }
func (c *releaseCmd) run(l *loop) {
	c.reply <- l.releaseParts(c.parts, c.backfills)
}
func (c *sealCmd) run(l *loop) {
	if c.queued != unrunNone {
		l.handOverQueued(c.rel.hand, c.queued)
	}
	l.forgetUnstarted(c.rel.unstarted)
	l.endReleasedAgain(c.rel.hand)
	l.handTriggers(c.rel.hand)
	l.pool.leaving.seal(c.rel, c.late)
	c.reply <- struct{}{}
}
func (c *triggersCmd) run(l *loop)  { l.triggers(c); c.reply <- struct{}{} }
func (c *checkedCmd) run(l *loop)   { l.checked(c) }
func (c *unstartedCmd) run(l *loop) { l.forgetUnstarted(c.ends) }
func (c *stateCmd) run(l *loop)     { c.reply <- l.state(c.id) }
func (c *throughCmd) run(l *loop)   { c.reply <- l.through }
func (c *takeOverCmd) run(l *loop)  { l.takeOver(c) }
func (wakeCmd) run(*loop)           {}

// wakeCmd only wakes the loop, so that it looks at the clock again.
type wakeCmd struct{}

func (l *loop) handle(c command) {
	if len(l.released) > 0 {
		l.rescheduleReleased() // a command sees every record armed
	}
	if _, wake := c.(wakeCmd); !wake {
		l.epoch++
	}
	c.run(l)
	l.tasks.Store(int64(l.tab.n))
}

func (l *loop) load(c *loadCmd) {
	defer close(c.done)
	if c.first {
		if !l.parts[c.part].owned {
			l.owned.Add(1)
		}
		l.setApplied(c.part, 0)
		l.parts[c.part] = partState{owned: true, fence: c.fence}
		l.handedTriggers(c.part, c.handed.fired)
	}
	if !l.parts[c.part].owned {
		return // released while loading
	}
	l.parts[c.part].created = max(l.parts[c.part].created, c.created)
	for i := range c.defs {
		d := &c.defs[i]
		resume := c.resume
		// Not for a one-shot: whether it fires depends on when it was
		// written against the resume point, which stays the mark; an after
		// entry for its id is an earlier definition's fire.
		at, fired := c.handed.after[d.id]
		if w := d.prof.win; fired && (w == nil || !w.once) {
			resume = max(resume, at+int64(Delay(d.id, at, uint32(d.prof.jitter/time.Millisecond)))) // a release time
		} else {
			fired = false
		}
		l.upsert(d, resume, d.put)
		e, failed := c.handed.health[d.id]
		away := c.handed.elsewhere[d.id]
		waits := c.handed.endWaits[d.id]
		if !fired && !failed && away == nil && !waits {
			continue // the common case: no second lookup on the load path
		}
		i, r, ok := l.tab.lookup(d.id)
		if !ok {
			continue
		}
		if waits {
			// The previous owner's mark; a resume while the partition
			// changed hands left it on a task not paused, which the
			// acquire's look for ended tasks (endedCmd) takes.
			l.markEndWaits(i, r)
		}
		if away != nil {
			l.runElsewhere(i, r, away)
		}
		if fired {
			r.lastFire = max(r.lastFire, at) // a release before the wheel passes it hands it on again
		}
		if failed {
			l.adoptHealth(i, r, e) // before any fire of it here, in the same command
		}
	}
	l.skipPaused()
	if !c.more {
		l.loads++
		l.parts[c.part].loaded = l.loads
		l.setApplied(c.part, c.rev)
	}
}

// setApplied sets p's applied revision (0: none), and notes the change
// for the watermark writes (appliedLog). Called only from the dispatch
// loop.
func (l *loop) setApplied(p int, rev int64) {
	if l.parts[p].applied == rev {
		return
	}
	if l.parts[p].applied == 0 && l.endMarked[p] != nil {
		l.endChanged[p] = true // published without a revision to judge them by
	}
	if l.parts[p].applied == 0 && l.waitingIn(p) > 0 {
		l.retryChanged[p] = true // likewise
	}
	l.parts[p].applied = rev
	l.appliedSeq++
	l.applieds.note(l.appliedSeq, p, rev, l.throughSeq)
}

// upsert adds or updates a task. A new task resumes after resume; a task
// whose schedule changed resumes after now. put says the task was just
// written (a watch event): a one-shot whose time is past then fires by its
// misfire policy (armed in the past, released late) rather than never.
func (l *loop) upsert(d *taskDef, resume int64, put bool) {
	i, r, ok := l.tab.lookup(d.id)
	if !ok {
		var err error
		if i, r, err = l.tab.add(d.id, d.hash, d.part); err != nil {
			l.cfg.Logger.Error("a task cannot be armed", "task", d.id, "err", err)
			return
		}
		r.sched = d.sched
		r.prof = l.profs.ref(d.prof)
		r.jitter = uint32(d.prof.jitter / time.Millisecond)
		l.restartClock(i, r, l.cfg.Clock.Now().UnixNano())
		if d.paused {
			r.flags |= flagPaused
			return
		}
		l.arm(i, r, l.startOf(r, resume, put, d.decided))
		return
	}
	old, was := r.prof, l.profs.list[r.prof]
	sameWin := was.win.same(d.prof.win)
	r.prof = l.profs.ref(d.prof) // before unref, which would drop an unchanged profile
	l.profs.unref(old)
	l.markWrite(i, r, d, !sameTask(r.sched, was, d.sched, d.prof))
	wasPaused := r.flags&flagPaused != 0
	pause := d.paused && !wasPaused
	jitter := uint32(d.prof.jitter / time.Millisecond)
	if r.sched == d.sched && r.jitter == jitter && wasPaused == d.paused && sameWin {
		return // the timer stands
	}
	if r.sched != d.sched || wasPaused && !d.paused {
		l.restartClock(i, r, l.cfg.Clock.Now().UnixNano())
	}
	r.sched, r.jitter = d.sched, jitter
	if d.paused {
		r.flags |= flagPaused
		l.wheel.Cancel(i)
		r.next = 0
		if pause {
			l.paused[i] = r.gen // skipPaused, once the command's changes are in; it decides flagEdited
		}
		return
	}
	r.flags &^= flagPaused
	l.arm(i, r, l.startOf(r, max(l.through, l.cfg.Clock.Now().UnixNano()), put && (r.sched != d.sched || !sameWin), false))
	l.checkEndWaits(i, r)
}

// markWrite marks record i for what a write of its task, d, means for
// its delete after its last fire (delete_after_fire): changed says that
// the write changed the task (its schedule, window or profile but for
// when it was written), not only paused it. Called only from the
// dispatch loop, by upsert before it pauses r or changes its schedule.
func (l *loop) markWrite(i uint32, r *record, d *taskDef, changed bool) {
	// A new definition: only the end of a fire of it (or the next
	// acquire) hands it to the deleter, so an edit after the last fire
	// keeps the task.
	deleting := r.flags&flagDeleting != 0
	r.flags &^= flagDeleting
	pause := d.paused && r.flags&flagPaused == 0
	if changed {
		// An edit since the last fire ended wins, paused or not: the
		// resume keeps the task.
		l.clearEndWaits(i, r)
	}
	// A write that pauses the task edits it too when it changes it besides.
	edit := !pause || changed
	if deleting && !edit {
		// A pause alone beat the deleter, whose delete, conditioned on
		// the version it read, etcd refuses: the pause is not an edit
		// that wins, so the resume deletes the task, as one whose fire
		// ended while it was paused.
		l.markEndWaits(i, r)
	}
	if d.prof.deleteAfter && edit && (r.running > 0 || l.retryWaits(i, r)) {
		r.flags |= flagEdited // an edit while a fire runs, or waits to retry, wins: no delete after it
	}
}

func (l *loop) events(c *eventsCmd) {
	if c.applied != nil {
		defer close(c.applied)
	}
	if !l.parts[c.part].owned {
		return
	}
	armed := l.parts[c.part].applied // the changes armed here before these
	l.setApplied(c.part, max(armed, c.rev))
	l.parts[c.part].created = max(l.parts[c.part].created, c.created)
	now := l.cfg.Clock.Now().UnixNano()
	gone := map[uint32]goneTask{}
	for k := range c.upserts {
		d := &c.upserts[k]
		if i, r, ok := l.tab.lookup(d.id); ok && d.createRev > armed {
			// Created after the changes armed here: the record is of the
			// task before, deleted since, whose delete this put hides (a
			// replace's read after a compaction; the watch's events come
			// in order, apply). Deleted first, as apart: its waiting
			// retries, its fires queued and the retries of its attempts
			// under way are not the new task's, nor is its history.
			l.taskDeleted(i, r, d.id, d.createRev-1, gone)
			if l.history != nil {
				id := d.id
				l.deletes.Go(func() { l.deleteRunHistory(id) })
			}
		}
		l.upsert(d, max(l.through, now), true)
	}
	l.skipPaused()
	for _, id := range c.deletes {
		if i, r, ok := l.tab.lookup(id); ok {
			l.taskDeleted(i, r, id, c.rev, gone)
		}
	}
	for _, id := range c.drops { // as a replace's read leaves them out: their history stays
		if i, r, ok := l.tab.lookup(id); ok {
			gone[i] = goneTask{r.gen, c.rev}
			l.removeDeleted(i, r, c.rev)
		}
	}
	if c.replace {
		keep := make(map[string]bool, len(c.upserts))
		for i := range c.upserts {
			keep[c.upserts[i].id] = true
		}
		l.tab.eachIn(c.part, func(i uint32, r *record) {
			if !keep[l.tab.id(r)] {
				gone[i] = goneTask{r.gen, c.rev}
				l.removeDeleted(i, r, c.rev)
			}
		})
	}
	// The fires of deleted (or dropped) tasks that wait for a worker must
	// not run: a delete takes effect on the owner within a watch delivery
	// (invariant 6), not after a queue that a slow executor may hold for
	// long.
	// remove() does not drop them itself because a release removes whole
	// partitions and hands their queued fires over instead.
	if len(gone) > 0 {
		l.dropJobs(func(j *job) bool {
			g, ok := gone[j.rec]
			if !ok || j.gen != g.gen {
				return false
			}
			if j.kind == kindTrigger {
				l.droppedTrigger(j.triggerKey(), j.extra.override(), g.rev)
			}
			if bf := j.extra.backfill(); bf != nil {
				bf.end(j.sched) // a dropped task keeps its backfill, whose runner waits for it
			}
			l.deletedRunEnded(leavingKey(j.rec, j.gen), false) // dropped: it records nothing
			return true
		})
	}
}

// goneTask is a record an events command removed: the generation of its
// task, and the revision of the partition's changes that removed it.
type goneTask struct {
	gen uint32
	rev int64
}

// taskDeleted removes record i of task id, deleted by the partition's
// changes up to revision rev, and notes it in gone: its attempts under
// way delete the history they record as they end (deletedRuns). Called
// only from the dispatch loop.
func (l *loop) taskDeleted(i uint32, r *record, id string, rev int64, gone map[uint32]goneTask) {
	gone[i] = goneTask{r.gen, rev}
	if n := l.runningHere(i, r); n > 0 && l.history != nil {
		l.deletedRuns[leavingKey(i, r.gen)] = deletedRuns{id: id, n: n}
	}
	l.removeDeleted(i, r, rev)
}

// removeDeleted removes record i of a deleted task, or of one this node
// no longer reads, as of revision rev, ending the trigger buffered for it,
// if any (droppedTrigger). Called only from the dispatch loop.
func (l *loop) removeDeleted(i uint32, r *record, rev int64) {
	if w, ok := l.pending[i]; ok && w.kind == kindTrigger {
		l.droppedTrigger(l.triggerKeyOf(r, w.at), w.extra.override(), rev)
	}
	l.remove(i)
}

// dropJobs takes the jobs for which drop returns true out of those waiting
// for room or at the gate (gated), and marks those queued to be skipped by
// workers.
func (l *loop) dropJobs(drop func(j *job) bool) {
	keep := l.unpushed[:0]
	for i := range l.unpushed {
		if !drop(&l.unpushed[i]) {
			keep = append(keep, l.unpushed[i])
		}
	}
	clear(l.unpushed[len(keep):])
	l.unpushed = keep
	gated := l.gated[:0]
	for k := range l.gated {
		if !drop(&l.gated[k].job) {
			gated = append(gated, l.gated[k])
		}
	}
	clear(l.gated[len(gated):])
	l.gated = gated
	l.pool.dropQueued(drop)
}

func (l *loop) remove(i uint32) {
	r := l.tab.rec(i)
	l.wheel.Cancel(i)
	l.unbuffer(i)
	delete(l.health, i)
	l.forgetElsewhere(i)
	l.clearEndWaits(i, r)
	if l.retryWaits(i, r) {
		l.retryChanged[int(r.part)] = true // its retries run nothing now
	}
	l.profs.unref(r.prof)
	l.tab.remove(i, xxhash.Sum64String(l.tab.id(r)))
}

func (l *loop) state(id string) *task.State {
	i, r, ok := l.tab.lookup(id)
	if !ok {
		return nil
	}
	return l.stateOf(i, r, l.cfg.Clock.Now().UnixNano())
}

// deletedRuns are a deleted task's attempts under way.
type deletedRuns struct {
	id string
	n  int
}

// deletedRunEnded counts one attempt of a deleted task as ended, if k is
// one, and deletes the history it recorded when it ran. Called only from
// the dispatch loop.
func (l *loop) deletedRunEnded(k uint64, ran bool) {
	d, ok := l.deletedRuns[k]
	if !ok {
		return
	}
	if d.n--; d.n <= 0 {
		delete(l.deletedRuns, k)
	} else {
		l.deletedRuns[k] = d
	}
	if _, _, back := l.tab.lookup(d.id); ran && !back { // a task put again under the id keeps its records
		l.deletes.Go(func() { l.deleteRunHistory(d.id) })
	}
}

// deletedRunsDrained deletes the history of the deleted tasks whose
// attempts were still under way when the loop stopped: those ended in the
// pool's drain (handOnLeft), which has no task table to tell a deleted
// task from one put again under its id, so the loop's table, as it was
// when the loop stopped, tells it here. It deletes before it returns, so
// that Close leaves no such record for a restart to find, nor one that a
// delete the loop started was still to take. Called only by Close, once
// the loop has stopped and the pool drained.
func (l *loop) deletedRunsDrained() {
	for k, d := range l.deletedRuns {
		delete(l.deletedRuns, k)
		if _, _, back := l.tab.lookup(d.id); !back {
			l.deleteRunHistory(d.id)
		}
	}
	l.deletes.Wait()
}

// deleteRunHistory deletes the history of id, a deleted task: what its
// runs recorded as they ended, after the delete took the rest, or all of
// it when a put again hid the delete (events).
func (l *loop) deleteRunHistory(id string) {
	if err := l.history.DeleteHistory(context.Background(), id); err != nil && !errors.Is(err, store.ErrClosed) {
		l.cfg.Logger.Warn("deleting the history of a deleted task failed", "task", id, "err", err)
	}
}
