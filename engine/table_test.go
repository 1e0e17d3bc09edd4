package engine

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The task table hands out each record once across its pages, finds each
// id at its own record, and reuses the records it freed.
func TestTaskTable_RecordsAcrossPages(t *testing.T) {
	tab := newTaskTable(4)
	const n = 2*recPageSize + 1
	id := func(k int) string { return fmt.Sprintf("task-%d", k) }
	taken := map[uint32]string{}
	add := func(k int) {
		t.Helper()
		i, _, err := tab.add(id(k), xxhash.Sum64String(id(k)), k%4)
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := taken[i]; dup {
			t.Fatalf("%s got record %d, %s's", id(k), i, other)
		}
		taken[i] = id(k)
	}
	for k := range n {
		add(k)
	}
	for k := range n {
		if i, r, ok := tab.lookup(id(k)); !ok || taken[i] != id(k) || tab.id(r) != id(k) {
			t.Fatalf("lookup %s: record %d (%s), %v", id(k), i, taken[i], ok)
		}
	}
	pages := len(tab.pages)
	for k := range recPageSize {
		i, _, _ := tab.lookup(id(k))
		tab.remove(i, xxhash.Sum64String(id(k)))
		delete(taken, i)
	}
	for k := n; k < n+recPageSize; k++ {
		add(k)
	}
	if len(tab.pages) != pages {
		t.Errorf("%d pages after freed records were reused, want %d", len(tab.pages), pages)
	}
}

// Once freed ids take more than half of the id chunks (and a chunk at
// least), the live ids move to fresh chunks: each still reads as itself,
// and the chunks shrink.
func TestTaskTable_CompactsFreedIDs(t *testing.T) {
	tab := newTaskTable(1)
	id := func(k int) string { return fmt.Sprintf("%0200d", k) }
	const n = 4 * idChunkSize / 200
	for k := range n {
		if _, _, err := tab.add(id(k), xxhash.Sum64String(id(k)), 0); err != nil {
			t.Fatal(err)
		}
	}
	chunks := len(tab.chunks)
	for k := range n {
		if k%4 != 0 {
			i, _, _ := tab.lookup(id(k))
			tab.remove(i, xxhash.Sum64String(id(k)))
		}
	}
	if len(tab.chunks) >= chunks {
		t.Errorf("%d id chunks after three quarters of the ids were freed, %d before", len(tab.chunks), chunks)
	}
	for k := 0; k < n; k += 4 {
		if _, r, ok := tab.lookup(id(k)); !ok || tab.id(r) != id(k) {
			t.Fatalf("lookup of a live id after the compaction: %v", ok)
		}
	}
}

// Ids whose hashes collide share a chain: removing one, at its head or
// within it, leaves the others found.
func TestTaskTable_RemoveFromAHashChain(t *testing.T) {
	for _, gone := range []int{0, 1, 2} {
		tab := newTaskTable(1)
		const h = 42 // one hash for all, as a collision would give
		var recs []uint32
		for k := range 3 {
			i, _, err := tab.add(fmt.Sprint(k), h, 0)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, i)
		}
		tab.remove(recs[gone], h)
		var chain []string
		for i, ok := tab.index[h]; ok && i != nilRec; i = tab.rec(i).hnext {
			chain = append(chain, tab.id(tab.rec(i)))
		}
		if len(chain) != 2 || slices.Contains(chain, fmt.Sprint(gone)) {
			t.Errorf("removed %d of a chain of 3: chain %v", gone, chain)
		}
	}
}
