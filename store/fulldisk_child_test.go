package store

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardcron/shardcron/task"
)

// fullDiskChildEnv, when set to "<case>:<dir>", turns the test binary
// into a store on the filesystem of dir, which the tests of
// diskfull_linux_test.go fill and watch (see TestMain): case is
// "compaction" (compactionChild), "reset" (resetChild) or "batch"
// (batchChild). The child prints what happened and exits 0, or dies (of
// SIGBUS, what those tests look for).
const fullDiskChildEnv = "STORE_FULL_DISK_CHILD"

func fullDiskChild(arg string) {
	what, dir, _ := strings.Cut(arg, ":")
	switch what {
	case "compaction":
		compactionChild(dir)
	case "reset":
		resetChild(dir)
	case "batch":
		batchChild(dir)
	}
	childFatal("unknown case %q", what)
}

// childFatal prints what went wrong, for the test to show, and ends the
// child with exit status 2.
func childFatal(format string, args ...any) {
	fmt.Printf(format+"\n", args...)
	os.Exit(2)
}

// childConfig is the config of a child's store in dir/cache: 4 MiB
// memtables, so MinFreeBytes is 16 MiB, and its warnings logged to
// stderr.
func childConfig(dir string) Config {
	cfg := DefaultConfig(filepath.Join(dir, "cache"))
	cfg.MemTableSize = 4 << 20
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return cfg
}

func openChildStore(cfg Config) *Store {
	s, err := Open(cfg)
	if err != nil {
		childFatal("open: %v", err)
	}
	return s
}

// leaveFree fills dir's filesystem but for MinFreeBytes and extra bytes.
func leaveFree(cfg Config, dir string, extra int64) {
	free, err := freeBytes(cfg.Dir)
	if err != nil {
		childFatal("free space: %v", err)
	}
	filler := bytes.Repeat([]byte{1}, int(free-cfg.minFree()-extra))
	if err := os.WriteFile(filepath.Join(dir, "filler"), filler, 0o600); err != nil {
		childFatal("fill: %v", err)
	}
}

// compactionChild writes execution records into a store in dir until
// level 0 holds 4 tables, one memtable flush short of Badger's compaction
// into the level below (about 20 MiB to write), fills dir's filesystem
// but for MinFreeBytes and 8 MiB, then keeps writing, flushing and
// pausing for 3 s, and prints how many records were lost.
func compactionChild(dir string) {
	cfg := childConfig(dir)
	s := openChildStore(cfg)
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
			childFatal("write before the disk fills: %v", err)
		}
		if n > 2_000_000 {
			childFatal("level 0 never reached 4 tables")
		}
		l0 = s.db.Levels()[0].NumTables
	}
	leaveFree(cfg, dir, 8<<20)
	for range 60 {
		_ = write()
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("lost %d of %d\n", s.WriteFailed(), n)
	if err := s.Close(); err != nil {
		childFatal("close: %v", err)
	}
	os.Exit(0)
}

// resetChild fills dir's filesystem but for MinFreeBytes and 4 MiB, then
// resets a partition to 64 MiB of tasks (a split Reset: far more than one
// transaction) and prints how it ended.
func resetChild(dir string) {
	cfg := childConfig(dir)
	s := openChildStore(cfg)
	leaveFree(cfg, dir, 4<<20)
	tasks := make([]KV, 4096)
	for i := range tasks {
		tasks[i] = KV{ID: fmt.Sprintf("task-%06d", i), Value: bytes.Repeat([]byte{'v'}, 16<<10)}
	}
	err := s.Reset(0, 1, tasks)
	rev, perr := s.Partition(0, nil)
	fmt.Printf("reset: %v; partition 0 at revision %d (%v)\n", err, rev, perr)
	if err := s.Close(); err != nil {
		childFatal("close: %v", err)
	}
	os.Exit(0)
}

// batchChild fills dir's filesystem but for MinFreeBytes and 4 MiB, then
// has the history writer take 16 000 failures of 4 KiB of output each in
// one batch (64 MiB), and prints how it ended.
func batchChild(dir string) {
	cfg := childConfig(dir)
	cfg.FlushInterval = 10 * time.Second // the batch is taken by Flush, whole
	s := openChildStore(cfg)
	leaveFree(cfg, dir, 4<<20)
	output := strings.Repeat("o", 4096)
	const n = 16_000 // under a quarter of HistoryBuffer: the writer is not woken before Flush
	for i := range n {
		e := exec1(fmt.Sprintf("task-%06d", i), i, 1, task.ExecutionFailed)
		e.Output = output
		s.Record(e)
	}
	err := s.Flush(context.Background())
	fmt.Printf("flush: %v; lost %d of %d\n", err, s.WriteFailed(), n)
	if err := s.Close(); err != nil {
		childFatal("close: %v", err)
	}
	os.Exit(0)
}
