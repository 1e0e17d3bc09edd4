package engine

import "slices"

// The marks of paused delete_after_fire tasks whose last fire ended here
// (flagEndWaits): the resume looks whether the task ended (checkEndWaits).
// A release hands its partitions' marks to the next owner (checkpoint
// EndWaits); so that a crash or a fence, which write no checkpoint, do not
// lose them, the loop publishes them by partition (publishEndWaits) and
// every watermark write carries them (watermarkValue.EndWaits), for a
// successor to judge as a release's (heldEndWaits). A mark set after the
// session's last acknowledged write is lost with it.

// endWaits are a partition's marked tasks, and the revision up to which
// their owner had armed the partition's changes when it published them:
// the next owner keeps the marks of the tasks that owner had as it had
// them (heldEndWaits), as it keeps a release's end_waits by its applied.
type endWaits struct {
	Applied int64    `json:"applied"`
	IDs     []string `json:"ids"`
}

// maxEndWaitBytes bounds the JSON of the task ids a watermark value
// carries, as maxEndWaits bounds their count: a value is written every
// WatermarkInterval and must stay well within etcd's request limit (ids
// of 256 characters that JSON escapes take 1.5 KiB each).
const maxEndWaitBytes = maxCheckpointBytes / 2

// endWaitMarks are the marks as the loop last published them, by
// partition, and of them those a watermark value carries (those left out
// stay, ended, after their resume).
type endWaitMarks = partLists[endWaits]

func (e endWaits) applied() int64        { return e.Applied }
func (e endWaits) len() int              { return len(e.IDs) }
func (e endWaits) size(i int) int        { return jsonSize(e.IDs[i]) + 1 }
func (e endWaits) prefix(k int) endWaits { return endWaits{Applied: e.Applied, IDs: e.IDs[:k:k]} }
func (endWaits) bounds() (n, bytes int)  { return maxEndWaits, maxEndWaitBytes }
func (e endWaits) equal(o endWaits) bool { return e.Applied == o.Applied && slices.Equal(e.IDs, o.IDs) }

// markEndWaits marks record i: its fire ended while it was paused, or a
// pause alone came before the deleter's delete. Called only from the
// dispatch loop.
func (l *loop) markEndWaits(i uint32, r *record) {
	if r.flags&flagEndWaits != 0 {
		return
	}
	r.flags |= flagEndWaits
	p := int(r.part)
	if l.endMarked[p] == nil {
		l.endMarked[p] = map[uint32]struct{}{}
	}
	l.endMarked[p][i] = struct{}{}
	l.endChanged[p] = true
}

// clearEndWaits takes record i's mark, if it has one. Called only from the
// dispatch loop.
func (l *loop) clearEndWaits(i uint32, r *record) {
	if r.flags&flagEndWaits == 0 {
		return
	}
	r.flags &^= flagEndWaits
	p := int(r.part)
	delete(l.endMarked[p], i)
	if len(l.endMarked[p]) == 0 {
		delete(l.endMarked, p)
	}
	l.endChanged[p] = true
}

// publishEndWaits publishes, for the watermark writes, the marks of the
// partitions whose marks changed (endChanged), each with its applied
// revision as it stands between commands: every change armed up to it is
// in the marks (an edit took its task's), so that a successor judging
// them by it keeps no mark an edit took. Taken as the mark changed, it
// could be past an edit of a marked task the command had yet to arm. A
// partition whose revision is not known yet (a load of several chunks)
// publishes again once it is (setApplied). Sorted, a partition's marks
// make the same value until they change. Called only from the dispatch
// loop.
func (l *loop) publishEndWaits() {
	ends := make(map[int]endWaits, len(l.endChanged))
	for p := range l.endChanged {
		ids := make([]string, 0, len(l.endMarked[p]))
		for i := range l.endMarked[p] {
			ids = append(ids, l.tab.id(l.tab.rec(i)))
		}
		slices.Sort(ids)
		ends[p] = endWaits{Applied: l.parts[p].applied, IDs: ids}
	}
	clear(l.endChanged)
	l.endMarks.publish(ends)
}
