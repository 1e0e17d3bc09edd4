//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/internal/childproc"
	"github.com/shardcron/shardcron/internal/tmpfs"
	"github.com/shardcron/shardcron/task"
)

// TestStore_RealDiskFull fills the filesystem of an open store (a small
// tmpfs) to the last byte. Writes are then refused with ErrDiskFull and
// counted, where Badger, writing its log through a sparse memory-mapped
// file, would die of SIGBUS; once space is freed they succeed again.
func TestStore_RealDiskFull(t *testing.T) {
	fs := tmpfs.Mount(t, 64<<20)
	cfg := DefaultConfig(filepath.Join(fs, "cache"))
	cfg.MemTableSize = 4 << 20 // a log file of 8 MiB; 16 MiB kept free
	s := openTest(t, cfg)
	if err := s.Apply(0, 1, []KV{{ID: "a", Value: []byte("1")}}, nil); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(fs, "filler")
	tmpfs.Fill(t, filler)

	// About 40 MiB of records: five times the log file, which the kernel
	// could not back.
	long := strings.Repeat("x", 400)
	const n = 100_000
	for i := range n {
		e := exec1(fmt.Sprintf("task-%d", i%1000), i, 1, task.ExecutionFailed)
		e.Error = long
		s.Record(e)
		if i%10_000 == 9_999 {
			if err := s.Flush(context.Background()); !errors.Is(err, ErrDiskFull) {
				t.Fatalf("Flush on a full disk = %v, want ErrDiskFull", err)
			}
		}
	}
	if got := s.WriteFailed(); got != n {
		t.Errorf("WriteFailed = %d, want %d", got, n)
	}
	err := s.Apply(0, 2, []KV{{ID: "b", Value: []byte("2")}}, nil)
	if !errors.Is(err, ErrDiskFull) || !strings.Contains(err.Error(), fs) {
		t.Fatalf("Apply on a full disk = %v, want ErrDiskFull naming the directory", err)
	}
	t.Logf("Apply: %v", err)
	var ids []string
	if rev, err := s.Partition(0, func(id string, _ []byte, _ int64) error { ids = append(ids, id); return nil }); err != nil || rev != 1 || len(ids) != 1 {
		t.Fatalf("partition 0 after the refused Apply: revision %d, tasks %v, %v; want 1 and [a]", rev, ids, err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		s.Record(exec1("after", i, 1, task.ExecutionOK))
	}
	flush(t, s)
	if got := history(t, s, "after", 0); len(got) != 5 {
		t.Fatalf("%d records written once space was freed, want 5", len(got))
	}
	if err := s.Apply(0, 2, []KV{{ID: "b", Value: []byte("2")}}, nil); err != nil {
		t.Fatalf("Apply once space was freed: %v", err)
	}
}

// TestStore_CompactionOnANearlyFullDisk: writes that leave MinFreeBytes
// free can still set off a compaction that needs more (Badger writes its
// output in full before it deletes its input, through memory-mapped
// files: a SIGBUS on a full disk). A child process leaves Badger one
// memtable flush short of compacting level 0 (about 20 MiB to write) with
// MinFreeBytes and 8 MiB free, then writes on: its writes are refused, and
// the records lost counted, before the compaction can have no room, where
// the child died of SIGBUS in Badger's table.CreateTable.
func TestStore_CompactionOnANearlyFullDisk(t *testing.T) {
	out := runFullDiskChild(t, "compaction")
	var lost, of int
	if _, err := fmt.Sscanf(out, "lost %d of %d", &lost, &of); err != nil || lost == 0 {
		t.Fatalf("child: %q, want records lost to the full disk", out)
	}
	t.Logf("child: %s", out)
}

// TestStore_SplitResetOnANearlyFullDisk: a Reset too big for one
// transaction writes in several, which the room check at its start did
// not cover: 64 MiB of tasks with MinFreeBytes and 4 MiB free. It stops
// with ErrDiskFull before the disk is full, the partition reading as never
// synced, where the child died of SIGBUS.
func TestStore_SplitResetOnANearlyFullDisk(t *testing.T) {
	out := runFullDiskChild(t, "reset")
	if !strings.Contains(out, "reset: store: reset partition 0 at revision 1: store: disk full") ||
		!strings.Contains(out, "partition 0 at revision 0 (<nil>)") {
		t.Fatalf("child: %q, want the Reset refused for a full disk and partition 0 unsynced", out)
	}
	t.Logf("child: %s", out)
}

// TestStore_BigHistoryBatchOnANearlyFullDisk: the history writer's batch
// can take far more than MinFreeBytes (up to HistoryBuffer records of up
// to 4 KiB of output each): 64 MiB with MinFreeBytes and 4 MiB free. It
// stops with ErrDiskFull before the disk is full, the batch counted as
// lost, where the child died of SIGBUS.
func TestStore_BigHistoryBatchOnANearlyFullDisk(t *testing.T) {
	out := runFullDiskChild(t, "batch")
	if !strings.Contains(out, "flush: store: write history: store: disk full") ||
		!strings.Contains(out, "lost 16000 of 16000") {
		t.Fatalf("child: %q, want the batch refused for a full disk and counted", out)
	}
	t.Logf("child: %s", out)
}

// runFullDiskChild runs what (fullDiskChild) in a child process on a
// tmpfs of 256 MiB and returns what it printed, failing the test with the
// fault and its stack when the child dies.
func runFullDiskChild(t *testing.T, what string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("spawns a process")
	}
	fs := tmpfs.Mount(t, 256<<20)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fullDiskChildEnv+"="+what+":"+fs)
	cmd.SysProcAttr = childproc.Attr() // killed with the test, not left filling the tmpfs
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		// The fault and the stack of the goroutine it hit, the first.
		fault, stacks, _ := strings.Cut(stderr.String(), "\n\ngoroutine ")
		first, _, _ := strings.Cut(stacks, "\n\ngoroutine ")
		t.Fatalf("child: %v\nstdout: %s\nstderr: %.4000s\ngoroutine %.4000s", err, out, fault, first)
	}
	return string(out)
}
