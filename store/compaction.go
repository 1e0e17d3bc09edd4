package store

import (
	"cmp"
	"slices"
	"sort"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/y"
)

// compactionRoom returns the most that Badger's compactions may write
// before they delete what they compact. A compaction writes its output
// tables whole, each into a file it sizes first and maps into memory (so
// on a full disk it dies of SIGBUS as a write of the log does), and
// deletes its input only after; it writes no more than it reads. Its
// input is:
//   - from level 0, every level-0 table, the memtables still to become
//     level-0 tables (memtables bytes), and the whole of the first
//     non-empty level below;
//   - from a deeper level, one table and the tables of the level below
//     whose keys overlap it;
//   - within the last level (maxLevel), one table and its neighbours up
//     to its size again (Badger's rewrite of stale data).
//
// Up to compactors compactions run at once: the room is the sum of the
// compactors largest inputs. tables is Badger's list (DB.Tables).
func compactionRoom(tables []badger.TableInfo, memtables int64, maxLevel, compactors int) int64 {
	levels := make([][]badger.TableInfo, maxLevel+1)
	for _, t := range tables {
		if t.Level >= 0 && t.Level <= maxLevel {
			levels[t.Level] = append(levels[t.Level], t)
		}
	}
	l0 := memtables + levelSize(levels[0])
	for _, below := range levels[1:] {
		if len(below) > 0 {
			l0 += levelSize(below)
			break
		}
	}
	inputs := []int64{l0}
	for i := 1; i <= maxLevel; i++ {
		if i == maxLevel {
			for _, t := range levels[i] {
				inputs = append(inputs, 2*int64(t.OnDiskSize))
			}
			continue
		}
		below := newKeyOrder(levels[i+1])
		for _, t := range levels[i] {
			inputs = append(inputs, int64(t.OnDiskSize)+below.overlap(t.Left, t.Right))
		}
	}
	slices.SortFunc(inputs, func(a, b int64) int { return cmp.Compare(b, a) })
	var room int64
	for _, n := range inputs[:min(compactors, len(inputs))] {
		room += n
	}
	return room
}

// compactionBound is at least compactionRoom of tables of tableBytes in
// all and memtables of memtables bytes at most, with no look at the
// tables: an input from level 0 is at most the memtables and every table,
// one from a deeper level at most every table, and one within the last
// level twice its table, so at most twice every table.
func compactionBound(tableBytes, memtables int64, compactors int) int64 {
	return int64(compactors) * (2*tableBytes + memtables)
}

func levelSize(tables []badger.TableInfo) int64 {
	var n int64
	for _, t := range tables {
		n += int64(t.OnDiskSize)
	}
	return n
}

// keyOrder is a level below level 0, whose tables' key ranges do not
// overlap, in key order, with the sum of their sizes up to each.
type keyOrder struct {
	tables []badger.TableInfo
	upTo   []int64 // upTo[i]: the sizes of tables[:i]
}

func newKeyOrder(tables []badger.TableInfo) keyOrder {
	slices.SortFunc(tables, func(a, b badger.TableInfo) int { return y.CompareKeys(a.Left, b.Left) })
	upTo := make([]int64, len(tables)+1)
	for i, t := range tables {
		upTo[i+1] = upTo[i] + int64(t.OnDiskSize)
	}
	return keyOrder{tables, upTo}
}

// overlap returns the size of the tables whose keys overlap [left, right].
func (o keyOrder) overlap(left, right []byte) int64 {
	from := sort.Search(len(o.tables), func(i int) bool {
		return y.CompareKeys(o.tables[i].Right, left) >= 0
	})
	to := sort.Search(len(o.tables), func(i int) bool {
		return y.CompareKeys(o.tables[i].Left, right) > 0
	})
	if to <= from {
		return 0
	}
	return o.upTo[to] - o.upTo[from]
}
