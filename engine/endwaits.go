package engine

import (
	"maps"
	"slices"
	"sync"
)

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
// partition, and of them those a watermark value carries.
type endWaitMarks struct {
	mu    sync.Mutex // guards parts and value
	parts map[int]endWaits
	// value is what a watermark value carries: the marks of parts, by
	// partition and id in order, while they fit maxEndWaits and
	// maxEndWaitBytes (those left out stay, ended, after their resume),
	// but for those whose revision is not known. Replaced, never
	// changed, so that the writer may keep the one it wrote.
	value map[int]endWaits
}

// carried returns the marks a watermark value carries (nil: none), not
// to be changed.
func (m *endWaitMarks) carried() map[int]endWaits {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.value
}

// publish replaces the marks of the partitions of ends (no IDs: none).
func (m *endWaitMarks) publish(ends map[int]endWaits) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.parts == nil {
		m.parts = map[int]endWaits{}
	}
	for p, e := range ends {
		if len(e.IDs) == 0 {
			delete(m.parts, p)
		} else {
			m.parts[p] = e
		}
	}
	m.value = nil
	n, size := 0, 0
	for _, p := range slices.Sorted(maps.Keys(m.parts)) {
		e := m.parts[p]
		if e.Applied == 0 {
			continue // nothing to judge them by: a successor would drop them
		}
		k := 0
		for _, id := range e.IDs {
			idSize := jsonSize(id) + 1 // and its comma
			if n == maxEndWaits || size+idSize > maxEndWaitBytes {
				break
			}
			n, size, k = n+1, size+idSize, k+1
		}
		if k > 0 {
			if m.value == nil {
				m.value = map[int]endWaits{}
			}
			m.value[p] = endWaits{Applied: e.Applied, IDs: e.IDs[:k:k]}
		}
		if k < len(e.IDs) {
			break
		}
	}
}

// sameEndWaits reports whether two values carry the same marks.
func sameEndWaits(a, b map[int]endWaits) bool {
	return maps.EqualFunc(a, b, func(x, y endWaits) bool { return x.Applied == y.Applied && slices.Equal(x.IDs, y.IDs) })
}

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
