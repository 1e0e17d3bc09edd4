package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
	"github.com/shardcron/shardcron/timerwheel"
)

// The hand-over of a partition from one owner to the next.
//
// A graceful release (a node leaves, or the ring moves the partition):
//
//  1. The dispatch loop takes the partition's tasks out of the wheel. First
//     it dispatches every fire of the partition due up to the wheel's time,
//     the mark, including those a cut batch left in the current tick and
//     those armed into it: fires due at or before the mark are this node's,
//     the rest the next owner's, however the batches were cut.
//  2. From then until the release commits, the node watermark written to
//     etcd is held at the mark (holds): should this node crash, successors
//     resume no later than the mark, never past a fire nobody dispatched.
//     While it waits for attempts under way (3), only the released
//     partitions are held (holds.narrow): the others fire on.
//  3. The coordinator waits until workers took every job dispatched before
//     the mark (handOverWait at most; past it, the partition's jobs still
//     queued are handed over unrun and listed in the checkpoint), then,
//     Config.ReleaseRunWait at most (250ms), until the attempts under way
//     of the partition's tasks that retry or keep their fires apart, or
//     with fires of their backfill under way (stopBackfills), ended: one
//     that failed hands its retry over (running). The loop then seals the
//     release; the runs of those that keep their fires apart, or with
//     their backfill's fires, still going get a marker in etcd for the
//     next owner (elsewhere.go), and the release waits until etcd took
//     them.
//     The session's end ends both waits, and the partitions then go with
//     the lease, as on a fence.
//  4. One transaction writes the released checkpoint {mark, applied,
//     pending} and deletes the lock, on the condition that the lock is
//     still ours (applied: the revision up to which this node armed the
//     partition's task changes, by which the next owner tells the
//     one-shots this node never had, decideApplied).
//
// A release etcd does not take stays stuck: its lock is still ours, the
// coordinator retries it, and the watermark stays held (its partitions
// alone, at their resume points, once narrowed). If etcd still refuses
// after the lease TTL the node ends its session, so that its locks pass
// on; successors then resume from the held watermark, as after a crash.
// A lock cannot outlive its cause.
//
// The next owner (acquire) locks, reads the checkpoint, arms every task
// from its first fire after the mark and runs the pending fires (takeOver).

// checkpoint is /<prefix>/checkpoints/<partition>: where the partition's
// last owner got to.
type checkpoint struct {
	Node      string    `json:"node"`
	Session   string    `json:"session,omitempty"` // the owner's lease, naming its watermark key
	Watermark time.Time `json:"watermark"`
	Released  bool      `json:"released"`
	// Applied is the etcd revision up to which the owner that released
	// the partition had armed its task changes (kept by the next owner's
	// checkpoint until it names its session): a one-shot written after it
	// is one that owner never had as it is (decideApplied).
	Applied int64         `json:"applied,omitempty"`
	Pending []pendingFire `json:"pending,omitempty"` // released before the watermark, not run: the next owner's
	// After are tasks whose last fire was released past the watermark (a
	// misfire's catch-up fire looks up to the present), at that fire's
	// scheduled time: each resumes after it.
	After  []pendingFire  `json:"after,omitempty"`
	Health []handedHealth `json:"health,omitempty"` // on release: the tasks that failed, for the next owner (health.go)
	// EndWaits are, on release, the paused delete_after_fire tasks whose
	// last fire ended there: the next owner looks at each one's resume
	// whether it ended, as that owner would have (flagEndWaits).
	EndWaits []string `json:"end_waits,omitempty"`
	// Fired are, on release, the triggers whose fire started or ended
	// there within triggerWait (handTriggers): a key put again is that
	// fire on the next owner too (handedTriggers). An acquire's hold
	// keeps them, for a successor should it crash before naming its
	// session.
	Fired []firedTrigger `json:"fired,omitempty"`
}

// firedTrigger is a trigger whose fire started or ended on the owner that
// released its partition, or was handed over to it so: the put of its key
// that did, at revision Rev, the retry it was (registry.Retry.Attempt; 0:
// the trigger's own fire), and for how long still a key put again is that
// fire: WaitMS, what was left of triggerWait when the release was written,
// and UntilMS, when that is on the releasing node's clock (unix ms; 0: not
// known), for a successor that takes the list later (handedTriggers).
type firedTrigger struct {
	ID      string    `json:"id"`
	At      time.Time `json:"at"`
	Rev     int64     `json:"rev"`
	Attempt uint16    `json:"attempt,omitempty"`
	WaitMS  int64     `json:"wait_ms"`
	UntilMS int64     `json:"until_ms,omitempty"`
	until   int64     // when its wait ends on the releasing node (unix ns), for WaitMS when the checkpoint is written (firedWithin)
}

// handOver is what a released partition passes to its next owner: the
// point up to which this node dispatched its fires, and the fires before it
// that did not run here (waiting behind a running fire, or still queued
// after handOverWait), for the next owner to run. Triggers are not among
// them: their keys stay for the next owner (trigger.go).
type handOver struct {
	mark    int64
	applied int64 // the revision up to which the partition's task changes were armed here
	// created is the partition's partState.created: the attempts still
	// under way hand on their retries for the tasks created at or before
	// it (leaver.created). Not in the checkpoint.
	created int64
	// fence is the partition's partState.fence: its jobs dispatched here
	// carry it (leavers.released). Not in the checkpoint.
	fence   int64
	pending []pendingFire
	lost    int // backfills' fires and retries no checkpoint could list (list, shedPending), not yet logged
	// after are the tasks whose last fire was released past mark (a
	// misfire's catch-up fire), each with that fire's scheduled time: the
	// next owner resumes each after it.
	after    []pendingFire
	health   []handedHealth // tasks that failed here (health.go)
	endWaits []string       // paused delete_after_fire tasks whose last fire ended here (flagEndWaits)
	fired    []firedTrigger // triggers that fired or ended here (handTriggers)
}

// handedTo is what a partition's previous owner handed over with its tasks,
// by task id, for the load that arms them.
type handedTo struct {
	after  map[string]int64        // tasks fired past the resume point: each resumes after that fire
	health map[string]handedHealth // tasks that failed there (health.go)
	// endWaits are the paused delete_after_fire tasks whose last fire
	// ended there, to be looked at again at their resume (flagEndWaits),
	// of the tasks that owner had having armed the partition's changes up
	// to endWaitsApplied (heldEndWaits).
	endWaits        map[string]bool
	endWaitsApplied int64
	// elsewhere are the runs of tasks that went on past a release
	// (elsewhere.go).
	elsewhere map[string][]elsewhereRun
	// pending are the fires handed over unrun, which the acquire runs
	// once the load is in (takeOver); with, after a crash or a fence, the
	// retries the session's watermark carried, of the tasks that session
	// had (heldRetries).
	pending []pendingFire
	retries waitingRetries
	fired   []firedTrigger // triggers that fired there (handedTriggers)
}

// handedFrom indexes what acquire read: the after list and the health and
// the tasks whose end waits for their resume that checkpoint cp hands
// over (checkpoint.handing).
func handedFrom(after []pendingFire, cp checkpoint) handedTo {
	var h handedTo
	if len(after) > 0 {
		h.after = make(map[string]int64, len(after))
		for _, f := range after {
			h.after[f.ID] = f.At.UnixNano()
		}
	}
	if len(cp.Health) > 0 {
		h.health = make(map[string]handedHealth, len(cp.Health))
		for _, e := range cp.Health {
			h.health[e.ID] = e
		}
	}
	h.takeEndWaits(endWaits{Applied: cp.Applied, IDs: cp.EndWaits})
	h.fired = cp.Fired
	return h
}

// takeEndWaits takes ends as the tasks whose end waits for their resume,
// in place of any: a checkpoint's, or after a crash or a fence those that
// the session's watermark carried, or its hand-over kept (resume).
func (h *handedTo) takeEndWaits(ends endWaits) {
	h.endWaits, h.endWaitsApplied = nil, ends.Applied
	if len(ends.IDs) > 0 {
		h.endWaits = make(map[string]bool, len(ends.IDs))
		for _, id := range ends.IDs {
			h.endWaits[id] = true
		}
	}
}

// handingCheckpoint decodes prev, a checkpoint that hands its lists to
// the partition's next owner (checkpoint.handing); the zero checkpoint
// otherwise, or when unreadable.
func handingCheckpoint(prev []byte) checkpoint {
	cp, _ := decodeCheckpoint(prev)
	return cp.handing()
}

// decodeCheckpoint decodes a stored checkpoint, the zero checkpoint when
// it is unreadable: what a partial decode read is not taken. An acquire
// decodes its partition's once (resume): a released checkpoint runs to
// maxCheckpointBytes.
func decodeCheckpoint(b []byte) (checkpoint, error) {
	var cp checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return checkpoint{}, err
	}
	return cp, nil
}

// handing is cp when it hands its lists to the partition's next owner:
// one its owner released, or the hold of an acquire that did not
// complete, which carries what it was handed (holdCheckpoint); the zero
// checkpoint otherwise.
func (cp checkpoint) handing() checkpoint {
	if !cp.Released && cp.Session != "" {
		return checkpoint{}
	}
	return cp
}

// holdCheckpoint is the checkpoint an acquire by node writes before its
// session may be named (acquire): the point it resumes p from, and what
// the checkpoint before it handed over (handed: checkpoint.handing), which
// a successor takes should this node crash before naming its session.
// Without the health and the ends of handed's owner, those went with the
// crash of a node whose predecessor had left gracefully.
func holdCheckpoint(node string, resume int64, handed checkpoint, pending, after []pendingFire, applied int64) checkpoint {
	return checkpoint{Node: node, Watermark: time.Unix(0, resume).UTC(), Applied: applied, Pending: pending, After: after,
		Health: handed.Health, EndWaits: handed.EndWaits, Fired: handed.Fired}
}

// lower moves the mark before a fire due at due that cannot be listed, so
// that the next owner repeats it rather than misses it. No task may then
// resume past the mark: the unlisted fire may be an after task's.
func (h *handOver) lower(due int64) {
	if due-1 < h.mark {
		h.mark, h.after = due-1, nil
	}
}

// list adds f, due at due, to pending. Past maxHandOver it moves the mark
// before a scheduled fire instead, which the next owner then repeats
// rather than misses: f when it is one, else the latest one listed, whose
// place f takes. Only a list full of backfills' fires loses f.
func (h *handOver) list(f pendingFire, due int64) {
	switch {
	case len(h.pending) < maxHandOver:
		h.pending = append(h.pending, f)
	case f.scheduled():
		h.lower(due)
	default:
		if i := h.latestScheduled(); i >= 0 {
			h.lower(h.pending[i].At.UnixNano()) // its due time is at or after it
			h.pending[i] = f
		} else {
			h.lost++
		}
	}
}

// latestScheduled is the index of pending's scheduled fire with the latest
// time (the last listed of those), or -1: the one whose shedding moves the
// mark back least, and so repeats the fewest fires. pending is not in
// time order (fires waiting behind a running one come from a map).
func (h *handOver) latestScheduled() int {
	at := -1
	for i, f := range h.pending {
		if f.scheduled() && (at < 0 || !f.At.Before(h.pending[at].At)) {
			at = i
		}
	}
	return at
}

// pendingFire is a fire handed over unrun, as a released checkpoint lists
// it.
type pendingFire struct {
	ID       string    `json:"id"`
	At       time.Time `json:"at"`
	Backfill bool      `json:"backfill,omitempty"` // run whatever its age: a backfill's fires are old
	// A retry (Attempt 2 or more) waits for its backoff until Due, and
	// sends its trigger's override, as it would have here.
	Attempt  uint16         `json:"attempt,omitempty"`
	Due      time.Time      `json:"due,omitzero"`
	Override *task.Override `json:"override,omitempty"`
	// Trigger: attempt 1 is a trigger's, handed on unrun (fireExtra.trig,
	// the revision of its key): it runs while its task is paused, as the
	// trigger's own fire does. A node that does not read it skips it then.
	Trigger int64 `json:"trigger,omitempty"`
}

// handedFire is the fire of task id at sched (unix ns), of a kind
// (kindSchedule, kindBackfill), handed over unrun.
func handedFire(id string, sched int64, kind uint8) pendingFire {
	return pendingFire{ID: id, At: time.Unix(0, sched).UTC(), Backfill: kind == kindBackfill}
}

// handedRetry is attempt attempt of task id's fire at sched, due at due,
// handed over unrun. A retry of a backfill canceled here goes as a plain
// retry, skipped while its task is paused as it would have been here: the
// next owner may take the task's backfill for running (a new one replaced
// the canceled one).
func handedRetry(id string, sched int64, attempt uint16, due int64, x *fireExtra) pendingFire {
	bf := x.backfill()
	f := pendingFire{ID: id, At: time.Unix(0, sched).UTC(), Backfill: bf != nil && !bf.stopped.Load(),
		Attempt: attempt, Due: time.Unix(0, due).UTC(), Override: x.override()}
	if x.triggersFirst(attempt) {
		f.Trigger = x.trig
	}
	return f
}

// scheduled reports whether f is a fire of its task's schedule, which the
// next owner fires again when the mark is before it. A backfill's is not:
// its backfill's progress is past it, and it is old, so that a mark moved
// before it would have every task of the partition fire again from then.
// Nor is a retry: its first attempt ran.
func (f pendingFire) scheduled() bool { return !f.Backfill && f.Attempt == 0 }

// maxHandOver bounds the fires one checkpoint lists; past it, the mark
// stops before the rest, which the next owner then fires with everything
// after the mark (repeats rather than misses).
const maxHandOver = 2000

// maxAfter bounds the tasks one checkpoint lists as fired past its mark;
// past it, the rest repeat their catch-up fire.
const maxAfter = maxHandOver / 2

// maxEndWaits bounds the tasks one checkpoint lists whose end waits for
// their resume; past it, the rest stay, ended, after their resume.
const maxEndWaits = maxHandOver / 2

// maxFired bounds the triggers one checkpoint lists as fired; past it,
// the key of an earlier one put again fires again on the next owner.
const maxFired = maxHandOver / 2

// maxCheckpointBytes bounds a released checkpoint's JSON, well within
// etcd's request limit (1.5 MiB by default) and a transaction's bytes
// (registry.MaxTxnBytes). The counts above keep a checkpoint of plain ids
// under it; ids of 256 characters that JSON escapes (<, >, &: 6 bytes
// each) could make it several MiB, a release etcd refuses every time.
const maxCheckpointBytes = 512 << 10

// encode returns h's released checkpoint as node writes it. Past
// maxCheckpointBytes it sheds what it lists, from the end of each list, as
// much as takes it under, the cheapest loss first: health (the next owner
// counts those tasks' failures afresh), then fired (a trigger's key put
// again fires again), then endWaits (those tasks stay, ended, after their
// resume), then after (their catch-up fires repeat), then pending fires
// (shedPending).
func (h *handOver) encode(node string) []byte {
	for {
		b, _ := json.Marshal(checkpoint{Node: node, Watermark: time.Unix(0, h.mark).UTC(), Released: true,
			Applied: h.applied, Pending: h.pending, After: h.after, Health: h.health, EndWaits: h.endWaits, Fired: h.fired})
		over := len(b) - maxCheckpointBytes
		switch {
		case over <= 0:
			return b
		case len(h.health) > 0:
			h.health = h.health[:len(h.health)-tailHolding(h.health, over)]
		case len(h.fired) > 0:
			h.fired = h.fired[:len(h.fired)-tailHolding(h.fired, over)]
		case len(h.endWaits) > 0:
			h.endWaits = h.endWaits[:len(h.endWaits)-tailHolding(h.endWaits, over)]
		case len(h.after) > 0:
			h.after = h.after[:len(h.after)-tailHolding(h.after, over)]
		case len(h.pending) > 0:
			h.shedPending(over)
		default:
			return b // nothing left to shed (a node id of half a MiB)
		}
	}
}

// tailHolding is how many of list's last entries take at least over bytes
// of its JSON, all of them if they take less.
func tailHolding[E any](list []E, over int) int {
	n := 0
	for i := len(list) - 1; i >= 0 && over > 0; i-- {
		over -= jsonSize(list[i]) + 1 // and its comma
		n++
	}
	return n
}

func jsonSize(v any) int {
	b, _ := json.Marshal(v)
	return len(b)
}

// shedPending sheds pending's latest scheduled fires, as many as take at
// least over bytes of its JSON, moving the mark before each: the next
// owner repeats them rather than misses them (the latest first, so that
// the mark moves back least). With none left, it sheds the last
// backfills' fires, which are lost.
func (h *handOver) shedPending(over int) {
	cut := make([]bool, len(h.pending))
	shed := 0
	var sched []int // the scheduled fires, latest first
	for i := len(h.pending) - 1; i >= 0; i-- {
		if h.pending[i].scheduled() {
			sched = append(sched, i)
		}
	}
	slices.SortStableFunc(sched, func(a, b int) int { return h.pending[b].At.Compare(h.pending[a].At) })
	for _, i := range sched {
		if over <= 0 {
			break
		}
		f := h.pending[i]
		over -= jsonSize(f) + 1
		h.lower(f.At.UnixNano()) // its due time is at or after it
		cut[i] = true
		shed++
	}
	if shed == 0 {
		for i := len(h.pending) - 1; i >= 0 && over > 0; i-- {
			over -= jsonSize(h.pending[i]) + 1
			cut[i] = true
			h.lost++
		}
	}
	kept := h.pending[:0]
	for i, f := range h.pending {
		if !cut[i] {
			kept = append(kept, f)
		}
	}
	clear(h.pending[len(kept):])
	h.pending = kept
}

// release is the loop's answer to a releaseCmd.
type release struct {
	hand map[int]*handOver
	// ticket counts the jobs ever pushed, the partitions' last dispatched
	// job among them: once workers took that many, every fire of the
	// partitions up to their marks has started here.
	ticket uint64
	// running is what else the release waits for: its tasks' attempts
	// that may retry or overlap the next owner's fires. nil: none.
	running *running
	// unstarted, for a fenced drop, are the puts of the keys of triggers
	// whose jobs workers took and the fence cut before they started
	// (pool.takeUnstarted): their keys stay, and the seal forgets them
	// (loop.forgetUnstarted) before it lists those that fired.
	unstarted []triggerEnd
}

// running counts a release's attempts under way (queued or running when
// their partition was taken out) of tasks that retry, or that keep their
// fires apart (forbid, buffer_one, replace): the next owner, which knows
// nothing of them, starts its first fire only once the release commits.
// Its counts are the leavers'; ended is closed once none is left.
type running struct {
	n     int
	ended chan struct{}
	keys  []uint64 // its tasks in leavers
}

// leaver is a task taken out with its partition while attempts of it were
// under way.
type leaver struct {
	id   string
	prof *profile
	part int
	// created is its partition's (partState.created) at the release: the
	// task was created at or before it, and one of its id created after
	// it was put again since, which takes no retry handed on through etcd
	// (registry.TriggerRetry).
	created int64
	hand    *handOver // its partition's; nil once the release is sealed
	run     *running
	n       int        // its attempts not yet ended
	mark    *markedRun // its run's marker, once it has one (elsewhere.go)
	// backfill are its backfill's fires among its attempts when its
	// runner stopped, with those handed over to this node not ended
	// (stopBackfills): its marker counts them against the backfill's
	// concurrency on the next owner.
	backfill int
}

// leavingKey is a record's key in leavers: its index and generation, as a
// job and a completion name them.
func leavingKey(rec, gen uint32) uint64 { return uint64(rec)<<32 | uint64(gen) }

// leavers are the tasks of releases with attempts under way, by
// leavingKey. When one of those attempts fails, or the node's stop (the
// drain timeout, Hurry) cancels it, with attempts left, its retry is
// handed on (retry). Until the release is sealed, the loop lists
// it in the partition's hand-over, due after its backoff, as a retry
// waiting for it is: the hand-overs are the loop's until then. After a
// graceful release's seal, it is written to etcd as a trigger that
// carries its attempt (registry.TriggerRetry, through the chain writer),
// which the partition's owner, whoever it is, runs when due: by the
// worker that ran the attempt, since the loop may have stopped (Close
// drains the workers after it), or by the loop, from the completion of an
// attempt whose worker found the release not sealed yet, or not begun.
// Safe for concurrent use by the loop and the workers; its lock takes no
// other but the chain queue's, and a marker set's (ended), which takes the
// pool's runMu.
//
// A job of a task that is not a leaver (one attempt, policy allow, by the
// definition held at the release), which a worker took before the release,
// and which then counted it started, may yet meet the node's stop before
// it starts: it is handed on too (unrun), by its partition's release,
// which released keeps from the seal of a graceful one, by partition.
type leavers struct {
	mu       sync.Mutex // guards m, and its leavers' n and mark, and released
	m        map[uint64]*leaver
	released map[int]releasedPart
	clock    Clock
	chains   *chainQueue
	handedOn atomic.Uint64 // retries queued for etcd, for Stats
}

// releasedPart is a partition's last graceful release, sealed: the fence
// its jobs carried, and its partState.created (leaver.created).
type releasedPart struct{ fence, created int64 }

func newLeavers(clock Clock, chains *chainQueue) *leavers {
	return &leavers{m: map[uint64]*leaver{}, released: map[int]releasedPart{}, clock: clock, chains: chains}
}

// leave notes that record i, taken out with its partition (hand), has n
// attempts under way, bf of them its backfill's, in run, made when nil.
// Called only from the dispatch loop.
func (l *loop) leave(run *running, i uint32, r *record, n, bf int, h *handOver) *running {
	if run == nil {
		run = &running{ended: make(chan struct{})}
	}
	k := leavingKey(i, r.gen)
	ls := l.pool.leaving
	ls.mu.Lock()
	ls.m[k] = &leaver{id: l.tab.id(r), prof: l.profs.list[r.prof], part: int(r.part), created: h.created, hand: h, run: run, n: n, backfill: min(bf, n)}
	run.keys = append(run.keys, k)
	run.n += n
	ls.mu.Unlock()
	return run
}

// attemptEnd is how the attempt before a retry ended, which says when the
// retry is due (leavers.retry).
type attemptEnd uint8

const (
	attemptFailed  attemptEnd = iota // due after its backoff
	attemptStopped                   // the node's stop canceled it, or came before the retry started (pool.stopUnrun): due at once
)

// retrier is who hands a retry on (leavers.retry).
type retrier uint8

const (
	byLoop   retrier = iota // the dispatch loop, the hand-overs' until the seal: sealed or not
	byWorker                // a worker: only once the release is sealed
)

// retry hands on attempt next of the fire at sched of leaver k, and
// reports whether it did: k is a leaver, and, by a worker, sealed, and its
// task has that many attempts by the definition the loop held at the
// release (lv.prof), as the loop retries a failure by the definition it
// holds (complete), an edit's since the attempt began included. The
// attempt before it failed, or the node's stop canceled it, or came
// before next started, which then was not run (pool.stopUnrun). The retry
// of a failure is due after its backoff; that of a stopped attempt at
// once: its cancel says nothing of what it calls, which the backoff
// spares, and its fire is late already, by the drain timeout.
func (ls *leavers) retry(k uint64, sched int64, next uint16, x *fireExtra, end attemptEnd, by retrier) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	lv := ls.m[k]
	if lv == nil || by == byWorker && lv.hand != nil {
		return false
	}
	if int(next) > lv.prof.maxAttempts {
		return false
	}
	due := ls.clock.Now()
	if end == attemptFailed {
		due = due.Add(retryWait(lv.prof, next))
	}
	if lv.hand != nil {
		lv.hand.list(handedRetry(lv.id, sched, next, due.UnixNano(), x), due.UnixNano())
		return true
	}
	var written func()
	if m := lv.mark; m != nil {
		// Its marker stays until etcd has the retry: the next owner sees
		// one or the other, and a backfill's count holds throughout.
		m.set.handingOn(m)
		written = func() { m.set.handedOn(m) }
	}
	ls.toEtcd(lv.id, sched, next, due, x, lv.created, written)
	return true
}

// unrun hands on j, a job the node's stop met before it started, taken
// before its partition's release, of a task the release did not note as
// leaving, and reports whether it did: its partition's release is sealed
// and graceful, and j is its fire's first attempt, all the definition
// held at the release gives it (a leaver's refusal stands: retry). Called
// by a worker.
func (ls *leavers) unrun(j *job) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	rp, ok := ls.released[int(j.part)]
	if !ok || rp.fence != j.fence || j.attempt != 1 || ls.m[leavingKey(j.rec, j.gen)] != nil {
		return false
	}
	ls.toEtcd(j.id, j.sched, j.attempt, ls.clock.Now(), j.extra, rp.created, nil)
	return true
}

// toEtcd queues attempt next of the fire at sched of task id, due at due,
// for the chain writer, which writes it to etcd as a trigger that carries
// it (registry.TriggerRetry), for the partition's owner whoever it is; a
// task of id created after created takes none. written, when not nil, is
// told once the write ended. Called with mu held.
func (ls *leavers) toEtcd(id string, sched int64, next uint16, due time.Time, x *fireExtra, created int64, written func()) {
	// A backfill's retry goes as the backfill's, as in a checkpoint
	// (handedRetry): it runs while its task is paused.
	bf := x.backfill()
	r := &registry.Retry{Attempt: next, Due: due, Backfill: bf != nil && !bf.stopped.Load(), Trigger: x.triggersFirst(next)}
	ls.chains.add(chainFire{from: id, sched: sched, retry: r, over: x.override(), created: created, written: written})
	ls.handedOn.Add(1)
}

// ended counts one attempt of leaver k as ended, if k is one.
func (ls *leavers) ended(k uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	lv := ls.m[k]
	if lv == nil {
		return
	}
	if lv.n--; lv.n == 0 {
		delete(ls.m, k)
		if lv.mark != nil {
			lv.mark.set.ended(lv.mark)
		}
	}
	if lv.run.n--; lv.run.n == 0 {
		close(lv.run.ended)
	}
}

// seal ends what rel's attempts hand over with their partitions: the
// coordinator then reads its hand-overs alone. With late (a graceful
// release), a retry of an attempt that ends later is handed on through
// etcd, and so is a job the node's stop meets unrun (unrun); else (a
// fence dropped the partitions, an acquire was undone) they are lost, and
// rel's tasks are forgotten: an attempt a fenced pool drops from its
// queue never ends.
func (ls *leavers) seal(rel release, late bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for p, h := range rel.hand {
		// A release that was not graceful (a fence, an acquire undone)
		// leaves the record of the graceful one before, whose jobs are
		// still its own, and so does one while loading (fence 0), which
		// dispatched nothing.
		if late && h.fence != 0 {
			ls.released[p] = releasedPart{fence: h.fence, created: h.created}
		}
	}
	if rel.running == nil {
		return
	}
	for _, k := range rel.running.keys {
		if lv := ls.m[k]; lv != nil && late {
			lv.hand = nil
		} else {
			delete(ls.m, k)
		}
	}
}

// handOn hands on the retry of c, an attempt of a leaver that failed,
// when its worker did not (it found the release not sealed, or not begun).
//
// A backfill's fire whose retry nothing takes (its task was deleted or
// dropped, not released) ends here: its runner waits for its end.
func (ls *leavers) handOn(c *completion, x completionExtra) {
	if bf := x.extra.backfill(); !x.handed && (c.status == statusFailed || c.status == statusTimeout) &&
		!ls.retry(leavingKey(c.rec, c.gen), c.sched, c.attempt+1, x.extra, attemptFailed, byLoop) && bf != nil {
		bf.end(c.sched)
	}
}

// leftEnded applies the end of an attempt of a task gone from the loop,
// with a release or deleted.
func (l *loop) leftEnded(c *completion, x completionExtra) {
	l.pool.leaving.handOn(c, x)
	l.pool.leaving.ended(leavingKey(c.rec, c.gen))
	l.deletedRunEnded(leavingKey(c.rec, c.gen), true)
}

// releaseParts takes every task of parts out of the wheel, after
// dispatching their fires due up to the mark, and holds the node
// watermark at the mark. backfills are the fires of the partitions'
// backfills under way, by task id (stopBackfills). Called only from the
// dispatch loop.
func (l *loop) releaseParts(parts []int, backfills map[string]int) release {
	now := l.cfg.Clock.Now().UnixNano()
	mark := l.wheel.Now()
	out := make(map[int]*handOver, len(parts))
	for _, p := range parts {
		out[p] = &handOver{mark: mark, applied: l.parts[p].applied, created: l.parts[p].created, fence: l.parts[p].fence}
		if !l.parts[p].owned {
			continue // released while loading: nothing of it was armed
		}
		h := out[p]
		l.tab.eachIn(p, func(i uint32, r *record) {
			l.flush(i, r, mark, now)
			// A misfire fired this task past the mark: the next owner,
			// resuming after the mark, would fire that time again.
			if r.lastFire != 0 && len(h.after) < maxAfter && r.lastFire+l.delay(r, r.lastFire) > mark {
				h.after = append(h.after, pendingFire{ID: l.tab.id(r), At: time.Unix(0, r.lastFire).UTC()})
			}
			if r.flags&flagEndWaits != 0 && len(h.endWaits) < maxEndWaits {
				h.endWaits = append(h.endWaits, l.tab.id(r))
			}
		})
		l.holds.set(p, mark)
		l.owned.Add(-1)
		l.setApplied(p, 0)
		l.parts[p] = partState{}
	}
	// The released partitions' triggers that did not start here keep their
	// keys for the next owner (forgetTrigger).
	for i, w := range l.pending {
		r := l.tab.rec(i)
		switch {
		case out[int(r.part)] == nil:
		case w.kind == kindTrigger:
			l.forgetTrigger(l.triggerKeyOf(r, w.at))
		default:
			out[int(r.part)].list(handedFire(l.tab.id(r), w.at, w.kind), w.at+l.delay(r, w.at))
		}
	}
	// So do those held at the gate: they have not started.
	l.gated = slices.DeleteFunc(l.gated, func(g gatedJob) bool {
		h := out[int(g.part)]
		if h == nil {
			return false
		}
		r := l.tab.rec(g.rec)
		r.running--
		h.list(handedFire(g.id, g.sched, g.kind), g.sched+l.delay(r, g.sched))
		return true
	})
	// Retries waiting for their backoff go with their partition.
	for slot := range l.retries {
		rs := &l.retries[slot]
		r := l.tab.rec(rs.rec)
		if rs.due == 0 || r.flags&flagLive == 0 || r.gen != rs.gen || out[int(r.part)] == nil {
			continue
		}
		out[int(r.part)].list(handedRetry(l.tab.id(r), rs.sched, rs.attempt, rs.due, rs.extra), rs.due)
		l.wheel.Cancel(retryBase + uint32(slot))
		l.freeRetry(uint32(slot))
	}
	l.early.keep(func(t *triggerFire) bool {
		if out[t.part] == nil {
			return true
		}
		if t.prev != 0 {
			// A key put again after its fire here, unread: taken for
			// that fire, so that the next owner does not fire it again.
			l.putAgain(t.key(), t.rev)
			return false
		}
		l.forgetTrigger(t.key())
		return false
	})
	// Their checks not yet taken go with them, the next owner's: left
	// queued, the checks of the partitions kept waited behind them.
	l.checks.takeIf(func(f triggerFire) bool { return out[f.part] != nil })
	l.noteReleasedAgain(out)
	var run *running
	for _, p := range parts {
		out[p].health = l.handHealth(p)
		l.tab.eachIn(p, func(i uint32, r *record) {
			// Runs elsewhere are not this node's to wait for: their
			// markers stay for the next owner. A backfill's fires are
			// waited for and marked whatever the policy: the next owner's
			// runner would start its own beside them.
			if r.running > 0 {
				// Looked up for running tasks only: a release of every
				// partition passes every task here.
				bf := backfills[l.tab.id(r)]
				if prof := l.profs.list[r.prof]; prof.maxAttempts > 1 || prof.concurrency != task.ConcurrencyAllow || bf > 0 {
					if n := l.runningHere(i, r); n > 0 {
						run = l.leave(run, i, r, n, bf, out[p])
					}
				}
			}
			l.remove(i)
		})
	}
	l.pushJobs()
	return release{hand: out, ticket: l.pool.pushedCount() + uint64(len(l.unpushed)), running: run}
}

// flush dispatches record i's fires due up to mark: those a cut batch left
// in the wheel's current tick, and those armed at or before it (catch-up).
func (l *loop) flush(i uint32, r *record, mark, now int64) {
	for r.flags&flagLive != 0 && r.flags&flagPaused == 0 && r.next != 0 {
		due := r.next + l.delay(r, r.next)
		if due > mark {
			return
		}
		l.release(timerwheel.Expired{ID: i, At: due}, now)
		r.next = l.nextOf(r, r.next)
	}
}

// handOverQueued hands over unrun the jobs of released partitions that
// workers did not take in time, as which says (unrunAll, unrunApart): they
// are dropped from the queue and listed in the partitions' checkpoints.
// Called only from the dispatch loop.
func (l *loop) handOverQueued(hand map[int]*handOver, which unrunJobs) {
	handed := func(j *job) bool {
		h := hand[int(j.part)]
		if h == nil || which == unrunApart && j.prof.concurrency == task.ConcurrencyAllow || j.replaced && j.kind != kindTrigger {
			// A job a newer fire replaced (concurrency replace) stays for
			// a worker here to cancel unrun, as without the release.
			return false
		}
		// A trigger's key stays for the next owner.
		switch j.kind {
		case kindRetry:
			h.list(handedRetry(j.id, j.sched, j.attempt, j.due, j.extra), j.due)
		case kindTrigger:
			l.forgetTrigger(j.triggerKey())
		default:
			h.list(handedFire(j.id, j.sched, j.kind), j.due)
		}
		if j.kind == kindSchedule {
			l.holds.dropped(int(j.part), j.due)
		}
		l.pool.leaving.ended(leavingKey(j.rec, j.gen)) // it ends here, unrun
		return true
	}
	l.dropJobs(handed)
	l.publish()
}

// takeOver runs the fires a released checkpoint handed over, on the new
// owner, once its tasks are loaded. A fire of a task gone since is dropped,
// and so is one older than its task's catch-up window. Called only from the
// dispatch loop.
func (l *loop) takeOver(c *takeOverCmd) {
	if !l.parts[c.part].owned {
		return
	}
	now := l.cfg.Clock.Now().UnixNano()
	retries, buffered := false, len(l.bufferedIn[c.part])
	for _, f := range c.fires {
		i, r, ok := l.tab.lookup(f.ID)
		if !ok {
			continue
		}
		prof := l.profs.list[r.prof]
		at := f.At.UnixNano()
		var bf *backfillRun
		if f.Backfill {
			bf = c.bfs[f.ID]
		}
		if f.Attempt > 0 {
			retries = true
			// A retry: it waits here until it is due, as it would have
			// there.
			if l.waitHandedRetry(i, r, at, f.Attempt, f.Due.UnixNano(), handedExtra(f.Override, bf, f.Trigger), true) && bf != nil {
				bf.tookOver(at)
			}
			continue
		}
		if f.Backfill {
			// Its backfill's progress is past it; still the backfill's
			// fire: its retries run while the task is paused, until the
			// backfill is canceled, and outside its concurrency policy,
			// and it counts against the backfill's concurrency until it
			// ends, as on the node that handed it over.
			if bf != nil {
				bf.tookOver(at)
			}
			l.admitBackfill(i, r, at, bf)
			continue
		}
		if r.flags&flagPaused != 0 {
			// Paused since the previous owner queued it (the pause came
			// after the release, or before it unseen there): a pause
			// stops what has not started, as a retry due later is skipped
			// (releaseRetry).
			l.skipForPause(i, r, at, 1)
			continue
		}
		if now-at > int64(prof.catchup) {
			r.misfires++
			l.stats.misfire(prof.misfire)
			l.misfired(r, at, "handed over unrun, and older than the catch-up window")
			continue
		}
		l.admit(i, r, prof, ownFire{at: at, kind: kindSchedule}, now)
	}
	l.pushJobs()
	if retries || len(l.bufferedIn[c.part]) > buffered {
		// Now, not within a WatermarkInterval (publishRetriesDue): the
		// acquire names its session once a watermark past this point is
		// acknowledged, and from then on the checkpoint lists no pending
		// fire, the session's watermark its retries, and the fires that
		// wait for a run of the previous owner past its release
		// (buffer_one).
		l.publishRetries()
	}
}

// holds keeps the node watermark at or below the marks of releases that
// have not committed (see the hand-over above). It also keeps, for each of
// those releases that dropped fires of the schedule from the queue to hand
// them over, a resume point before the earliest: workers pass dropped jobs
// as taken, so the watermark reaches the mark, and a successor that
// resumed from it after the session ended (a release stuck past the lease
// TTL, or a crash before it commits) would miss them. The watermark write
// carries these points, and a successor resumes such a partition from the
// earlier of the two: it repeats that partition's fires since, and no
// other partition's. Its lock is taken under the pool's (dropped) and
// takes no other.
type holds struct {
	mu     sync.Mutex    // guards marks and resume
	marks  map[int]int64 // by partition
	resume map[int]int64 // by partition: before the earliest fire dropped unrun
}

func newHolds() *holds { return &holds{marks: map[int]int64{}, resume: map[int]int64{}} }

// dropped notes that the release of p dropped from the queue a fire of the
// schedule released at due, before any worker can pass it.
func (h *holds) dropped(p int, due int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r, ok := h.resume[p]; !ok || due-1 < r {
		h.resume[p] = due - 1
	}
}

// resumes returns a copy of the resume points of the releases that dropped
// fires, or nil for none.
func (h *holds) resumes() map[int]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.resume) == 0 {
		return nil
	}
	return maps.Clone(h.resume)
}

// narrow turns the marks of ps into resume points, so that the node
// watermark moves on while p's successor after a crash still resumes p
// from its mark: once workers took every job of ps dispatched before
// their marks, nothing but p depends on the mark, and a hold of the whole
// node stopped dispatch of every partition at the bounded lead past it.
func (h *holds) narrow(ps []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range ps {
		m, ok := h.marks[p]
		if !ok {
			continue
		}
		if r, ok := h.resume[p]; !ok || m < r {
			h.resume[p] = m
		}
		delete(h.marks, p)
	}
}

func (h *holds) set(p int, mark int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.marks[p] = mark
}

func (h *holds) clear(ps ...int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range ps {
		delete(h.marks, p)
		delete(h.resume, p)
	}
}

func (h *holds) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.marks)
	clear(h.resume)
}

// cap returns w, lowered to the earliest mark held.
func (h *holds) cap(w int64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.marks {
		w = min(w, m)
	}
	return w
}

// stuckRelease is a released partition whose checkpoint etcd did not take,
// or whose runs past the release it did not mark (elsewhere.go): its lock
// is still this session's, and the watermark stays held at its mark until
// a retry commits.
type stuckRelease struct {
	part  *owned
	hand  *handOver
	since time.Time
	// unmarked are its runs past the release whose markers etcd has not
	// taken yet, none of which ended: a retry marks them before it
	// commits.
	unmarked []*markedRun
}

// takenWaitOver is logged when a release's wait for workers to take its
// partitions' queued fires ran out (tests look for it).
const takenWaitOver = "workers did not take a released partition's queued fires in time; they are handed over unrun"

// runWaitOver is logged when a release's wait for attempts under way ran
// out (tests look for it).
const runWaitOver = "attempts still run at their partitions' release: should they fail, their retries are handed on through etcd, " +
	"and the next owner keeps its fires apart from them through their markers (concurrency policies)"

// release hands partitions over gracefully (see the hand-over above). It
// returns the partitions whose release etcd did not take, whose locks are
// still held, for the caller to retry (retryStuck), and how long the
// release took. sess is the session that holds their locks: once it ends,
// past its fencing deadline, the node writes no checkpoint (Self-fencing
// in docs/design.md), so the etcd requests still to come are not made and
// those under way are canceled; the partitions left pass on with the
// lease, as after a crash.
func (e *Engine) release(sess *membership.Session, parts map[int]*owned, ps []int) (map[int]*stuckRelease, time.Duration) {
	life := sess.Mutexes().Ctx()
	// Backfills first: each records the last fire it dispatched, which the
	// release then runs here or hands over.
	rel := e.releaseLoop(ps, e.stopBackfills(ps, true))
	marked := time.Now()
	for _, p := range ps {
		e.owned[p].Store(false)
		parts[p].stop()
	}
	for _, p := range ps {
		<-parts[p].done
	}
	// Once the session ended, the partitions went with its lease (below):
	// nothing is left to wait for.
	queued := unrunNone
	if err := e.pool.waitTaken(life, rel.ticket, handOverWait); err != nil {
		queued = unrunAll
		if errors.Is(err, errNotTaken) {
			e.log.Warn(takenWaitOver, "partitions", len(ps), "waited", handOverWait)
		}
	}
	if queued == unrunNone && rel.running != nil {
		// An attempt that fails now hands its retry over; past the wait,
		// through etcd (leavers). Only ps stand still meanwhile: the node's
		// other partitions fire on past the bounded lead.
		e.holds.narrow(ps)
		wait := time.NewTimer(e.cfg.ReleaseRunWait)
		select {
		case <-rel.running.ended:
		case <-e.hurry: // Close stops waiting for running executions
		case <-life.Done(): // the partitions went with the lease (below)
		case <-wait.C:
			// Debug: with the short default wait nearly every release of a
			// fleet with such tasks comes here; markElsewhere logs the runs
			// it marks, and the metrics count both paths.
			e.log.Debug(runWaitOver,
				"partitions", len(ps), "waited", e.cfg.ReleaseRunWait)
		}
		wait.Stop()
	}
	if life.Err() != nil {
		// The session ended: the partitions went with its lease, and their
		// next owners resume as after a crash. Nothing is written, and
		// the caller drops them with the others (drop keeps their
		// hand-overs); the retry of an attempt that fails from now on is
		// lost, as on any fence.
		e.seal(rel, queued, false)
		stuck := make(map[int]*stuckRelease, len(ps))
		for _, p := range ps {
			stuck[p] = &stuckRelease{part: parts[p], hand: rel.hand[p], since: marked}
			delete(parts, p)
		}
		e.log.Warn("the session ended while partitions were being released; they pass on with its lease, as after a crash",
			"partitions", partRanges(ps), "count", len(ps))
		return stuck, time.Since(marked)
	}
	e.seal(rel, queued, true)
	// The whole hand-over is bounded: etcd out of reach must not hold a
	// shutdown for long.
	ctx, cancel := context.WithTimeout(life, max(10*time.Second, e.cfg.DrainTimeout))
	defer cancel()
	// Before the release commits, so that the next owner finds them. A
	// partition with a run etcd did not mark is not released yet: its
	// next owner would start the task's fires beside the run.
	mctx, mcancel := context.WithTimeout(ctx, etcdTimeout)
	unmarked := e.markElsewhere(mctx, sess, e.pool.leaving.mark(rel.running, e.markersOf(sess)))
	mcancel()
	// The keys of triggers that started here go first: the next owner
	// fires every key it finds.
	fctx, fcancel := context.WithTimeout(ctx, etcdTimeout)
	started := e.pool.ends.takeParts(ps)
	err := e.deleteTriggerKeys(fctx, started)
	if err != nil {
		e.pool.ends.add(started...) // for the deleter: left, they would fire again on every acquire
	} else {
		err = e.pool.ends.waitBatch(fctx) // the deleter's batch in flight may hold some
	}
	fcancel()
	if err != nil {
		e.log.Warn("deleting the keys of triggers fired here did not end before the release; their next owners may fire them again",
			"partitions", len(ps), "err", err)
	}
	stuck := map[int]*stuckRelease{}
	now := time.Now()
	for p, runs := range unmarked {
		stuck[p] = &stuckRelease{part: parts[p], hand: rel.hand[p], since: now, unmarked: runs}
	}
	var refused refusals
	cps := e.encodeReleased(ps, rel.hand)
	ready := slices.DeleteFunc(slices.Clone(ps), func(p int) bool { return stuck[p] != nil })
	for _, chunk := range releaseChunks(ready, cps) {
		failed, err := e.commitRelease(ctx, sess, parts, chunk, cps, 3)
		if len(failed) > 1 {
			// One partition at a time, so that one lost lock does not keep
			// the others.
			failed = slices.DeleteFunc(failed, func(p int) bool {
				f, err := e.commitRelease(ctx, sess, parts, []int{p}, cps, 1)
				refused.add(f, err)
				return len(f) == 0
			})
		} else {
			refused.add(failed, err)
		}
		for _, p := range failed {
			stuck[p] = &stuckRelease{part: parts[p], hand: rel.hand[p], since: now}
		}
	}
	if life.Err() != nil && len(stuck) > 0 {
		e.log.Warn("the session ended before these releases were written; their partitions pass on with its lease, as after a crash",
			"partitions", partRanges(slices.Sorted(maps.Keys(stuck))), "count", len(stuck))
	} else {
		refused.log(e.log)
	}
	took := time.Since(marked)
	for _, p := range ps {
		if stuck[p] == nil {
			e.holds.clear(p)
			e.handOver[phaseRelease].observe(took)
		}
		delete(parts, p)
	}
	return stuck, took
}

// retryStuck tries the stuck releases again, first the markers of their
// runs etcd did not take, and removes those that commit. When etcd refused
// one for longer than the lease TTL, it ends the session: the locks pass
// on with the lease, successors resume from the held watermark, and the
// runs kept apart are canceled as on any fence (serving.cut). A session
// that has ended retries nothing: its releases go with its lease.
func (e *Engine) retryStuck(sess *membership.Session, stuck map[int]*stuckRelease) {
	life := sess.Mutexes().Ctx()
	if len(stuck) == 0 || life.Err() != nil {
		return
	}
	parts := make(map[int]*owned, len(stuck))
	hand := make(map[int]*handOver, len(stuck))
	oldest := time.Now()
	for p, s := range stuck {
		parts[p], hand[p] = s.part, s.hand
		if s.since.Before(oldest) {
			oldest = s.since
		}
	}
	e.markAgain(life, sess, stuck)
	ctx, cancel := context.WithTimeout(life, etcdTimeout)
	defer cancel()
	var ps []int
	for p, s := range stuck {
		if len(s.unmarked) == 0 {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	var refused refusals
	cps := e.encodeReleased(ps, hand)
	for _, chunk := range releaseChunks(ps, cps) {
		failed, err := e.commitRelease(ctx, sess, parts, chunk, cps, 1)
		refused.add(failed, err)
		for _, p := range chunk {
			if !slices.Contains(failed, p) {
				delete(stuck, p)
				e.holds.clear(p)
			}
		}
	}
	refused.log(e.log)
	if len(stuck) == 0 {
		e.log.Info("stuck releases committed", "count", len(ps))
		return
	}
	if time.Since(oldest) > e.cfg.LeaseTTL {
		e.log.Error("etcd refused partition releases for longer than the lease TTL; ending the session so that their locks pass on",
			"partitions", len(stuck))
		_ = sess.Close()
	}
}

// markAgain tries again the markers of the stuck releases' runs that etcd
// did not take, and leaves each release the runs it still did not take.
func (e *Engine) markAgain(life context.Context, sess *membership.Session, stuck map[int]*stuckRelease) {
	var runs []*markedRun
	for _, s := range stuck {
		runs = append(runs, s.unmarked...)
	}
	if len(runs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(life, etcdTimeout)
	unmarked := e.markElsewhere(ctx, sess, runs)
	cancel()
	for p, s := range stuck {
		s.unmarked = unmarked[p]
	}
}

// unrunJobs is which queued jobs of a release's partitions its seal hands
// over unrun (loop.handOverQueued).
type unrunJobs uint8

const (
	unrunNone unrunJobs = iota // none: workers took them in time
	unrunAll                   // all: workers did not take them in time, or the partitions are dropped
	// unrunApart: those of tasks kept apart, of an acquire undone (its
	// hand-over is not written: the checkpoint put back has the next
	// acquire fire their times again). Run after the undo, each would run
	// beside that fire; the others run, their repeat documented.
	unrunApart
)

// seal has the loop seal rel (leavers.seal, late for a graceful release),
// first handing over the queued fires of its partitions unrun, as queued
// says (loop.handOverQueued). From then on the caller alone reads rel's
// hand-overs.
func (e *Engine) seal(rel release, queued unrunJobs, late bool) {
	c := &sealCmd{rel: rel, queued: queued, late: late, reply: make(chan struct{}, 1)}
	_, _ = request(context.Background(), e, c, c.reply)
}

// encodeReleased returns the released checkpoints of ps, by partition,
// and logs the fires they could not list.
func (e *Engine) encodeReleased(ps []int, hand map[int]*handOver) map[int][]byte {
	cps := make(map[int][]byte, len(ps))
	now := e.cfg.Clock.Now().UnixNano()
	for _, p := range ps {
		h := hand[p]
		h.fired = firedWithin(h.fired, now)
		cps[p] = h.encode(e.cfg.NodeID)
		if h.lost > 0 {
			e.log.Error("a hand-over cannot list every backfill's fire and retry handed over unrun; these are lost",
				"partition", p, "lost", h.lost, "listed", len(h.pending))
			h.lost = 0
		}
	}
	return cps
}

// releaseChunks groups partitions into transactions within etcd's limits,
// by the size of their released checkpoints cps.
func releaseChunks(ps []int, cps map[int][]byte) [][]int {
	var chunks [][]int
	var cur []int
	size := 0
	for _, p := range ps {
		n := len(cps[p]) + 128 // the checkpoint, its key and the lock's delete
		if len(cur) == registry.MaxTxnOps/2 || (len(cur) > 0 && size+n > registry.MaxTxnBytes) {
			chunks, cur, size = append(chunks, cur), nil, 0
		}
		cur = append(cur, p)
		size += n
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks
}

// commitRelease writes the released checkpoints cps of ps and deletes their
// locks, held by sess, in one transaction, in up to attempts tries within
// ctx, and returns the partitions it did not release: all of ps, or none;
// err is etcd's last refusal when it refused them, errLockLost when a lock
// of ps is no longer ours. The callers log both once a round (refusals),
// not once a try: under etcd's NOSPACE alarm, or past its lease, a leaving
// node would otherwise log a line for every partition it has.
func (e *Engine) commitRelease(ctx context.Context, sess *membership.Session, parts map[int]*owned, ps []int, cps map[int][]byte, attempts int) (failed []int, err error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, p := range ps {
		m := parts[p].mu
		cmps = append(cmps, m.IsOwner())
		ops = append(ops, clientv3.OpPut(e.keys.checkpoint(p), string(cps[p])), clientv3.OpDelete(m.Key()))
	}
	for attempt := range attempts {
		if attempt > 0 && !sleepCtx(ctx, time.Duration(attempt)*200*time.Millisecond) {
			break
		}
		tctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		var resp *clientv3.TxnResponse
		resp, err = e.cli.Txn(tctx).If(cmps...).Then(ops...).Commit()
		cancel()
		switch {
		case err != nil:
			// Tried again; the caller logs the last refusal.
		case !resp.Succeeded:
			if e.releasedUnanswered(ctx, sess, parts, ps) {
				return nil, nil
			}
			// A lock is no longer ours: its lease ended, so this session is
			// over and the partition passed on as after a crash.
			return ps, errLockLost
		default:
			return nil, nil
		}
	}
	return ps, err
}

// releasedUnanswered reports whether the release of ps committed though
// its answer was lost (a timeout, a leader change): the locks of ps are
// gone while the lease of s, the session that held them, still holds the
// node key. While the lease lives, only this session deletes its lock
// keys, and it deletes a held or stuck partition's only in the transaction
// that writes its released checkpoint, one for all of ps. Taken for a lock
// lost with the lease, the release stayed stuck: the watermark held at its
// mark stopped every partition of the node at the lead, and the session
// ended after the lease TTL.
func (e *Engine) releasedUnanswered(ctx context.Context, s *membership.Session, parts map[int]*owned, ps []int) bool {
	if s.Fenced() {
		return false
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(s.Key()), "=", int64(s.Lease()))}
	for _, p := range ps {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(parts[p].mu.Key()), "=", 0))
	}
	tctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	resp, err := e.cli.Txn(tctx).If(cmps...).Commit()
	return err == nil && resp.Succeeded
}

// errLockLost is commitRelease's error when a lock of its partitions is no
// longer this session's.
var errLockLost = errors.New("a partition lock was lost before its release")

// refusals notes the releases that failed over a round, for a log line
// each kind.
type refusals struct {
	refused, lost []int
	err           error // etcd's last refusal
}

// add notes what commitRelease returned.
func (r *refusals) add(failed []int, err error) {
	switch {
	case errors.Is(err, errLockLost):
		r.lost = append(r.lost, failed...)
	case err != nil:
		r.refused, r.err = append(r.refused, failed...), err
	}
}

func (r *refusals) log(log *slog.Logger) {
	if len(r.refused) > 0 {
		log.Warn("writing release checkpoints failed", "partitions", partRanges(r.refused), "count", len(r.refused), "err", r.err)
	}
	if len(r.lost) > 0 {
		log.Warn("partition locks were lost before their release; their next owners resume as after a crash",
			"partitions", partRanges(r.lost), "count", len(r.lost))
	}
}

// releaseLoop takes partitions' tasks out of the wheel (releaseParts).
func (e *Engine) releaseLoop(ps []int, backfills map[string]int) release {
	c := &releaseCmd{parts: ps, backfills: backfills, reply: make(chan release, 1)}
	if r, err := request(context.Background(), e, c, c.reply); err == nil {
		return r
	}
	// The loop is gone: nothing was dispatched past the watermark.
	hand := make(map[int]*handOver, len(ps))
	for _, p := range ps {
		hand[p] = &handOver{mark: e.pool.watermark.Load()}
	}
	return release{hand: hand}
}

// drop lets go of partitions without a word to etcd: the session is dead,
// its locks expire with its lease, and the next owners resume from the
// last watermark etcd acknowledged for the session. Queued fires are
// dropped unrun.
//
// It remembers, for each partition, the hand-over a graceful release would
// have written (and that of each stuck release): a fenced pool takes
// nothing more, so what its workers took is final. A partition whose
// checkpoint still names the session was fired by nobody since: when this
// node takes it again, it resumes from that hand-over rather than from the
// last watermark etcd acknowledged, and repeats nothing.
//
// The runs of tasks whose policy keeps their fires apart were canceled as
// the session ended (serving.cut), before the drop.
func (e *Engine) drop(sess *membership.Session, parts map[int]*owned, stuck map[int]*stuckRelease) {
	ps := slices.Collect(maps.Keys(parts))
	e.stopBackfills(ps, false)
	rel := e.releaseLoop(ps, nil)
	rel.unstarted = e.pool.takeUnstarted(-1)
	e.seal(rel, unrunAll, false)
	for p, s := range stuck {
		rel.hand[p] = s.hand
	}
	e.pool.reset()
	e.keepEnded(sessionID(sess), rel.hand)
	e.holds.reset() // the session is over: it writes no watermark any more
	for _, p := range ps {
		e.owned[p].Store(false)
		parts[p].stop()
		<-parts[p].done
		delete(parts, p)
	}
	e.log.Warn("dropped partitions", "count", len(ps))
}

// endedHands is what this node's fenced sessions would have handed over,
// by partition: each partition's from the last session that dropped it. A
// session that fenced holding nothing (soon after another, etcd still out
// of reach) leaves the earlier sessions' in place. Copied on write.
type endedHands map[int]endedHand

// endedHand is a partition's hand-over kept by the session that dropped it.
type endedHand struct {
	session string
	hand    *handOver
}

// keepEnded keeps the hand-over of each partition session dropped.
// Called only by the coordinator.
func (e *Engine) keepEnded(session string, hand map[int]*handOver) {
	next := endedHands{}
	if prev := e.ended.Load(); prev != nil {
		maps.Copy(next, *prev)
	}
	for p, h := range hand {
		next[p] = endedHand{session: session, hand: h}
	}
	e.ended.Store(&next)
}

// resumed is where an acquire resumes a partition from (resume).
type resumed struct {
	prev []byte // the partition's checkpoint as stored, nil if none: put back should the acquire be undone
	// handing is the checkpoint whose health and end waits the acquire
	// takes (checkpoint.handing): prev's, decoded, or the released
	// checkpoint this node's fenced session would have written of the
	// hand-over it kept; the zero checkpoint after a crash, which hands
	// none over.
	handing checkpoint
	w       int64 // the watermark to resume the partition after
	// pending and after are the lists (checkpoint) of a release or of the
	// hold of an acquire that did not complete, or those of the hand-over
	// this node's fenced session kept; none after a crash.
	pending, after []pendingFire
	// applied is the revision up to which the owner that handed the
	// partition over (a release, this node's fenced session, or after a
	// crash the session whose watermark is the resume point) had armed its
	// task changes; 0 when not known (from a node that did not say, a
	// partition the session no longer armed, or a session whose watermark
	// is behind the checkpoint's).
	applied int64
	// ends are, after a crash or a fence, the tasks of the partition whose
	// end waits for their resume that the session's watermark carried (a
	// release's, or those of the hand-over a fenced session kept, are in
	// handing), and retries its retries waiting for their backoff (a
	// release's are in pending).
	ends    endWaits
	retries waitingRetries
}

// resume reads where p resumes: after the released checkpoint of a
// graceful owner, or after a crash the later of the checkpoint and the
// watermark of the session that wrote it, or p's resume point in it when
// earlier (holds), or, when that session was this node's last, the
// hand-over it kept in memory.
// Watermarks are kept per session, not per node: a node restarted with
// the same id writes a new one, and the dead session's stays the truth
// about what it had taken; dead holds those the acquire's round read. A
// partition never owned starts now.
func (e *Engine) resume(ctx context.Context, p int, dead *deadMarks) (resumed, error) {
	resp, err := e.cli.Get(ctx, e.keys.checkpoint(p))
	if err != nil {
		return resumed{}, err
	}
	if len(resp.Kvs) == 0 {
		return resumed{w: e.cfg.Clock.Now().UnixNano()}, nil
	}
	prev := resp.Kvs[0].Value
	cp, err := decodeCheckpoint(prev)
	if err != nil || cp.Watermark.IsZero() {
		e.log.Warn("unreadable checkpoint; resuming the partition now", "partition", p, "value", string(prev))
		return resumed{prev: prev, handing: cp.handing(), w: e.cfg.Clock.Now().UnixNano()}, nil
	}
	w := cp.Watermark.UnixNano()
	if cp.Released {
		return resumed{prev: prev, handing: cp, w: w, pending: cp.Pending, after: cp.After, applied: cp.Applied}, nil
	}
	if cp.Session == "" { // an acquire that did not complete: its pending fires are still to run
		return resumed{prev: prev, handing: cp, w: w, pending: cp.Pending, after: cp.After, applied: cp.Applied}, nil
	}
	if ended := e.ended.Load(); ended != nil && cp.Node == e.cfg.NodeID && cp.Session == (*ended)[p].session {
		// Kept in memory, never written: taken as the release it would have
		// been, bounded as one, since the acquire writes its lists in its
		// checkpoint.
		h := (*ended)[p].hand
		kept := e.encodeReleased([]int{p}, map[int]*handOver{p: h})[p]
		return resumed{prev: prev, handing: handingCheckpoint(kept), w: h.mark, pending: h.pending, after: h.after, applied: h.applied}, nil
	}
	m, err := dead.get(ctx, e.keys.watermark(cp.Node, cp.Session), e.readDeadMark)
	if err != nil {
		return resumed{}, err
	}
	if !m.found {
		return resumed{prev: prev, w: w}, nil
	}
	// The lists go with a revision of their own, whatever the watermark;
	// the retries, by the session's watermark.
	nw := m.v.resume(p)
	rets := m.retries(p).unstarted(nw)
	if nw < w {
		// The session's acquire resumed p from a point its dispatch never
		// reached: its revisions say nothing of the fires up to w.
		return resumed{prev: prev, w: w, ends: m.endWaits(p), retries: rets}, nil
	}
	return resumed{prev: prev, w: nw, applied: m.applied(p), ends: m.endWaits(p), retries: rets}, nil
}

// putCheckpoint writes p's checkpoint while m is still held.
func (e *Engine) putCheckpoint(ctx context.Context, m *concurrency.Mutex, p int, cp checkpoint) (*clientv3.TxnResponse, error) {
	val, err := json.Marshal(cp)
	if err != nil {
		return nil, err
	}
	resp, err := e.cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut(e.keys.checkpoint(p), string(val))).Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, errors.New("the partition lock was lost")
	}
	return resp, nil
}

// restoreCheckpoint writes back (or deletes, when prev is nil) the
// checkpoint an acquire replaced, while m is held.
func (e *Engine) restoreCheckpoint(m *concurrency.Mutex, p int, prev []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	op := clientv3.OpDelete(e.keys.checkpoint(p))
	if prev != nil {
		op = clientv3.OpPut(e.keys.checkpoint(p), string(prev))
	}
	if _, err := e.cli.Txn(ctx).If(m.IsOwner()).Then(op).Commit(); err != nil {
		e.log.Warn("restoring a checkpoint failed", "partition", p, "err", err)
	}
}

// lockKey is the key this session's mutex for p puts, whether it holds the
// lock or waits for it (concurrency.Mutex names it by the lease).
func (e *Engine) lockKey(p int, lease clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", e.keys.lock(p), int64(lease))
}
