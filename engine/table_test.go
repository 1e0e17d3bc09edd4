package engine

import (
	"fmt"
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
