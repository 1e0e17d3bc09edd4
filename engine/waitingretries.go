package engine

import (
	"cmp"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// The retries waiting in the wheel for their backoff (loop.retries), and
// the fires of the schedule waiting for the running one (buffer_one:
// loop.pending). A release hands its partitions' over (checkpoint
// pending, handedRetry, handedFire); so that a crash or a fence, which
// write no checkpoint, do not lose them, the loop publishes them by
// partition (publishRetries) and every watermark write carries them
// (watermarkValue.Retries), for a successor to run as a release's, of
// the tasks the crashed owner had, and of the waiting fires those due by
// its resume point: it fires the others from the schedule (heldRetries).
// A retry that comes due and starts after the session's last
// acknowledged write runs again there (at least once, as a fire past the
// watermark); one that waits after that write, or within a
// WatermarkInterval before it (publishRetriesDue), is lost, and so is one
// that came due before it, its slot freed, and had not started when the
// node crashed (queued behind busy workers). A waiting fire that a list
// named starts only once etcd acknowledged a value that no longer lists
// it (gate), so that it runs once: a node cut off from etcd never starts
// it. One that began waiting after the last write, or within a
// WatermarkInterval before it, is lost unless the schedule's resume point
// is before it, and so is one that the acknowledgement let go and that
// had not started when the node crashed, as a retry queued behind busy
// workers is.

// waitingRetries are a partition's waiting retries and fires, as a
// release lists them (handedRetry, handedFire: the fire's with its due
// time), and the revision up to which their owner had armed
// the partition's changes when it published them: the successor runs
// those of the tasks that owner had (heldRetries).
type waitingRetries struct {
	Applied int64         `json:"applied"`
	Fires   []pendingFire `json:"fires"`
	// through is the loop's dispatch point when it published them (0: not
	// known), which a value carries for all its lists, the latest
	// (watermarkValue.RetriesThrough): a successor tells by it the
	// retries that started by the session's watermark (unstarted).
	through int64
	// sizes are the JSON sizes of Fires with their commas, 0 until
	// computed (size): an override takes up to 16 KiB, and the lists of
	// the partitions that did not change are bounded again at every
	// publish.
	sizes []int
}

// maxWaitingRetries and maxWaitingRetryBytes bound the retries a watermark
// value carries, their count and their JSON: a value is written every
// WatermarkInterval, and a retry's override takes up to 16 KiB.
const (
	maxWaitingRetries    = maxHandOver / 2
	maxWaitingRetryBytes = maxCheckpointBytes / 4
)

// retryMarks are the waiting retries as the loop last published them, by
// partition, and of them those a watermark value carries (those left out
// are lost in a crash).
type retryMarks = partLists[waitingRetries]

func (w waitingRetries) applied() int64 { return w.Applied }
func (w waitingRetries) len() int       { return len(w.Fires) }

// size is called only under the lists' lock: it fills sizes in.
func (w waitingRetries) size(i int) int {
	if w.sizes[i] == 0 {
		w.sizes[i] = w.Fires[i].jsonSize() + 1
	}
	return w.sizes[i]
}

func (w waitingRetries) prefix(k int) waitingRetries {
	return waitingRetries{Applied: w.Applied, Fires: w.Fires[:k:k], through: w.through, sizes: w.sizes[:k:k]}
}
func (waitingRetries) bounds() (n, bytes int) { return maxWaitingRetries, maxWaitingRetryBytes }

// equal compares through too: a retry handed away and back already due
// is listed again as it was, but armed after the through of the list
// before, which would take it for one that started.
func (w waitingRetries) equal(o waitingRetries) bool {
	return w.Applied == o.Applied && w.through == o.through && slices.Equal(w.Fires, o.Fires)
}

// unstarted returns w, a dead session's, without the retries that started
// there by its watermark at (unix ns). The loop publishes at most once a
// WatermarkInterval, and a list still names the retries that came due
// since: one due after through waited in the wheel when its list was
// published, so that the dispatch point passed its time only once the
// wheel released it, and the watermark only once a worker took it. One
// due by through was armed already due (a retry handed on late), and may
// not have been released by at. A list without through (a value of a
// node of the version before) is taken whole, and so are the fires that
// wait for the running one (buffer_one), which were past the watermark
// once released, and which start only once a value that no longer lists
// them is acknowledged (gate).
func (w waitingRetries) unstarted(at int64) waitingRetries {
	if w.through == 0 {
		return w
	}
	out := waitingRetries{Applied: w.Applied, through: w.through}
	for _, f := range w.Fires {
		if due := f.Due.UnixNano(); f.Attempt == 0 || due <= w.through || due > at {
			out.Fires = append(out.Fires, f)
		}
	}
	return out
}

// noteRetry notes that slot's retry changed its partition's waiting
// retries (it waits, or it no longer does): a slice by partition, each
// retry knowing its place (retryState.pos), not a map, as a downstream
// down makes a retry wait for every fire of a burst. Called only from the
// dispatch loop.
func (l *loop) noteRetry(slot uint32, waits bool) {
	rs := &l.retries[slot]
	p := int(rs.part)
	in := l.retryIn[p]
	if waits {
		rs.pos = uint32(len(in))
		l.retryIn[p] = append(in, slot)
	} else {
		last := in[len(in)-1]
		in[rs.pos] = last
		l.retries[last].pos = rs.pos
		l.retryIn[p] = in[:len(in)-1]
	}
	l.retryChanged[p] = true
}

// buffer holds fire f of record i until its running fire ends
// (buffer_one). A fire of the schedule waits among the partition's
// waiting fires, which the watermark writes carry: it is past the
// watermark once released (loop.publish), and a successor after a crash
// would fire it nowhere. A trigger's need not: its key stays in etcd
// until the fire starts. Called only from the dispatch loop.
func (l *loop) buffer(i uint32, r *record, f ownFire) {
	w := waitingFire{ownFire: f}
	if f.kind == kindSchedule {
		p := int(r.part)
		w.pos, w.since = uint32(len(l.bufferedIn[p])), l.retrySeq
		l.bufferedIn[p] = append(l.bufferedIn[p], i)
		l.retryChanged[p] = true
	}
	l.pending[i] = w
}

// unbuffer takes record i's waiting fire, if any, out of pending (buffer).
// Called only from the dispatch loop.
func (l *loop) unbuffer(i uint32) {
	w, ok := l.pending[i]
	if !ok {
		return
	}
	delete(l.pending, i)
	if w.kind != kindSchedule {
		return
	}
	p := int(l.tab.rec(i).part)
	in := l.bufferedIn[p]
	if last := in[len(in)-1]; last != i {
		in[w.pos] = last
		lw := l.pending[last]
		lw.pos = w.pos
		l.pending[last] = lw
	}
	l.bufferedIn[p] = in[:len(in)-1]
	l.retryChanged[p] = true
}

// waitingIn is how many fires of partition p wait: retries for their
// backoff, fires of the schedule for the running one.
func (l *loop) waitingIn(p int) int { return len(l.retryIn[p]) + len(l.bufferedIn[p]) }

// gatedJob is the job of a fire of the schedule that waited for the
// running one, held until etcd acknowledged a watermark value of the
// seq-th publish of the waiting fires or a later one (gate).
type gatedJob struct {
	job
	seq uint64
}

// gate holds l.jobs[n:], which admitWaiting queued for a fire that a
// publish of the waiting fires listed, until etcd acknowledged a value
// that no longer lists it: one of the next publish, which its leaving
// the list changed (unbuffer). A successor after a crash or a fence runs
// the fires of the last value etcd acknowledged; started at once, a node
// cut off from etcd started such a fire before it fenced, and its
// successor ran it again (TestEngine_CutOffNodeLeavesAListedWaitingFireToItsSuccessor).
// A node cut off never opens the gate: it fences, and its release lists
// the fire as waiting (releaseParts). A held job counts as running, so
// that the task's next fire waits behind it. Called only from the
// dispatch loop.
func (l *loop) gate(n int) {
	for _, j := range l.jobs[n:] {
		l.gated = append(l.gated, gatedJob{job: j, seq: l.retrySeq + 1})
	}
	clear(l.jobs[n:])
	l.jobs = l.jobs[:n]
}

// openGate queues the gated jobs of the publishes etcd acknowledged.
// Called only from the dispatch loop.
func (l *loop) openGate() {
	if len(l.gated) == 0 {
		return
	}
	acked, k := l.acked.retries.Load(), 0
	for k < len(l.gated) && l.gated[k].seq <= acked {
		l.jobs = append(l.jobs, l.gated[k].job)
		k++
	}
	if k == 0 {
		return
	}
	l.gated = slices.Delete(l.gated, 0, k)
	l.pushJobs()
}

// publishRetries publishes, for the watermark writes, the waiting retries
// and fires of the partitions where they changed (retryChanged), each with its
// applied revision as it stands between commands, as publishEndWaits
// does: a task deleted, or deleted and put again, by the changes armed up
// to it has no retry in the list (its record is gone), and one put again
// after it is created after it, which a successor tells. Sorted, a
// partition's retries make the same value until they change.
//
// It builds only the lists a value can carry, by partition in order as
// the value takes them: past maxWaitingRetries listed in the partitions
// before it, a changed partition publishes none and stays changed, to be
// built once those before it list fewer. A downstream that fails every
// task of a burst leaves a retry waiting for each, and rebuilding every
// changed partition's made the loop's time for the completions of a burst
// of 100 000 twice as long, the more so the more retries a partition
// holds (BenchmarkFailedBurst). Called only from the dispatch loop
// (publishRetriesDue).
func (l *loop) publishRetries() {
	lists := make(map[int]waitingRetries, len(l.retryChanged))
	// The retries the lists of the partitions before p carry: not those
	// waiting in them, of which a deleted task's wait to come due, for
	// nothing, and held the partitions after theirs out of every value.
	before := 0
	for p := range l.retryIn {
		if before >= maxWaitingRetries {
			break
		}
		if l.retryChanged[p] {
			lists[p] = l.waitingRetriesOf(p)
			l.retryListed[p] = len(lists[p].Fires)
			delete(l.retryChanged, p)
		}
		before += l.retryListed[p]
	}
	for p := range l.retryChanged {
		lists[p] = waitingRetries{} // none left, or none a value can carry: published so
		l.retryListed[p] = 0
		if l.waitingIn(p) == 0 {
			delete(l.retryChanged, p)
		}
	}
	l.retrySeq = l.retryMarks.publish(lists)
	for p, w := range lists {
		if len(w.Fires) > 0 {
			l.retryBuilt[p] = l.retrySeq
		}
	}
}

// publishRetriesDue publishes the waiting retries that changed
// (publishRetries), at most once a WatermarkInterval: a value is written
// no more often. A gated fire waits for the next publish, which comes too
// once etcd acknowledged the last: a write later, whatever the loop's
// clock says (a test's stands still). Called only from the dispatch loop.
func (l *loop) publishRetriesDue() {
	if len(l.retryChanged) == 0 {
		return
	}
	n := len(l.gated)
	waits := n > 0 && l.gated[n-1].seq > l.retrySeq && l.acked.retries.Load() >= l.retrySeq
	if now := l.cfg.Clock.Now().UnixNano(); now >= l.retriesAt || waits {
		l.publishRetries()
		l.retriesAt = now + int64(l.cfg.WatermarkInterval)
	}
}

// waitingRetriesOf returns partition p's waiting retries, as publishRetries
// publishes them.
func (l *loop) waitingRetriesOf(p int) waitingRetries {
	var fires []pendingFire
	for _, slot := range l.retryIn[p] {
		rs := &l.retries[slot]
		r := l.tab.rec(rs.rec)
		if r.flags&flagLive == 0 || r.gen != rs.gen {
			continue // its task was deleted: the retry runs nothing
		}
		fires = append(fires, handedRetry(l.tab.id(r), rs.sched, rs.attempt, rs.due, rs.extra))
	}
	for _, i := range l.bufferedIn[p] {
		r, at := l.tab.rec(i), l.pending[i].at
		// With its due time, which the successor's resume point is
		// compared with (heldRetries).
		f := handedFire(l.tab.id(r), at, kindSchedule)
		f.Due = time.Unix(0, at+l.delay(r, at)).UTC()
		fires = append(fires, f)
	}
	slices.SortFunc(fires, func(a, b pendingFire) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), a.At.Compare(b.At), cmp.Compare(a.Attempt, b.Attempt))
	})
	return waitingRetries{Applied: l.parts[p].applied, Fires: fires, through: l.through, sizes: make([]int, len(fires))}
}

// jsonSize is the size of f's JSON, as json.Marshal writes it, without
// marshaling f when it has no override and an ASCII id: a publish sizes
// up to maxWaitingRetries of them, each time their partition's list
// changes (BenchmarkFailedBurst, BenchmarkSlowBurst).
func (f pendingFire) jsonSize() int {
	if f.Override != nil {
		return jsonSize(f)
	}
	n := len(`{"id":"",`)
	for _, c := range []byte(f.ID) {
		switch {
		case c >= utf8.RuneSelf || c < ' ':
			return jsonSize(f)
		case c == '"' || c == '\\':
			n += 2
		case c == '<' || c == '>' || c == '&':
			n += len(`\u003c`)
		default:
			n++
		}
	}
	var buf [64]byte
	n += len(`"at":""}`) + len(f.At.AppendFormat(buf[:0], time.RFC3339Nano))
	if f.Backfill {
		n += len(`,"backfill":true`)
	}
	if f.Attempt != 0 {
		n += len(`,"attempt":`) + len(strconv.AppendUint(buf[:0], uint64(f.Attempt), 10))
	}
	if !f.Due.IsZero() {
		n += len(`,"due":""`) + len(f.Due.AppendFormat(buf[:0], time.RFC3339Nano))
	}
	if f.Trigger != 0 {
		n += len(`,"trigger":`) + len(strconv.AppendInt(buf[:0], f.Trigger, 10))
	}
	return n
}
