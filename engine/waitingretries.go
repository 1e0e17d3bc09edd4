package engine

import (
	"cmp"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// The retries waiting in the wheel for their backoff (loop.retries). A
// release hands its partitions' over (checkpoint pending, handedRetry); so
// that a crash or a fence, which write no checkpoint, do not lose them,
// the loop publishes them by partition (publishRetries) and every
// watermark write carries them (watermarkValue.Retries), for a successor
// to run as a release's, of the tasks the crashed owner had
// (heldRetries). A retry that comes due and starts after the session's
// last acknowledged write runs again there (at least once, as a fire
// past the watermark); one that waits after that write, or within a
// WatermarkInterval before it (publishRetriesDue), is lost, and so is one
// that came due before it, its slot freed, and had not started when the
// node crashed (queued behind busy workers).
//
// Not the fires of the schedule waiting for the running one (buffer_one:
// loop.pending), which a crash loses: carried alike, the successor ran
// one that a node cut off from etcd had started before it fenced, after
// its last acknowledged write (TestChaos_CutOffNodeKeepsConcurrencyPolicies:
// 3 fires twice). Carrying them needs a node to start such a fire only
// once a write that no longer lists it is acknowledged.

// waitingRetries are a partition's waiting retries, as a release lists
// them (handedRetry), and the revision up to which their owner had armed
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
// node of the version before) is taken whole.
func (w waitingRetries) unstarted(at int64) waitingRetries {
	if w.through == 0 {
		return w
	}
	out := waitingRetries{Applied: w.Applied, through: w.through}
	for _, f := range w.Fires {
		if due := f.Due.UnixNano(); due <= w.through || due > at {
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

// publishRetries publishes, for the watermark writes, the waiting retries
// of the partitions whose retries changed (retryChanged), each with its
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
		if len(l.retryIn[p]) == 0 {
			delete(l.retryChanged, p)
		}
	}
	l.retryMarks.publish(lists)
}

// publishRetriesDue publishes the waiting retries that changed
// (publishRetries), at most once a WatermarkInterval: a value is written
// no more often. Called only from the dispatch loop.
func (l *loop) publishRetriesDue() {
	if len(l.retryChanged) == 0 {
		return
	}
	if now := l.cfg.Clock.Now().UnixNano(); now >= l.retriesAt {
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
	slices.SortFunc(fires, func(a, b pendingFire) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), a.At.Compare(b.At), cmp.Compare(a.Attempt, b.Attempt))
	})
	return waitingRetries{Applied: l.parts[p].applied, Fires: fires, through: l.through, sizes: make([]int, len(fires))}
}

// jsonSize is the size of f's JSON, as json.Marshal writes it, without
// marshaling f when it has no override and an ASCII id: a publish sizes
// up to maxWaitingRetries of them, each time their partition's list
// changes (BenchmarkFailedBurst).
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
	return n
}
