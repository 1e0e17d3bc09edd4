package store

import (
	"testing"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/y"
)

// tableInfo is a table of level with keys from left to right and size MiB.
func tableInfo(level int, left, right string, size uint32) badger.TableInfo {
	return badger.TableInfo{
		Level: level, OnDiskSize: size << 20,
		Left: y.KeyWithTs([]byte(left), 1), Right: y.KeyWithTs([]byte(right), 1),
	}
}

func TestCompactionRoom(t *testing.T) {
	tests := []struct {
		name       string
		tables     []badger.TableInfo
		memtables  int64
		compactors int
		want       int64 // MiB
	}{
		{"empty", nil, 0, 2, 0},
		{"memtables alone", nil, 12 << 20, 2, 12},
		{"level 0 with the first level below, which is not level 1", []badger.TableInfo{
			tableInfo(0, "a", "z", 4), tableInfo(0, "a", "z", 4),
			tableInfo(3, "a", "f", 2), tableInfo(3, "g", "p", 2), tableInfo(6, "a", "z", 3),
		}, 12 << 20, 1, 4 + 4 + 12 + 2 + 2},
		{"a table with the tables below it overlaps", []badger.TableInfo{
			tableInfo(1, "c", "h", 3),
			tableInfo(2, "a", "b", 5), tableInfo(2, "c", "d", 5), tableInfo(2, "e", "f", 5),
			tableInfo(2, "h", "k", 5), tableInfo(2, "l", "z", 5),
		}, 0, 1, 3 + 5 + 5 + 5},
		{"the last level's tables, twice", []badger.TableInfo{
			tableInfo(6, "a", "m", 8), tableInfo(6, "n", "z", 9),
		}, 0, 1, 18},
		{"two compactors: the two largest", []badger.TableInfo{
			tableInfo(0, "a", "z", 1),
			tableInfo(5, "a", "c", 1), tableInfo(5, "d", "z", 1),
			tableInfo(6, "a", "b", 7), tableInfo(6, "c", "z", 30),
		}, 0, 2, 2*30 + (1 + 7 + 30)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := compactionRoom(tt.tables, tt.memtables, 6, tt.compactors); got != tt.want<<20 {
				t.Errorf("compactionRoom = %d MiB, want %d MiB", got>>20, tt.want)
			}
			// checkRoom's quick check: under the bound, a write could
			// set off a compaction the disk has no room for.
			if bound := compactionBound(levelSize(tt.tables), tt.memtables, tt.compactors); bound < tt.want<<20 {
				t.Errorf("compactionBound = %d MiB, less than the room, %d MiB", bound>>20, tt.want)
			}
		})
	}
}
