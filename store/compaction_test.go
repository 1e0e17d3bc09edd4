package store

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/y"
	"github.com/shardcron/shardcron/task"
)

// tableInfo is a table of level with keys from left to right and size MiB.
func tableInfo(level int, left, right string, size uint32) badger.TableInfo {
	return badger.TableInfo{Level: level, Left: y.KeyWithTs([]byte(left), 1), Right: y.KeyWithTs([]byte(right), 1), OnDiskSize: size << 20}
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
		})
	}
}

// compactionChildEnv, when set to a directory, turns the test binary into
// the store that TestStore_CompactionOnANearlyFullDisk watches (see
// TestMain).
const compactionChildEnv = "STORE_COMPACTION_CHILD_DIR"

// compactionChild writes execution records into a store in dir until
// level 0 holds 4 tables, one memtable flush short of Badger's compaction
// into the level below (about 20 MiB to write), fills dir's filesystem
// but for MinFreeBytes and 8 MiB, then keeps writing, flushing and
// pausing for 3 s, and prints how many records were lost.
func compactionChild(dir string) {
	fail := func(format string, args ...any) {
		fmt.Printf(format+"\n", args...)
		os.Exit(2)
	}
	cfg := DefaultConfig(filepath.Join(dir, "cache"))
	cfg.MemTableSize = 4 << 20
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := Open(cfg)
	if err != nil {
		fail("open: %v", err)
	}
	long := strings.Repeat("x", 300)
	n := 0
	write := func() error {
		for range 2000 {
			e := exec1(fmt.Sprintf("task-%08d", n), n, 1, task.ExecutionFailed)
			e.Error = long
			s.Record(e)
			n++
		}
		return s.Flush(context.Background())
	}
	for l0 := 0; l0 < 4; {
		if err := write(); err != nil {
			fail("write before the disk fills: %v", err)
		}
		if n > 2_000_000 {
			fail("level 0 never reached 4 tables")
		}
		l0 = s.db.Levels()[0].NumTables
	}
	free, err := freeBytes(cfg.Dir)
	if err != nil {
		fail("free space: %v", err)
	}
	filler, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		fail("%v", err)
	}
	if _, err := filler.Write(bytes.Repeat([]byte{1}, int(free-cfg.minFree()-8<<20))); err != nil {
		fail("fill: %v", err)
	}
	filler.Close()
	for range 60 {
		_ = write()
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("lost %d of %d\n", s.WriteFailed(), n)
	if err := s.Close(); err != nil {
		fail("close: %v", err)
	}
	os.Exit(0)
}
