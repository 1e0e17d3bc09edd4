package store

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardcron/shardcron/task"
	"golang.org/x/sys/unix"
)

// BenchmarkOpen measures Open, which reads every block of every table
// (checkDir), on the cache of a node holding 1 M tasks (256 partitions)
// with 10 execution records each, written with the default Config. With
// cache=cold the page cache of the directory's files is emptied before
// each Open (posix_fadvise DONTNEED), as after a reboot; cache=warm as
// after a restart of the process. Building the directory takes about a
// minute: run it with -benchtime=3x.
func BenchmarkOpen(b *testing.B) {
	const tasks, partitions, records = 1_000_000, 256, 10
	cfg := DefaultConfig(b.TempDir())
	cfg.Logger = testConfig(b).Logger
	s, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for p := range partitions {
		var kvs []KV
		for i := p; i < tasks; i += partitions {
			kvs = append(kvs, KV{ID: fmt.Sprintf("task-%012d", i), Value: taskValue(i)})
		}
		if err := s.Reset(uint32(p), 1, kvs); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	for sec := range records {
		for i := range tasks {
			s.Record(exec1(fmt.Sprintf("task-%012d", i), sec, 1, task.ExecutionOK))
			if i%(DefaultHistoryBuffer/2) == 0 {
				if err := s.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	if d := s.Dropped(); d != 0 {
		b.Fatalf("%d records dropped", d)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	tables, err := filepath.Glob(filepath.Join(cfg.Dir, "*.sst"))
	if err != nil {
		b.Fatal(err)
	}
	var size int64
	for _, f := range tables {
		fi, err := os.Stat(f)
		if err != nil {
			b.Fatal(err)
		}
		size += fi.Size()
	}
	for _, cold := range []bool{false, true} {
		b.Run(fmt.Sprintf("cache=%s", map[bool]string{false: "warm", true: "cold"}[cold]), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				if cold {
					evictPageCache(b, cfg.Dir)
				}
				b.StartTimer()
				openTimed(b, cfg)
			}
			b.ReportMetric(float64(size)/(1<<20), "table-MiB")
			b.ReportMetric(float64(len(tables)), "tables")
		})
	}
}

// openTimed opens cfg, with the timer running, and closes the store with
// the timer stopped.
func openTimed(b *testing.B, cfg Config) {
	s, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
}

// evictPageCache drops the cached pages of the files under dir.
func evictPageCache(t testing.TB, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkCheckMemLogs measures the check of the memtable logs at Open
// (checkMemLogs) on the most a kill leaves with the default Config: the
// memtable being written and NumMemtables waiting for their flush, each
// nearly full (a log of about 12 MiB in a file of twice MemTableSize).
// With cache=cold the page cache of the logs is emptied before each
// check; what=open times the whole Open of a copy of that directory,
// Badger's replay of the logs included, for comparison.
func BenchmarkCheckMemLogs(b *testing.B) {
	cfg := DefaultConfig(b.TempDir())
	cfg.Logger = testConfig(b).Logger
	cfg.GCInterval = 0
	s := openTest(b, cfg)
	var kvs []KV
	for i := range 28_000 {
		kvs = append(kvs, KV{ID: fmt.Sprintf("task-%012d", i), Value: taskValue(i)})
	}
	if err := s.Reset(1, 1, kvs); err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(b.TempDir(), "killed")
	copySparse(b, dir, cfg.Dir)
	logs, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil || len(logs) != 1 {
		b.Fatalf("memtable logs %v (%v), want one", logs, err)
	}
	data, err := os.ReadFile(logs[0])
	if err != nil {
		b.Fatal(err)
	}
	end, _, err := walkLog(data)
	if err != nil {
		b.Fatal(err)
	}
	for fid := 2; fid <= 1+cfg.NumMemtables; fid++ {
		copySparseFile(b, filepath.Join(dir, fmt.Sprintf("%05d.mem", fid)), logs[0])
	}
	logMiB := float64((1+cfg.NumMemtables)*end) / (1 << 20)
	for _, cold := range []bool{false, true} {
		b.Run(fmt.Sprintf("what=check/cache=%s", map[bool]string{false: "warm", true: "cold"}[cold]), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				if cold {
					evictPageCache(b, dir)
				}
				b.StartTimer()
				if err := checkMemLogs(dir); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(logMiB, "log-MiB")
		})
	}
	b.Run("what=open/cache=warm", func(b *testing.B) {
		cfg := cfg
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			cfg.Dir = filepath.Join(b.TempDir(), fmt.Sprint(i))
			copySparse(b, cfg.Dir, dir)
			b.StartTimer()
			openTimed(b, cfg)
		}
		b.ReportMetric(logMiB, "log-MiB")
	})
}
