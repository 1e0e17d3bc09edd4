package engine

import (
	"maps"
	"slices"
	"sync"
)

// What a watermark write carries, by partition, for a successor after a
// crash or a fence, which writes no checkpoint: the marks of ended paused
// delete_after_fire tasks (endwaits.go) and the retries waiting for their
// backoff (waitingretries.go). The loop publishes a partition's list
// between commands whenever it changes, with the revision up to which it
// had armed the partition's changes then, by which a successor judges
// which of the tasks it names are still the tasks they were.

// partList is a partition's list as the loop publishes it.
type partList[L any] interface {
	applied() int64 // the revision to judge the list by; 0: not known
	len() int
	// size is the JSON of entry i, and its comma.
	size(i int) int
	// prefix is the list's first k entries.
	prefix(k int) L
	// bounds are what a value carries at most of such lists in all:
	// entries, and bytes of their JSON.
	bounds() (n, bytes int)
	equal(o L) bool
}

// partLists are lists as the loop last published them, by partition,
// and of them those a watermark value carries.
type partLists[L partList[L]] struct {
	mu    sync.Mutex // guards parts, value and seq
	parts map[int]L
	// value is what a watermark value carries: the lists of parts, by
	// partition and entry in order, while they fit the bounds (those left
	// out are lost in a crash), but for those whose revision is not
	// known. Replaced, never changed, so that the writer may keep the one
	// it wrote.
	value map[int]L
	// seq counts the publishes: value is the seq-th's. A fire of the
	// schedule that waited for the running one goes by it (loop.gated).
	seq uint64
}

// carried returns the lists a watermark value carries (nil: none), not to
// be changed.
func (m *partLists[L]) carried() map[int]L {
	v, _ := m.carriedAt()
	return v
}

// carriedAt returns carried's lists and the publish they are of.
func (m *partLists[L]) carriedAt() (map[int]L, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.value, m.seq
}

// publish replaces the lists of the partitions of lists (empty: none),
// and returns which publish it was (seq).
func (m *partLists[L]) publish(lists map[int]L) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	if m.parts == nil {
		m.parts = map[int]L{}
	}
	for p, l := range lists {
		if l.len() == 0 {
			delete(m.parts, p)
		} else {
			m.parts[p] = l
		}
	}
	m.value = nil
	var zero L
	most, mostBytes := zero.bounds()
	n, size := 0, 0
	for _, p := range slices.Sorted(maps.Keys(m.parts)) {
		l := m.parts[p]
		if l.applied() == 0 {
			continue // nothing to judge them by: a successor would drop them
		}
		k := 0
		for ; k < l.len(); k++ {
			s := l.size(k)
			if n == most || size+s > mostBytes {
				break
			}
			n, size = n+1, size+s
		}
		if k > 0 {
			if m.value == nil {
				m.value = map[int]L{}
			}
			m.value[p] = l.prefix(k)
		}
		if k < l.len() {
			break
		}
	}
	return m.seq
}

// sameLists reports whether two values carry the same lists.
func sameLists[L partList[L]](a, b map[int]L) bool {
	return maps.EqualFunc(a, b, func(x, y L) bool { return x.equal(y) })
}

// carriedLists are the lists a watermark value carries.
type carriedLists struct {
	ends    map[int]endWaits
	retries map[int]waitingRetries
}
