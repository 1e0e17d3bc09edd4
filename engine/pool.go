package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// Kinds of job.
const (
	kindSchedule = iota // a fire of the task's schedule
	kindRetry           // a later attempt of a failed fire
	kindTrigger         // a fire asked for through the API
	kindBackfill        // a fire of a backfill (backfill.go)
	kindDropped         // handed over with its partition: skipped by workers
)

// Statuses of an attempt, as in the execution record of docs/api.md.
const (
	statusNone = iota
	statusOK
	statusFailed
	statusTimeout
	statusSkipped
	statusMisfired
	statusCanceled
	numStatus
)

var statusNames = [numStatus]string{"", task.ExecutionOK, task.ExecutionFailed, task.ExecutionTimeout,
	task.ExecutionSkipped, task.ExecutionMisfired, task.ExecutionCanceled}

// job is one attempt of a fire, handed from the dispatch loop to a worker.
type job struct {
	id       string // points into the task table's id chunks
	prof     *profile
	sched    int64 // scheduled time, unix ns: with id, the fire's identity
	due      int64 // when the wheel released it (sched + jitter), for the lag
	fence    int64
	rec      uint32
	gen      uint32
	attempt  uint16
	part     uint16
	kind     uint8
	replaced bool // a newer fire of a replace task came first: cancel unrun
	// unstarted: a cut canceled it before it started (track), and a
	// trigger's key stays, for the partition's next owner.
	unstarted bool
	extra     *fireExtra // what a trigger's, a retry's or a backfill's fire carries; nil: none
}

// fireExtra is what a fire carries beyond a plain one of its task's
// schedule: a trigger's override and the put of its key it fires (every
// trigger's fire has one), or the backfill the fire is of. It is behind
// one pointer, nil for a plain fire, because every fire of a burst is a
// job, queued or staged (a million at the second of a 1 M fleet): a plain
// fire's job holds 8 bytes for it, not 24, and allocates nothing. A fire's
// jobs, completions and retries share it: never changed once made.
type fireExtra struct {
	over *task.Override // a trigger's body or payload for this fire and its retries; nil: the task's
	bf   *backfillRun   // the backfill this fire is of, told when it ends; nil: none
	trig int64          // a trigger's: the revision of the put of its key it fires, or of the retry key that hands its first attempt on
}

// extraOf is the extra of a fire with override over, of backfill bf: nil,
// a plain fire's, for neither.
func extraOf(over *task.Override, bf *backfillRun) *fireExtra {
	if over == nil && bf == nil {
		return nil
	}
	return &fireExtra{over: over, bf: bf}
}

// handedExtra is the extra of a retry a former owner handed on with
// override over, of backfill bf; trig is the revision of the trigger whose
// first attempt it is (registry.Retry.Trigger, pendingFire.Trigger), 0 for
// none.
func handedExtra(over *task.Override, bf *backfillRun, trig int64) *fireExtra {
	if trig == 0 {
		return extraOf(over, bf)
	}
	return &fireExtra{over: over, bf: bf, trig: trig}
}

// triggersFirst reports whether attempt of x's fire is a trigger's first,
// which runs while its task is paused, as every trigger's fire does: also
// when a stopping node met it unrun and handed it on (leavers.toEtcd,
// registry.Retry.Trigger), for its next owner to run as a retry.
func (x *fireExtra) triggersFirst(attempt uint16) bool {
	return attempt == 1 && x != nil && x.trig != 0
}

// override is the body or payload x's fire sends; nil: the task's.
func (x *fireExtra) override() *task.Override {
	if x == nil {
		return nil
	}
	return x.over
}

// backfill is the backfill x's fire is of; nil: none.
func (x *fireExtra) backfill() *backfillRun {
	if x == nil {
		return nil
	}
	return x.bf
}

// completion is what the loop learns of a finished job. It holds no
// pointer, so that the collector scans none of a batch's completions (a
// burst of a million fires fills 16 000 batches): what needs one is in the
// batch's extras.
type completion struct {
	sched   int64
	rec     uint32
	gen     uint32
	attempt uint16
	kind    uint8
	status  uint8
	extra   int32 // 1 + its index in the batch's extras; 0: none
}

// completionExtra is what a completion carries beyond a plain fire.
type completionExtra struct {
	err    string     // the error of a failed or timed-out attempt
	extra  *fireExtra // the fire's, for its retries: with no backfill once the fire is over (its worker ended it)
	handed bool       // its worker handed its retry on, its partition's release sealed (leavers)
	// unstarted: a cut canceled it before it started (job.unstarted): a
	// trigger's fire has not ended, and a key put again while the job was
	// held is that fire's, which stays with it (loop.complete).
	unstarted bool
}

// completionBatch travels by pointer, from the pool's free list: the
// channel's room then costs 8 bytes a batch, not 1.5 KB. Its only pointer
// comes first, so that the collector scans 8 of its bytes.
type completionBatch struct {
	extras []completionExtra
	n      int
	c      [chunkMax]completion
}

// add appends job j's completion with status st and error why; handed:
// its retry was handed on (leavers).
func (b *completionBatch) add(j *job, st uint8, why string, handed bool) {
	c := completion{sched: j.sched, rec: j.rec, gen: j.gen, attempt: j.attempt, kind: j.kind, status: st}
	x := j.extra
	if x.backfill() != nil && final(j, st) {
		x = extraOf(x.over, nil)
	}
	if why != "" || x != nil || handed || j.unstarted {
		b.extras = append(b.extras, completionExtra{err: why, extra: x, handed: handed, unstarted: j.unstarted})
		c.extra = int32(len(b.extras))
	}
	b.c[b.n] = c
	b.n++
}

// extra returns what c carries beyond a plain fire.
func (b *completionBatch) extra(c *completion) completionExtra {
	if c.extra == 0 {
		return completionExtra{}
	}
	return b.extras[c.extra-1]
}

// mark says that once the first end jobs ever pushed have been taken,
// every fire the wheel released up to through has been taken, and so has
// every fire due by through of the task changes the loop had armed when
// its dispatch point reached through: the first seq changes of the
// partitions' applied revisions (appliedLog).
type mark struct {
	end     uint64
	through int64
	seq     uint64
}

// pool is the bounded worker pool: a ring of queued jobs, taken by workers
// in chunks, and the node's watermark.
//
// The watermark W is the wheel time up to which every released fire has
// been taken by a worker, not merely queued (docs/design.md): a fire lost in a
// crash while queued is then fired again by the next owner.
type pool struct {
	node    string
	clock   Clock
	workers int
	history *store.Store // nil: no history
	okKept  bool         // the history may keep a success: else none is built (run)
	stats   *stats
	fenced  func() bool
	done    chan *completionBatch // to the loop
	batches chan *completionBatch // emptied, for the workers: a free list
	made    atomic.Int64          // batches allocated
	quit    chan struct{}         // closed when the loop is gone: completions are dropped

	execCtx    context.Context // parent of every execution; canceled at the end of a drain (stopExecutions)
	execCancel context.CancelCauseFunc

	mu      sync.Mutex // guards everything down to closing
	ready   sync.Cond  // jobs were pushed, the queue was reset, or the pool is closing
	q       []job
	head, n int
	// seg is a staged burst handed over whole (pushStaged): queued ahead
	// of the ring, whose jobs were all pushed after it; seg[segHead:] wait.
	// spare is a taken segment, emptied, for the loop's next stage.
	seg     []job
	segHead int
	spare   []job
	marks   []mark
	mhead   int
	seq     uint64 // the seq of the mark the watermark was last moved to
	pushed  uint64
	taken   uint64
	waiters []takenWaiter
	closing bool

	watermark atomic.Int64
	space     chan struct{} // signalled when a worker frees room in a full queue

	runMu   sync.Mutex // guards running, runSeq, inHand, fenceCut, partCut and unstarted, and orders the changes of cuts
	running map[uint64]runningFire
	runSeq  uint64
	// inHand is, by worker, the job it took of a task whose policy keeps
	// its fires apart, until it starts (track) or ends unrun (leaveHand):
	// a replace then marks it (replaceRunning), as it marks a queued job
	// (replaceQueued), so that it does not run beside the newer fire, nor
	// is handed on unrun by the node's stop to run after it.
	inHand []handJob
	// cuts is how many times cutRunning or cutPartition ran: changed
	// under runMu, so that track sees a cut either before or after it
	// records a run; atomic, as take reads it under mu.
	cuts atomic.Uint64
	// fenceCut is the cut (its count of cuts) cutRunning last made, and
	// partCut, by partition, the one cutPartition last made: a run taken
	// before either is canceled as it starts, the runs of other partitions
	// go on.
	fenceCut uint64
	partCut  []uint64
	// unstarted are the puts of the keys of triggers whose jobs workers
	// held (inHand) when a cut came: not started, their keys stay for the
	// partitions' next owners, and the drop that follows a fence, or the
	// undo of an acquire, takes them (takeUnstarted), so that the loop
	// does not take them for fires of this node. One a worker at most.
	unstarted []triggerEnd

	failures failureLog   // the latest failed attempts, for GET /v1/failures
	chains   *chainQueue  // the triggers of fires that ended with targets (chain.go)
	ends     *triggerEnds // the keys of triggers whose fire started or ended unrun (trigger.go)
	leaving  *leavers     // the tasks of releases with attempts under way (handover.go)

	wg sync.WaitGroup
}

// runningFire is an execution of a task whose concurrency policy keeps
// its fires apart: whatever would let another fire of the task start
// beside it cancels it (replaceRunning, which spares a backfill's fires),
// and a fence cancels them all (cutRunning), an undone acquire those of
// its partition (cutPartition).
type runningFire struct {
	rec, gen uint32 // the generation too: a deleted task's run may outlive it, and its record be reused
	part     uint16
	backfill bool // a backfill's fire: a replace fire spares it (replaceRunning)
	cancel   context.CancelCauseFunc
}

// handJob is a job a worker holds and has not started (pool.inHand).
type handJob struct {
	rec, gen uint32
	held     bool // a job is held
	replaced bool // a replace came since the take
	// end is, for a trigger's job, the put of its key, which goes once
	// the job starts or ends unrun here (letGo); a fence or an undone
	// acquire that cuts the job first leaves the key for the partition's
	// next owner (track). Zero: not a trigger's, or moved to unstarted.
	end triggerEnd
}

// Why the engine cancels a run, in its execution record's error.
var (
	errReplaced = errors.New("replaced by a newer fire (concurrency replace)")
	errFenced   = errors.New("its node's etcd session ended (fenced, cut off from etcd, or its lease lost): the next owner's fires must not start beside it")
	errStopped  = errors.New("its node stopped before it ended: the drain timeout passed, or the stop was hurried")
	errUndone   = errors.New("its partition's acquire was undone (etcd did not answer a read after the load): the partition's next acquire fires its time again")
)

// doneRoom is how many completion batches wait for the loop: a full
// queue's or stage's worth of noop jobs, taken in chunks, and a batch per
// worker twice over, so that workers keep taking a burst while the loop is
// still handing it out or computing its next times (it takes completions
// once the queue is full or the burst is out: loop.service).
func doneRoom(cfg Config) int {
	return max(cfg.Queue, cfg.Stage)/chunkMax + 2*cfg.Workers
}

func newPool(cfg Config, history *store.Store, st *stats, fenced func() bool, start int64) *pool {
	p := &pool{
		node:    cfg.NodeID,
		clock:   cfg.Clock,
		workers: cfg.Workers,
		history: history,
		okKept:  history != nil && history.KeepsSuccesses(),
		stats:   st,
		fenced:  fenced,
		done:    make(chan *completionBatch, doneRoom(cfg)),
		quit:    make(chan struct{}),
		q:       make([]job, cfg.Queue),
		space:   make(chan struct{}, 1),
		running: make(map[uint64]runningFire),
		inHand:  make([]handJob, cfg.Workers),
		partCut: make([]uint64, cfg.Partitions),
		chains:  newChainQueue(cfg.Logger.With("node", cfg.NodeID)),
		ends:    newTriggerEnds(),
	}
	p.leaving = newLeavers(cfg.Clock, p.chains)
	p.ready.L = &p.mu
	// Every batch there is can wait here: one per worker, the done
	// channel's, the loop's.
	p.batches = make(chan *completionBatch, doneRoom(cfg)+cfg.Workers+1)
	p.watermark.Store(start)
	p.execCtx, p.execCancel = context.WithCancelCause(context.Background())
	p.wg.Add(cfg.Workers)
	for w := range cfg.Workers {
		go p.work(w)
	}
	return p
}

// depth returns how many jobs wait for a worker.
func (p *pool) depth() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queued()
}

// free returns how many jobs the queue can take now.
func (p *pool) free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.room()
}

// room returns how many jobs the queue can take: none while a staged
// segment longer than the queue waits. Called with mu held.
func (p *pool) room() int { return max(0, len(p.q)-p.queued()) }

// queued returns how many jobs wait, in the segment and the ring. Called
// with mu held.
func (p *pool) queued() int { return len(p.seg) - p.segHead + p.n }

// at returns the i-th waiting job, the segment's first. Called with mu
// held.
func (p *pool) at(i int) *job {
	s := len(p.seg) - p.segHead
	if i < s {
		return &p.seg[p.segHead+i]
	}
	return &p.q[(p.head+i-s)%len(p.q)]
}

// pop removes the first waiting job. Called with mu held.
func (p *pool) pop() {
	if p.segHead < len(p.seg) {
		p.seg[p.segHead] = job{}
		p.segTaken(1)
		return
	}
	p.q[p.head] = job{}
	p.head = (p.head + 1) % len(p.q)
	p.n--
}

// pushStaged queues jobs whole, without copying them, when nothing waits;
// it reports whether it did (the caller then pushes them as usual), and
// the count of jobs ever pushed once they are in (waitTaken). They
// may be more than the queue holds (Config.Stage). The pool owns jobs from
// then on: it empties them as workers take them, and hands the slice back
// through spareSlice.
func (p *pool) pushStaged(jobs []job) (end uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queued() != 0 || len(jobs) == 0 {
		return 0, false
	}
	p.seg, p.segHead = jobs, 0
	p.pushed += uint64(len(jobs))
	p.wake(jobs)
	return p.pushed, true
}

// spareSlice returns an emptied slice that held a staged segment, or nil.
func (p *pool) spareSlice() []job {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.spare
	p.spare = nil
	return s
}

// push queues jobs and returns how many fit; the caller pushes the rest
// again, in order.
func (p *pool) push(jobs []job) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := min(len(jobs), p.room())
	for i := range k {
		p.q[(p.head+p.n+i)%len(p.q)] = jobs[i]
	}
	p.n += k
	p.pushed += uint64(k)
	p.wake(jobs[:k])
	return k
}

// wake wakes as many workers as jobs, just queued, need, not all of them:
// a broadcast per batch would wake hundreds of workers to find nothing.
// Called with mu held.
func (p *pool) wake(jobs []job) {
	n := len(jobs)
	if n > 0 && jobs[0].prof.noop {
		// Noop jobs use CPU only: a worker per core, each passing the
		// rest on as it takes (take), keeps every core busy without a
		// crowd waking to wait for the lock.
		n = min((n+chunkMax-1)/chunkMax, runtime.GOMAXPROCS(0))
	}
	for range min(n, p.workers) {
		p.ready.Signal()
	}
}

// publish says that every fire the wheel released up to through is among
// the jobs pushed so far: once workers took those, the watermark is
// through. seq is the count of applied revision changes noted when the
// dispatch point reached through (mark).
func (p *pool) publish(through int64, seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := len(p.marks); m > p.mhead && p.marks[m-1].end == p.pushed {
		p.marks[m-1].through = max(p.marks[m-1].through, through)
		p.marks[m-1].seq = max(p.marks[m-1].seq, seq)
	} else {
		p.marks = append(p.marks, mark{end: p.pushed, through: through, seq: seq})
	}
	p.advanceMarks()
}

// marked returns the watermark with the seq of its mark: the applied
// revisions that go with it (appliedLog).
func (p *pool) marked() (int64, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.watermark.Load(), p.seq
}

// seqs returns, in order, the seqs that marked may return from now on
// until the loop publishes again: its mark's and those of the marks in
// flight (appliedLog.compact).
func (p *pool) seqs() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := make([]uint64, 0, len(p.marks)-p.mhead+2) // and room for the loop's
	s = append(s, p.seq)
	for _, m := range p.marks[p.mhead:] {
		s = append(s, m.seq)
	}
	return s
}

// advanceMarks moves the watermark over the marks whose jobs are all
// taken. Called with mu held.
func (p *pool) advanceMarks() {
	for p.mhead < len(p.marks) && p.marks[p.mhead].end <= p.taken {
		p.watermark.Store(p.marks[p.mhead].through)
		p.seq = p.marks[p.mhead].seq
		p.mhead++
	}
	if p.mhead == len(p.marks) {
		p.marks, p.mhead = p.marks[:0], 0
	}
}

// takenWaiter is closed once workers took end jobs.
type takenWaiter struct {
	end uint64
	ch  chan struct{}
}

// pushedCount returns how many jobs were ever pushed.
func (p *pool) pushedCount() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pushed
}

// errNotTaken: workers did not take the jobs waitTaken waited for in time.
var errNotTaken = errors.New("engine: queued jobs not taken in time")

// waitTaken waits until workers took the first end jobs ever pushed, and
// returns nil, or errNotTaken once d passed, or ctx's error once it ended
// first. Dropped jobs count as taken.
func (p *pool) waitTaken(ctx context.Context, end uint64, d time.Duration) error {
	p.mu.Lock()
	if p.taken >= end {
		p.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	p.waiters = append(p.waiters, takenWaiter{end: end, ch: ch})
	p.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return errNotTaken
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wakeWaiters closes the waiters whose jobs were all taken. Called with mu
// held.
func (p *pool) wakeWaiters() {
	keep := p.waiters[:0]
	for _, w := range p.waiters {
		if w.end <= p.taken {
			close(w.ch)
		} else {
			keep = append(keep, w)
		}
	}
	clear(p.waiters[len(keep):])
	p.waiters = keep
}

// reset drops every queued job: the node is fenced and they must not run.
// The watermark stays where it was, so the next owner fires them.
func (p *pool) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.head, p.n = 0, 0
	if p.seg != nil {
		clear(p.seg)
		p.spare, p.seg, p.segHead = p.seg[:0], nil, 0
	}
	p.taken = p.pushed
	p.wakeWaiters()
	p.marks, p.mhead = p.marks[:0], 0
	clear(p.q) // let go of profiles and ids
	p.ready.Broadcast()
}

// replaceQueued marks the queued jobs of record rec (generation gen) as
// replaced: workers cancel them without running them. A backfill's fires
// stay queued: a replace fire spares them (replaceRunning).
func (p *pool) replaceQueued(rec, gen uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.queued() {
		if j := p.at(i); j.rec == rec && j.gen == gen && j.extra.backfill() == nil {
			j.replaced = true
		}
	}
}

// dropQueued marks the queued jobs for which drop returns true: workers
// take them in turn, so the watermark's accounting stays in order, but
// skip them. drop runs under the pool's lock.
func (p *pool) dropQueued(drop func(j *job) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.queued() {
		j := p.at(i)
		if j.kind != kindDropped && drop(j) {
			j.kind = kindDropped
		}
	}
}

// drain lets the workers finish the queue and what runs, then stop. After d
// it cancels the executions still running (and hands on unrun any taken
// after that: stopUnrun), and waits for the workers. It reports whether d
// passed first.
func (p *pool) drain(d time.Duration) (cut bool) {
	timer := time.AfterFunc(d, p.stopExecutions)
	p.mu.Lock()
	p.closing = true
	p.ready.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
	cut = !timer.Stop()
	p.stopExecutions()
	for len(p.done) > 0 { // nothing sends any more
		p.handOnLeft(<-p.done)
	}
	return cut
}

// stopExecutions cancels every execution still running, their errors
// saying why (errStopped): an http attempt's record said only "http:
// context canceled". A job taken after it is not run (stopUnrun).
func (p *pool) stopExecutions() { p.execCancel(errStopped) }

// loopGone tells the workers that the loop is gone, and applies the
// completions it left unread (handOnLeft).
func (p *pool) loopGone() {
	close(p.quit)
	for len(p.done) > 0 {
		p.handOnLeft(<-p.done)
	}
}

// handOnLeft applies what the loop would of b, a batch of completions the
// loop, stopped before the workers drained (Close), never reads. It hands
// on the retries of the failed attempts: a worker that found its attempt's
// release not yet sealed left the retry to the loop (leavers), then sent
// the completion after the release was sealed and committed, and the loop
// gone. And it counts the attempts of leavers as ended, so that the marker
// of a run past its release goes when the run ends (elsewhere.go), not
// with the lease once every other run drained. The record a deleted
// task's run wrote is Close's to delete, once the drain is over
// (loop.deletedRunsDrained).
func (p *pool) handOnLeft(b *completionBatch) {
	for i := range b.c[:b.n] {
		c := &b.c[i]
		p.leaving.handOn(c, b.extra(c))
		p.leaving.ended(leavingKey(c.rec, c.gen))
	}
}

// replaceRunning cancels the running executions of record rec of
// generation gen for a newer fire of a replace task: its schedule's,
// triggers' and their retries', not a backfill's. A backfill is outside
// the task's concurrency policy and promised each of its times once, and
// it counts a canceled fire as done: canceled, each of its fires that ran
// longer than the schedule's interval would be lost.
func (p *pool) replaceRunning(rec, gen uint32) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	for k, r := range p.running {
		if r.rec == rec && r.gen == gen && !r.backfill {
			r.cancel(errReplaced)
			delete(p.running, k)
		}
	}
	for w := range p.inHand {
		if h := &p.inHand[w]; h.held && h.rec == rec && h.gen == gen {
			h.replaced = true
		}
	}
}

// replaceable reports whether a replace may cancel j once a worker took
// it (inHand): a fire of a task whose policy keeps its fires apart, but a
// backfill's, and a noop's, which runs at once.
func replaceable(j *job) bool {
	return !j.prof.noop && j.prof.concurrency != task.ConcurrencyAllow && j.extra.backfill() == nil
}

// hold notes j, which worker w just took when there had been cuts cuts,
// in inHand, if it is replaceable. A trigger's job taken across a fence
// (its take counted the cuts before it) will not start (track): its put
// goes to unstarted at once. Called with p.mu held, before the take lets
// it go.
func (p *pool) hold(w int, j *job, cuts uint64) {
	if !replaceable(j) {
		return
	}
	p.runMu.Lock()
	defer p.runMu.Unlock()
	h := handJob{rec: j.rec, gen: j.gen, held: true}
	if j.kind == kindTrigger {
		if p.fenceCut > cuts {
			p.unstarted = append(p.unstarted, j.triggerEnd())
		} else {
			h.end = j.triggerEnd()
		}
	}
	p.inHand[w] = h
}

// leaveHand ends worker w's hold of its job, and reports whether a
// replace came since the take.
func (p *pool) leaveHand(w int) bool {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	return p.letGo(w)
}

// letGo is leaveHand with runMu held. The job starts or ends unrun here:
// a trigger's key goes.
func (p *pool) letGo(w int) bool {
	h := p.inHand[w]
	p.inHand[w] = handJob{}
	if h.end.rev != 0 {
		p.ends.add(h.end)
	}
	return h.replaced
}

// notStarted returns the keys of the triggers whose jobs have not
// started, for a release's seal (handTriggers): those workers hold
// (inHand), which a fence may still cut, leaving their keys, and those a
// fence cut already (unstarted), which came first when the session ended
// during the release.
func (p *pool) notStarted() []triggerKey {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var ks []triggerKey
	for _, h := range p.inHand {
		if h.end.rev != 0 {
			ks = append(ks, h.end.triggerKey)
		}
	}
	for _, u := range p.unstarted {
		ks = append(ks, u.triggerKey)
	}
	return ks
}

// takeUnstarted returns the puts of the keys of triggers of partition
// part (of every partition when part is negative) whose jobs a cut
// canceled before they started, and forgets them. Called once the cut
// ran: taken under the pool's lock too, it comes after the hold of a job
// that a take in progress at a fence took.
func (p *pool) takeUnstarted(part int) []triggerEnd {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runMu.Lock()
	defer p.runMu.Unlock()
	var u []triggerEnd
	p.unstarted = slices.DeleteFunc(p.unstarted, func(e triggerEnd) bool {
		if part < 0 || e.part == part {
			u = append(u, e)
			return true
		}
		return false
	})
	return u
}

// cutRunning cancels every run of a task whose policy keeps its fires
// apart, and those taken before it that have not started yet: the node is
// fenced, and the next owner, which knows nothing of them, may start the
// tasks' next fires once the session's lease ends, as after a crash. Runs
// of tasks that allow overlaps go on. It returns how many runs it canceled.
func (p *pool) cutRunning() int { return p.cut(-1) }

// cutPartition is cutRunning for the runs of partition part alone, whose
// acquire was undone after it armed the partition: the acquire put the
// previous checkpoint back and wrote no marker of them (elsewhere.go), so
// the partition's next acquire, here or on another node, fires the same
// times again beside them.
func (p *pool) cutPartition(part int) int { return p.cut(part) }

// cut cancels the runs of partition part, of every partition when part is
// negative (a fence).
func (p *pool) cut(part int) int {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	c, cause := p.cuts.Add(1), errUndone
	if part < 0 {
		p.fenceCut, cause = c, errFenced
	} else {
		p.partCut[part] = c
	}
	// A job held now will not start (track). An undone acquire sealed its
	// release first, which dropped the partition's queued jobs of tasks
	// kept apart under the pool's lock: its takes ended before.
	for w := range p.inHand {
		if h := &p.inHand[w]; h.end.rev != 0 && (part < 0 || h.end.part == part) {
			p.unstarted = append(p.unstarted, h.end)
			h.end = triggerEnd{}
		}
	}
	n := 0
	for k, r := range p.running {
		if part < 0 || int(r.part) == part {
			r.cancel(cause)
			delete(p.running, k)
			n++
		}
	}
	return n
}

// track records j's run, which worker w took when cutRunning and
// cutPartition had run cuts times, under the key it returns, for untrack.
// A run taken before the last cut of its partition, or before a replace of
// its task (inHand), is canceled at once, recorded under no key, and 0
// returned. A trigger's key goes as its job starts, or as a replace
// cancels it; one a cut cancels has not started, and its key stays for
// the partition's next owner, which fires it: deleted at the take, it
// was fired by nobody.
func (p *pool) track(w int, j *job, cancel context.CancelCauseFunc, cuts uint64) (key uint64) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	if p.cuts.Load() != cuts {
		var cause error
		switch {
		case p.fenceCut > cuts:
			cause = errFenced
		case p.partCut[j.part] > cuts:
			cause = errUndone
		}
		if cause != nil {
			p.inHand[w] = handJob{}
			j.unstarted = true
			cancel(cause)
			return 0
		}
	}
	if p.letGo(w) {
		cancel(errReplaced)
		return 0
	}
	p.runSeq++
	p.running[p.runSeq] = runningFire{rec: j.rec, gen: j.gen, part: j.part, backfill: j.extra.backfill() != nil, cancel: cancel}
	return p.runSeq
}

// untrack forgets the run that track recorded under key.
func (p *pool) untrack(key uint64) {
	p.runMu.Lock()
	delete(p.running, key)
	p.runMu.Unlock()
}

// chunkMax is the most noop jobs a worker takes at once: they finish in
// nanoseconds, so one take per chunk keeps the lock off the fire path.
// Any other job is taken alone, so that each one starts when it is taken.
const chunkMax = 64

func (p *pool) work(w int) {
	defer p.wg.Done()
	var buf [chunkMax]job
	out := p.batch()
	var t tally
	for {
		k, cuts := p.take(w, buf[:])
		if k == 0 {
			return
		}
		held := k == 1 && replaceable(&buf[0]) // take held it (inHand)
		now := p.clock.Now()
		for i := range k {
			j := &buf[i]
			if j.kind == kindDropped {
				if held {
					p.leaveHand(w)
				}
				*j = job{}
				continue
			}
			var st uint8
			var why string
			handed := false
			switch {
			case j.replaced:
				if held {
					p.leaveHand(w)
				}
				st = p.cancelUnrun(j, now, &t)
				if bf := j.extra.backfill(); bf != nil {
					bf.end(j.sched)
				}
			case !j.prof.noop && context.Cause(p.execCtx) == errStopped:
				// A noop has no context for the stop to cancel: it runs.
				// One a replace came for since the take runs nowhere.
				if held && p.leaveHand(w) {
					st = p.cancelUnrun(j, now, &t)
					break
				}
				st, handed = p.stopUnrun(j, now, &t)
			default:
				t.observeLag(now.UnixNano() - j.due)
				var stop stopAt
				st, why, stop = p.run(w, j, now, &t, cuts)
				// The task's partition may have gone with a release sealed
				// since the job was taken: then its retry goes to etcd. So
				// does that of an attempt the node's stop canceled, which
				// comes after every release (Close), and so does this very
				// attempt when the stop came before its executor started.
				end, next := attemptFailed, j.attempt+1
				switch stop {
				case stoppedRunning:
					end = attemptStopped
				case stoppedBefore:
					end, next = attemptStopped, j.attempt
				}
				handed = (stop != notStopped || !final(j, st)) &&
					p.leaving.retry(leavingKey(j.rec, j.gen), j.sched, next, j.extra, end, byWorker) ||
					stop == stoppedBefore && p.leaving.unrun(j)
				if bf := j.extra.backfill(); stop != notStopped && !handed && bf != nil {
					bf.end(j.sched) // no retry runs on: its fire is over
				}
			}
			out.add(j, st, why, handed)
			if out.n == len(out.c) {
				out = p.complete(out)
			}
			*j = job{}
		}
		t.flush(p.stats)
		out = p.complete(out)
	}
}

// take waits for jobs and copies up to len(buf) of them for worker w; 0
// means the pool is closing and empty. A fenced node takes nothing. It
// returns, too, how many cuts there had been: a fence, or an undo of their
// partition's acquire, after the take cuts the runs of its jobs (track).
func (p *pool) take(w int, buf []job) (int, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A fenced node waits for the reset that drops its queue. The cuts
	// are counted before the check: a fence just after it cuts the runs
	// of what this takes.
	cuts := p.cuts.Load()
	for p.queued() == 0 || p.fenced() {
		if p.closing && (p.queued() == 0 || p.fenced()) {
			return 0, 0
		}
		p.ready.Wait()
		cuts = p.cuts.Load()
	}
	k := 0
	limit := 1
	if p.at(0).prof.noop {
		limit = len(buf) // a chunk takes microseconds: no worker holds others' jobs for long
	}
	full := p.queued() >= len(p.q)
	if limit > 1 && p.segHead < len(p.seg) {
		k = p.takeSegment(buf)
	}
	for k < limit && p.queued() > 0 {
		j := p.at(0)
		if k > 0 && !j.prof.noop {
			break
		}
		buf[k] = *j
		p.pop()
		k++
	}
	for i := range buf[:k] {
		if j := &buf[i]; j.kind == kindTrigger && !replaceable(j) {
			p.ends.add(j.triggerEnd()) // it starts (or is canceled unrun): its key goes
		}
	}
	if k == 1 {
		p.hold(w, &buf[0], cuts) // a job that may be replaced is taken alone; its key goes as it starts (letGo)
	}
	p.taken += uint64(k)
	p.advanceMarks()
	if len(p.waiters) > 0 {
		p.wakeWaiters()
	}
	if p.queued() > 0 {
		p.ready.Signal() // pass the rest on: push woke only as many as it guessed
	}
	if full {
		select {
		case p.space <- struct{}{}:
		default:
		}
	}
	return k, cuts
}

// takeSegment copies into buf the staged segment's first run of noop jobs,
// up to len(buf), and empties their places with one copy and one clear:
// workers take a burst under the pool's lock, and job by job that lock
// was held for a microsecond a chunk. Called with mu held and a segment
// waiting whose first job is a noop.
func (p *pool) takeSegment(buf []job) int {
	run := p.seg[p.segHead:min(len(p.seg), p.segHead+len(buf))]
	k := 1
	for k < len(run) && run[k].prof.noop {
		k++
	}
	copy(buf, run[:k])
	clear(run[:k])
	p.segTaken(k)
	return k
}

// segTaken moves the segment's head past k jobs taken (and emptied), and
// keeps the slice for the next stage once the whole segment is taken.
// Called with mu held.
func (p *pool) segTaken(k int) {
	p.segHead += k
	if p.segHead == len(p.seg) {
		p.spare, p.seg, p.segHead = p.seg[:0], nil, 0
	}
}

// complete sends out's completions to the loop, and returns the batch
// to fill next.
func (p *pool) complete(out *completionBatch) *completionBatch {
	if out.n == 0 {
		return out
	}
	// Once the loop is gone, its channel may still have room: a batch put
	// there would wait for the end of the drain. A worker past this check
	// as the loop goes may still put it there (the select below picks
	// either ready case): drain applies it then.
	select {
	case <-p.quit:
		p.handOnLeft(out)
		out.empty()
		return out
	default:
	}
	select {
	case p.done <- out:
		return p.batch()
	case <-p.quit:
		p.handOnLeft(out)
		out.empty()
		return out
	}
}

// batch returns an empty completion batch.
func (p *pool) batch() *completionBatch {
	select {
	case b := <-p.batches:
		return b
	default:
		return p.newBatch()
	}
}

// newBatch allocates a batch and writes to all of it: the first write to
// fresh memory faults its page in, some 10 µs a page on a virtual machine,
// and a burst's batches allocated as its fires complete made the first
// burst of a million take four times as long as the next.
func (p *pool) newBatch() *completionBatch {
	p.made.Add(1)
	b := new(completionBatch)
	clear(b.c[:])
	return b
}

// reserve allocates, ahead of a burst of fires, the batches its
// completions need (see newBatch), up to the free list's room. Batches are
// never freed: a node keeps those of its largest burst, 1.75 KB allocated
// for each 64 fires. Called from the loop's goroutine, as recycle is: no
// one else puts into the free list, so the sends never block.
func (p *pool) reserve(fires int) {
	want := min(int64(fires/chunkMax+p.workers), int64(cap(p.batches)))
	for p.made.Load() < want && len(p.batches) < cap(p.batches) {
		p.batches <- p.newBatch()
	}
}

// recycle empties a batch the loop has applied, for the workers' next.
func (p *pool) recycle(b *completionBatch) {
	b.empty()
	select {
	case p.batches <- b:
	default: // the free list holds every batch made; one beyond it goes to the collector
	}
}

// empty drops the batch's completions, and the pointers they hold.
func (b *completionBatch) empty() {
	clear(b.extras)
	b.extras = b.extras[:0]
	b.n = 0
}

// cancelUnrun records a job of a replace task whose newer fire came before
// it started.
func (p *pool) cancelUnrun(j *job, now time.Time, t *tally) uint8 {
	t.exec(statusCanceled)
	if p.history != nil {
		p.history.RecordKeep(execution(j.id, p.node, j.sched, int(j.attempt), statusCanceled, now, now,
			"replaced by a newer fire before it started (concurrency replace)"), j.prof.keepFor(statusCanceled))
	}
	return statusCanceled
}

// stopUnrun records a job taken once the node's stop had canceled the
// executions (the drain timeout, Hurry): not run, it hands on this very
// attempt, due at once, as the retry of an attempt the stop canceled, and
// reports whether it did (leavers.retry). Run, it would have ended at once
// as canceled, an attempt of the fire spent on nothing, and the last one
// lost. A backfill's fire handed on is the backfill's still; one that
// nothing takes ends here, as handOn ends one.
func (p *pool) stopUnrun(j *job, now time.Time, t *tally) (uint8, bool) {
	t.exec(statusCanceled)
	handed := p.leaving.retry(leavingKey(j.rec, j.gen), j.sched, j.attempt, j.extra, attemptStopped, byWorker) ||
		p.leaving.unrun(j)
	if p.history != nil {
		p.history.RecordKeep(execution(j.id, p.node, j.sched, int(j.attempt), statusCanceled, now, now,
			"not started: "+errStopped.Error()), j.prof.keepFor(statusCanceled))
	}
	if bf := j.extra.backfill(); !handed && bf != nil {
		bf.end(j.sched)
	}
	return statusCanceled, handed
}

// stopAt says whether, and when, the node's stop (errStopped) canceled
// an attempt (pool.run).
type stopAt uint8

const (
	notStopped     stopAt = iota
	stoppedRunning        // while it ran: the attempt is spent
	stoppedBefore         // before its executor started any work (executor.ErrNotStarted): it did nothing
)

// run executes one job and records its history; it returns the attempt's
// status, for a failure its error, and whether the node's stop canceled
// it: its retry, or the attempt itself if it did nothing, is then handed
// on (work) when the task's definition gives it attempts left, and its
// fire has not ended until then.
func (p *pool) run(w int, j *job, now time.Time, t *tally, cuts uint64) (st uint8, why string, stop stopAt) {
	if j.kind != kindRetry {
		t.fires++
	}
	var err error
	var out *executor.Output // the capture, for tasks that have one
	if j.prof.noop {
		// Nothing to run, nothing to time out: no context, no Fire.
	} else {
		if j.prof.capture > 0 {
			out = executor.NewOutput(j.prof.capture)
		}
		err = p.execute(w, j, out, cuts)
	}
	st = statusOf(err)
	if st == statusCanceled && errors.Is(err, errStopped) {
		stop = stoppedRunning
		if errors.Is(err, executor.ErrNotStarted) {
			stop = stoppedBefore
		}
	}
	t.exec(st)
	p.chain(j, st)
	// A fire a fence cut did not end: the node stops its backfill as it
	// drops the partitions, and the next owner runs it again. Counted
	// ended, it could be recorded so while etcd still answers (the
	// session's lease lost, not etcd), and never run. Nor did one an
	// undone acquire cut, whose checkpoint put back hands it to the next
	// acquire, nor one the stop cut, whose retry may run on (work).
	if bf := j.extra.backfill(); bf != nil && final(j, st) && stop == notStopped && !errors.Is(err, errFenced) && !errors.Is(err, errUndone) {
		bf.end(j.sched)
	}
	if err == nil && !p.okKept {
		return st, "", stop
	}
	finished := now
	if !j.prof.noop {
		finished = p.clock.Now()
	}
	if err != nil {
		why = err.Error()
	}
	e := execution(j.id, p.node, j.sched, int(j.attempt), st, now, finished, why)
	if out != nil && (err != nil || j.prof.captureAll) {
		e.Output = out.String()
	}
	if p.history != nil {
		p.history.RecordKeep(e, j.prof.keepFor(st))
	}
	if st == statusFailed || st == statusTimeout {
		p.failures.add(e)
		return st, why, stop
	}
	return st, "", stop
}

// final reports whether j's attempt, ended with st, is its fire's last:
// only a failure or a timeout with attempts left is retried.
func final(j *job, st uint8) bool {
	return st != statusFailed && st != statusTimeout || int(j.attempt) >= j.prof.maxAttempts
}

// chain queues the chain triggers of a fire whose attempt ended with st,
// when that attempt was its last: it succeeded, or it failed or timed out
// with no attempt left.
func (p *pool) chain(j *job, st uint8) {
	var targets []string
	switch {
	case st == statusOK:
		targets = j.prof.onSuccess
	case (st == statusFailed || st == statusTimeout) && final(j, st):
		targets = j.prof.onFailure
	}
	if len(targets) > 0 {
		p.chains.add(chainFire{from: j.id, sched: j.sched, targets: targets})
	}
}

// execute runs j, taken when there had been cuts cuts (take).
func (p *pool) execute(w int, j *job, out *executor.Output, cuts uint64) (err error) {
	parent := p.execCtx
	if j.prof.concurrency != task.ConcurrencyAllow {
		ctx, cancel := context.WithCancelCause(parent)
		defer cancel(nil)
		defer p.untrack(p.track(w, j, cancel, cuts))
		parent = ctx
	}
	ctx, cancel := context.WithTimeout(parent, j.prof.timeout)
	defer cancel()
	// However the executor reported its cancel (a handler may return
	// ctx.Err() alone), the attempt says who canceled it: a fence or an
	// undone acquire (only tracked runs are cut), which a backfill must not
	// count as ended, or the node's stop, whose retry is handed on (run).
	defer func() {
		if err == nil {
			return
		}
		if cause := context.Cause(ctx); (cause == errFenced || cause == errUndone || cause == errStopped) && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
	}()
	f := &executor.Fire{
		TaskID: j.id, ScheduledAt: time.Unix(0, j.sched).UTC(), Attempt: int(j.attempt),
		Node: p.node, Fence: j.fence, Output: out,
	}
	if over := j.extra.override(); over != nil {
		f.Body = over.Body
		if over.Payload != nil {
			f.Payload = over.Payload
		}
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("executor panicked: %v", r)
		}
	}()
	return j.prof.exec.Execute(ctx, f)
}

// execution is the history record of one attempt of the fire (id, sched).
func execution(id, node string, sched int64, attempt int, st uint8, started, finished time.Time, why string) task.Execution {
	return task.Execution{
		TaskID: id, ScheduledAt: time.Unix(0, sched).UTC(), StartedAt: started, FinishedAt: finished,
		Attempt: attempt, Node: node, Status: statusNames[st], Error: why,
	}
}

func statusOf(err error) uint8 {
	switch {
	case err == nil:
		return statusOK
	case errors.Is(err, context.DeadlineExceeded):
		return statusTimeout
	case errors.Is(err, context.Canceled):
		return statusCanceled
	default:
		return statusFailed
	}
}
