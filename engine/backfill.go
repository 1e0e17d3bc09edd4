package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Backfills (registry.Backfill writes the request): the owner of a task's
// partition runs every scheduled time of the task in [from, to] through
// the dispatch loop and the worker pool, as triggers, with the fires'
// usual idempotency keys, at most the request's concurrency at a time.
//
// Its progress in etcd mirrors the watermark. The record's Through is a
// point of the backfill's times such that every fire at or before it has
// ended (its last attempt finished), and the runner never dispatches a
// fire more than backfillLead(concurrency) fires past the Through etcd
// last acknowledged. So:
//
//   - After a crash, the next owner continues after the acknowledged
//     Through: at most the lead of fires repeat, none is missed.
//   - A graceful release stops the runner before the loop releases the
//     partition and records Through at the last fire dispatched: every
//     fire up to it runs here (a worker took it) or is handed over unrun in
//     the partition's checkpoint (flagged backfill, so the next owner runs
//     it whatever its age). The next owner continues after it: nothing
//     repeats. The release waits for the fires under way and marks those
//     past its wait with their number (elsewhere.go), which the next
//     owner's runner counts against the concurrency until the marker
//     goes, as it counts those handed over unrun until each ends there
//     (backfillRun.handed), and the retries of those past the wait that
//     failed, handed on through etcd, from their arrival (their marker
//     stays until etcd has them).
//
// A record written before the release whose release etcd then refuses for
// longer than the lease TTL (a stuck release) loses the fires it handed
// over unrun, as a crash would not: see docs/design.md.

// backfillLead is how many fires a backfill runs past its acknowledged
// progress at most: its concurrency twice, so that the next fires start
// while the progress write of those that ended is in flight.
func backfillLead(concurrency int) int { return 2 * concurrency }

// backfillRun is one running backfill on the owner of its task.
type backfillRun struct {
	id     string
	part   int
	ended  chan int64 // scheduled times (unix ns) of its fires that ended; room for every fire in flight
	cancel context.CancelFunc
	done   chan struct{} // closed when the runner returned
	// graceful is set before cancel when the partition is released: the
	// runner then records the last fire it dispatched as its progress.
	graceful bool // guarded by backfills.mu until cancel, read after
	// left are its fires dispatched and not ended when a graceful release
	// stopped it: the release waits for them and marks them past its
	// wait, for the next owner's runner (runningMarker). Read once done is
	// closed.
	left int
	// stopped is set when the backfill was canceled or replaced: the
	// retries of its fires that come due while their task is paused are
	// skipped from then on, as any retry of a paused task (releaseRetry).
	stopped atomic.Bool
	// handed, on a runner, is the backfill of its task's fires handed
	// over to this node (Engine.handedBackfill), from its start or the
	// first handed over since (a retry handed on through etcd): their
	// fires that have not ended count against its concurrency
	// (loop.backfill), as they did on the node that handed them over.
	handed atomic.Pointer[backfillRun]
	// takenOver are, on a backfill of fires handed over, those the node
	// took over (loop.takeOver) that have not ended: how many, by
	// scheduled time.
	mu        sync.Mutex // guards takenOver
	takenOver map[int64]int
	// busy counts, on a runner, the loop's answers that fires elsewhere
	// or handed over fill its concurrency (backfillBusy): a test that the
	// runner starts none beside them waits for one, which proves the
	// runner asked, rather than for a time a slow machine may not reach.
	busy atomic.Uint64
}

// end tells the runner that its fire at sched ended. Called by workers
// and the dispatch loop; never blocks (ended has room for every fire in
// flight).
func (b *backfillRun) end(sched int64) {
	if b.ended == nil {
		b.handedEnded(sched) // a backfill of fires handed over: no runner reads ended
		return
	}
	select {
	case b.ended <- sched:
	default:
	}
}

// tookOver counts a fire at sched of b, a backfill of fires handed over,
// that the node took over, until it ends. Called only from the dispatch
// loop.
func (b *backfillRun) tookOver(sched int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.takenOver == nil {
		b.takenOver = map[int64]int{}
	}
	b.takenOver[sched]++
}

// handedEnded applies the end of b's fire at sched: one taken over
// counts no more. An end told again, or of a fire not counted (a retry
// the loop already held), changes nothing.
func (b *backfillRun) handedEnded(sched int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.takenOver[sched]; n > 1 {
		b.takenOver[sched] = n - 1
	} else {
		delete(b.takenOver, sched)
	}
}

// handedLeft is how many fires of b's task handed over to this node,
// b a runner, have not ended.
func (b *backfillRun) handedLeft() int {
	if b == nil {
		return 0
	}
	if h := b.handed.Load(); h != nil {
		return h.unended()
	}
	return 0
}

// unended is how many fires of b, a backfill of fires handed over, the
// node took over and have not ended.
func (b *backfillRun) unended() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, k := range b.takenOver {
		n += k
	}
	return n
}

// backfills are the runs of this node, by task id.
type backfills struct {
	mu   sync.Mutex // guards runs, newest and released
	runs map[string]*backfillRun
	// newest is the mod revision of the newest record of each backfill
	// this node started from, wrote or saw canceled: the watch delivers a
	// runner's own records late, and one that arrives after its runner
	// finished must not start another from that older progress, which
	// would run again the fires recorded after it; nor may an acquire that
	// read a record before its cancel start it after. (An acquire's read
	// of the newest record itself starts it: startBackfill.) An entry goes when
	// its record is deleted (stopBackfill: the watch sees every
	// partition's records, and a task's delete takes its record), so there
	// is at most one per record in etcd, whoever owns its partition now,
	// but for deletes a compacted watch skipped (it reads the records in
	// their stead, which holds none of a delete).
	newest map[string]int64
	// released are the partitions whose backfills were stopped, until
	// they are acquired again: a watch event (a runner's own last record)
	// must not start a runner of a partition on its way out, nor of one
	// on its way in before its acquire took over the fires handed over.
	released map[int]bool
	// handed are the backfills of the fires a released checkpoint handed
	// over to this node (flagged backfill), by task id: the runner, if
	// any, continues after them and does not wait for them, but a cancel
	// (or a canceled record read at the acquire) stops them all the same,
	// so that their retries of a paused task are skipped from then on. An
	// entry goes with the cancel, the task's delete, or its partition's
	// release (which drops the partition's retries).
	handed map[string]*backfillRun
	// canceled are the tasks whose newest backfill record this node saw
	// (the watch, any partition's, or an acquire's read) is canceled, with
	// its revision: a retry of the backfill's fire handed on through etcd
	// (fireTriggers) may come after the cancel, which then had no fire of
	// the backfill here to stop, and would run while its task is paused.
	// An entry goes with a newer record of the task's, or its delete: at
	// most one per canceled record in etcd, as newest holds.
	canceled map[string]int64
	wg       sync.WaitGroup
}

// noteRecord notes the state of a task's backfill record of revision rev
// (canceled, or not), unless a newer one was noted. Called with mu held.
func (bf *backfills) noteRecord(id string, canceled bool, rev int64) {
	cur, ok := bf.canceled[id]
	switch {
	case ok && rev <= cur:
	case canceled:
		if bf.canceled == nil {
			bf.canceled = map[string]int64{}
		}
		bf.canceled[id] = rev
	case ok:
		delete(bf.canceled, id)
	}
}

// backfillCmd dispatches one fire of a backfill.
type backfillCmd struct {
	part int
	id   string
	at   int64
	bf   *backfillRun
	// inflight are the runner's fires dispatched and not ended, of its
	// concurrency: with its fires on former owners (runs elsewhere) and
	// those they handed over unrun (handed), they must leave room for
	// this one.
	inflight, concurrency int
	reply                 chan backfillAnswer
}

// backfillAnswer is the loop's answer to a backfillCmd.
type backfillAnswer uint8

const (
	backfillTook     backfillAnswer = iota // the fire is dispatched
	backfillNoTask                         // the loop does not hold the task (yet: the partition's watch may lag)
	backfillNotOwned                       // the partition is not this node's (any more), or the node is fenced
	backfillBusy                           // the backfill's fires still running on former owners, or handed over by them unrun, fill its concurrency
)

func (c *backfillCmd) run(l *loop) { c.reply <- l.backfill(c) }

// backfill admits one fire of a backfill. The task's concurrency policy
// does not apply: the backfill's own concurrency bounds its fires. Called
// only from the dispatch loop.
func (l *loop) backfill(c *backfillCmd) backfillAnswer {
	if !l.parts[c.part].owned || l.fenced() {
		return backfillNotOwned
	}
	i, r, ok := l.tab.lookup(c.id)
	if !ok {
		return backfillNoTask
	}
	if n := l.backfillElsewhere(i) + c.bf.handedLeft(); n > 0 && c.inflight+n >= c.concurrency {
		return backfillBusy
	}
	l.admitBackfill(i, r, c.at, c.bf)
	l.pushJobs()
	return backfillTook
}

func (l *loop) admitBackfill(i uint32, r *record, sched int64, run *backfillRun) {
	r.running++
	r.fires++
	j := l.jobOf(i, r, l.profs.list[r.prof], sched, l.cfg.Clock.Now().UnixNano(), kindBackfill)
	j.extra = extraOf(nil, run)
	l.jobs = append(l.jobs, j)
}

// startBackfills starts the running backfills of partition p, which this
// node just acquired.
func (e *Engine) startBackfills(ctx context.Context, p int) {
	e.bf.mu.Lock()
	delete(e.bf.released, p)
	e.bf.mu.Unlock()
	resp, err := e.reg.PartitionBackfills(ctx, p)
	if err != nil {
		level := slog.LevelWarn
		if ctx.Err() != nil {
			// The acquire was cut short, the ring having moved p on: its
			// next owner starts them, nothing failed.
			level = slog.LevelDebug
		}
		e.log.Log(ctx, level, "reading a partition's backfills failed; they resume at its next acquire", "partition", p, "err", err)
		return
	}
	for _, kv := range resp.Kvs {
		e.startBackfill(string(kv.Key), kv.Value, kv.ModRevision, true)
	}
}

// startBackfill starts the backfill of a record unless it is done, its
// partition is not this node's, or it runs already. fromAcquire: the
// record is an acquire's read of it, not the watch's copy (newest).
func (e *Engine) startBackfill(key string, value []byte, rev int64, fromAcquire bool) {
	p, id, ok := e.reg.ParseBackfill(key)
	if !ok {
		return
	}
	rec, err := registry.DecodeBackfill(value)
	if err != nil {
		return
	}
	e.bf.mu.Lock()
	defer e.bf.mu.Unlock()
	// Of every partition: a retry handed on through etcd comes once the
	// partition is this node's, whenever its record changed.
	e.bf.noteRecord(id, rec.State == task.BackfillCanceled, rev)
	if !e.Owns(p) {
		return
	}
	if rec.State == task.BackfillCanceled {
		// Canceled before this acquire: the fires it handed over ran
		// (their first attempts), their retries of a paused task do not.
		e.stopHanded(id)
	}
	if rec.State != task.BackfillRunning {
		return
	}
	if e.bf.runs == nil {
		e.bf.runs = map[string]*backfillRun{}
	}
	// The watch delivers this node's runners' own records late: one that
	// comes after its runner ended starts nothing (rev == newest). An
	// acquire reads the records after the partition's runners stopped (its
	// release, or a fence): the one this node's runner wrote last, or
	// started from, is where the backfill stands when no other node ran it
	// since, and starts; only an older one does not (a cancel seen since).
	// Taken for a late copy, it started nothing when this node took its
	// partition back, and the backfill stayed running, with no runner,
	// until the partition moved to another node.
	if _, running := e.bf.runs[id]; running || e.bf.released[p] || rev < e.bf.newest[id] || !fromAcquire && rev == e.bf.newest[id] {
		return
	}
	if e.bf.newest == nil {
		e.bf.newest = map[string]int64{}
	}
	e.bf.newest[id] = rev
	// Not under runCtx, which Close ends before the coordinator releases
	// the partitions: their release stops the runners, gracefully.
	ctx, cancel := context.WithCancel(context.Background())
	b := &backfillRun{id: id, part: p, ended: make(chan int64, backfillLead(rec.Concurrency)+1), cancel: cancel, done: make(chan struct{})}
	b.handed.Store(e.bf.handed[id])
	e.bf.runs[id] = b
	e.bf.wg.Go(func() {
		defer close(b.done)
		e.runBackfill(ctx, b, rec, rev)
		e.bf.mu.Lock()
		if e.bf.runs[id] == b {
			delete(e.bf.runs, id)
		}
		e.bf.mu.Unlock()
	})
}

// handedBackfill returns the backfill of task id's fires that a released
// checkpoint of partition p handed over, or a retry handed on through
// etcd, adding it to bfs: stopped when the task's backfill was canceled.
func (e *Engine) handedBackfill(p int, id string, bfs map[string]*backfillRun) map[string]*backfillRun {
	e.bf.mu.Lock()
	defer e.bf.mu.Unlock()
	if e.bf.handed == nil {
		e.bf.handed = map[string]*backfillRun{}
	}
	b := e.bf.handed[id]
	if b == nil {
		b = &backfillRun{id: id, part: p}
		if _, canceled := e.bf.canceled[id]; canceled {
			// Canceled already (a retry handed on through etcd after the
			// cancel): its retries of a paused task are skipped, as any.
			b.stopped.Store(true)
		} else {
			e.bf.handed[id] = b
			if run := e.bf.runs[id]; run != nil {
				// A retry handed on through etcd after the runner
				// started: it counts them from now on.
				run.handed.CompareAndSwap(nil, b)
			}
		}
	}
	if bfs == nil {
		bfs = map[string]*backfillRun{}
	}
	bfs[id] = b
	return bfs
}

// stopHanded marks the backfill of the fires handed over of task id
// stopped. Called with e.bf.mu held.
func (e *Engine) stopHanded(id string) {
	if b := e.bf.handed[id]; b != nil {
		b.stopped.Store(true)
		delete(e.bf.handed, id)
	}
}

// stopBackfills stops the backfills of partitions ps and waits for their
// runners. graceful: the partitions are being released, and each runner
// records the last fire it dispatched as its progress first; it returns
// then how many fires of each backfill, by task id, were dispatched and
// had not ended (backfillRun.left), with those handed over to this node
// that had not ended either.
func (e *Engine) stopBackfills(ps []int, graceful bool) map[string]int {
	var left map[string]int
	e.bf.mu.Lock()
	if e.bf.released == nil {
		e.bf.released = map[int]bool{}
	}
	for _, p := range ps {
		e.bf.released[p] = true
	}
	for id, b := range e.bf.handed {
		if slices.Contains(ps, b.part) {
			delete(e.bf.handed, id)
			if n := b.unended(); graceful && n > 0 {
				if left == nil {
					left = map[string]int{}
				}
				left[id] = n
			}
		}
	}
	var stop []*backfillRun
	for _, b := range e.bf.runs {
		if slices.Contains(ps, b.part) {
			b.graceful = graceful
			b.cancel()
			stop = append(stop, b)
		}
	}
	e.bf.mu.Unlock()
	for _, b := range stop {
		<-b.done
		if b.left > 0 {
			if left == nil {
				left = map[string]int{}
			}
			left[b.id] += b.left
		}
	}
	return left
}

// stopAllBackfills stops every backfill, recording nothing: Close, once
// the partitions are released (which stopped theirs gracefully).
func (e *Engine) stopAllBackfills() {
	e.bf.mu.Lock()
	for _, b := range e.bf.runs {
		b.cancel()
	}
	e.bf.mu.Unlock()
	e.bf.wg.Wait()
}

// stopBackfill stops the backfill of a task whose record was deleted, or
// canceled at revision canceledAt, without recording anything: the fires
// it started run to their end. A canceled record stays newest: an
// acquire that read the record before the cancel must not start a runner
// from it after.
func (e *Engine) stopBackfill(id string, canceledAt int64) {
	e.bf.mu.Lock()
	b := e.bf.runs[id]
	e.stopHanded(id)
	if canceledAt > 0 {
		if e.bf.newest == nil {
			e.bf.newest = map[string]int64{}
		}
		e.bf.newest[id] = max(e.bf.newest[id], canceledAt)
		e.bf.noteRecord(id, true, canceledAt)
	} else {
		delete(e.bf.newest, id)
		delete(e.bf.canceled, id)
	}
	e.bf.mu.Unlock()
	if b != nil {
		b.stopped.Store(true)
		b.cancel()
		<-b.done
	}
}

// watchBackfills starts the backfills written for the partitions this
// node owns and stops those deleted or canceled, from revision from on
// (as watchTriggers), resuming after the last revision it saw when its
// watch breaks. If etcd compacted past it, it reads the records instead,
// acts on those written since, and goes on from that read.
func (e *Engine) watchBackfills(ctx context.Context, from int64) {
	rev := from
	for ctx.Err() == nil {
		for resp := range e.reg.WatchBackfills(ctx, rev) {
			if resp.Created && !resp.Canceled {
				continue
			}
			if resp.CompactRevision != 0 {
				// The records written since rev, read: a backfill written
				// or canceled while the watch was down is started or
				// stopped now, not at its partition's next acquire. The
				// deletes compacted away are lost (newest).
				if r, err := e.reg.Backfills(ctx); err == nil {
					for _, kv := range r.Kvs {
						if kv.ModRevision > rev {
							e.backfillChanged(string(kv.Key), kv.Value, kv.ModRevision, false)
						}
					}
					rev = r.Header.Revision
				}
				break
			}
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				rev = ev.Kv.ModRevision
				e.backfillChanged(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.ModRevision, ev.Type == 1)
			}
			if resp.IsProgressNotify() {
				rev = max(rev, resp.Header.Revision)
			}
		}
		sleepCtx(ctx, time.Second)
	}
}

// backfillChanged starts or stops the backfill of a record the watch
// delivered (or read in its stead) at revision rev.
func (e *Engine) backfillChanged(key string, value []byte, rev int64, deleted bool) {
	if deleted || backfillCanceled(value) { // the task is gone, or its backfill canceled
		if _, id, ok := e.reg.ParseBackfill(key); ok {
			if deleted {
				rev = 0
			}
			e.stopBackfill(id, rev)
		}
		return
	}
	e.startBackfill(key, value, rev, false)
}

// backfillCanceled reports whether a backfill record says it was canceled.
func backfillCanceled(value []byte) bool {
	rec, err := registry.DecodeBackfill(value)
	return err == nil && rec.State == task.BackfillCanceled
}

// ownBackfillRecord reports whether cur, the stored record of a backfill
// run from rec, was written by this node's runner, and its progress: the
// runner's write whose answer was lost. No other writer records this
// node's id on a running backfill created when rec was.
func (e *Engine) ownBackfillRecord(cur *mvccpb.KeyValue, rec *task.Backfill) (done int, mine bool) {
	if cur == nil {
		return 0, false
	}
	r, err := registry.DecodeBackfill(cur.Value)
	if err != nil || r.State != task.BackfillRunning || r.Node != e.cfg.NodeID || !r.CreatedAt.Equal(rec.CreatedAt) {
		return 0, false
	}
	return r.Done, true
}

// taskGone reports whether etcd says task id is gone.
func (e *Engine) taskGone(ctx context.Context, id string) bool {
	_, err := e.reg.Get(ctx, id)
	return errors.Is(err, registry.ErrNotFound)
}

// backfillTimes returns the scheduled times of the task in the record's
// range and its window, as unix ns.
func (e *Engine) backfillTimes(ctx context.Context, id string, rec *task.Backfill) ([]int64, error) {
	t, err := e.reg.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	sched, err := schedule.Parse(t.Schedule, t.Timezone, t.ID)
	if err != nil {
		return nil, err
	}
	// The times the registry counted: the task's window bounds them too.
	// A schedule changed since the request may hold more than a backfill
	// may run: the first of them run, and the record counts those.
	ts, more := task.ScheduledTimes(t, sched, rec.From, rec.To, e.cfg.Clock.Now(), task.MaxBackfillFires)
	if more {
		e.log.Warn("a backfill's range holds more scheduled times than a backfill runs, its task's schedule changed since the request: it runs the first of them",
			"task", id, "fires", len(ts), "through", ts[len(ts)-1])
	}
	times := make([]int64, len(ts))
	for i, n := range ts {
		times[i] = n.UnixNano()
	}
	return times, nil
}

// runBackfill runs one backfill from its recorded progress until it is
// done, its context ends, or the loop refuses a fire (the partition or the
// task is gone).
func (e *Engine) runBackfill(ctx context.Context, b *backfillRun, rec *task.Backfill, rev int64) {
	times, err := e.backfillTimes(ctx, b.id, rec)
	if err != nil {
		e.log.Warn("a backfill cannot start; it resumes at the partition's next acquire", "task", b.id, "err", err)
		return
	}
	// The first fire after the recorded progress.
	start := 0
	if !rec.Through.IsZero() {
		through := rec.Through.UnixNano()
		start, _ = slices.BinarySearch(times, through+1)
	}
	lead := backfillLead(rec.Concurrency)
	next, done, acked := start, start, start
	inflight := map[int64]int{} // scheduled time -> index, of the fires dispatched and not ended
	ended := map[int]bool{}     // indexes past done that ended
	unsure := false             // a write since the last acknowledged one failed: etcd may have applied it
	missing := 0                // the loop's answers in a row that it does not hold the task
	record := func(ctx context.Context, n int, state string) bool {
		r := *rec
		r.Done, r.State, r.Node = n, state, e.cfg.NodeID
		// The times this runner runs: a schedule changed since the request
		// (or the last owner) changed them, and done counts them.
		r.Fires = len(times)
		if n > 0 {
			r.Through = time.Unix(0, times[n-1]).UTC()
		}
		wctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		defer cancel()
		newRev, ok, cur, err := e.reg.RecordBackfill(wctx, b.id, &r, rev)
		if err == nil && !ok && unsure {
			if d, mine := e.ownBackfillRecord(cur, rec); mine {
				// etcd applied a write of this runner whose answer was
				// lost: write over it.
				rev, acked = cur.ModRevision, d
				newRev, ok, _, err = e.reg.RecordBackfill(wctx, b.id, &r, rev)
			}
		}
		if err != nil {
			unsure = true
			if ctx.Err() == nil { // else the runner stops, and says nothing of a write it canceled
				e.log.Warn("recording a backfill's progress failed; retrying", "task", b.id, "err", err)
			}
			return false
		}
		if !ok {
			e.log.Info("a backfill was canceled, replaced or its task deleted; stopping", "task", b.id)
			b.stopped.Store(true) // canceled, most likely: the watch may find the runner gone
			b.cancel()
			return false
		}
		rev, acked, unsure = newRev, n, false
		e.bf.mu.Lock()
		e.bf.newest[b.id] = max(e.bf.newest[b.id], newRev)
		e.bf.mu.Unlock()
		return true
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var busy <-chan time.Time // the loop found its concurrency full with fires of former owners: asked again then
		for next < len(times) && len(inflight) < rec.Concurrency && next < acked+lead && ctx.Err() == nil {
			c := &backfillCmd{part: b.part, id: b.id, at: times[next], bf: b, inflight: len(inflight), concurrency: rec.Concurrency,
				reply: make(chan backfillAnswer, 1)}
			// Not under ctx: a request canceled after the loop took it
			// would leave a dispatched fire out of the graceful record.
			answer, err := request(context.Background(), e, c, c.reply)
			if err == nil && answer == backfillNoTask {
				// The task's put may not have reached the loop yet; a
				// deleted task's backfill record goes with it, which
				// stops this runner through the watch. Once a second the
				// runner asks etcd itself, for a delete a compacted watch
				// skipped.
				if missing++; missing%10 == 0 && e.taskGone(ctx, b.id) {
					e.log.Info("a backfill stopped: its task was deleted", "task", b.id)
					return
				}
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			missing = 0
			if err == nil && answer == backfillBusy {
				b.busy.Add(1)
				// Until their markers go (elsewhere.go), or the fires
				// handed over end here, which the loop applies: no etcd
				// request per try.
				busy = time.After(100 * time.Millisecond)
				break
			}
			if err != nil || answer != backfillTook {
				if ctx.Err() == nil {
					e.log.Info("a backfill stopped: this node no longer owns its task", "task", b.id)
				}
				// What was dispatched is not recorded: the next owner
				// repeats it rather than miss it.
				return
			}
			inflight[times[next]] = next
			next++
		}
		if done == len(times) {
			for !record(context.Background(), done, task.BackfillDone) && ctx.Err() == nil {
				sleepCtx(ctx, time.Second)
			}
			return
		}
		select {
		case s := <-b.ended:
			for more := true; more; {
				if i, ok := inflight[s]; ok {
					delete(inflight, s)
					ended[i] = true
				}
				select {
				case s = <-b.ended:
				default:
					more = false
				}
			}
			for ended[done] {
				delete(ended, done)
				done++
			}
			// Under ctx: a write cut off from etcd must not hold the
			// runner's stop (a fence's drop waits for it) past its own
			// timeout, again and again while the select takes a tick
			// before the stop.
			if done > acked && done < len(times) {
				record(ctx, done, task.BackfillRunning)
			}
		case <-busy:
		case <-tick.C:
			if done > acked && done < len(times) {
				record(ctx, done, task.BackfillRunning)
			}
		case <-ctx.Done():
			e.bf.mu.Lock()
			graceful := b.graceful
			e.bf.mu.Unlock()
			if graceful {
				b.left = len(inflight)
			}
			if graceful && next > acked {
				// Every fire dispatched runs here or is handed over with
				// the partition: the next owner goes on after the last.
				state := task.BackfillRunning
				if next == len(times) {
					state = task.BackfillDone
				}
				// Tried again while etcd refuses it, etcdTimeout in all:
				// left at the through etcd acknowledged last, the next
				// owner ran again the fires still running here.
				rctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
				for !record(rctx, next, state) && unsure && sleepCtx(rctx, 100*time.Millisecond) {
				}
				cancel()
			}
			return
		}
	}
}
