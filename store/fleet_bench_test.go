package store

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardcron/shardcron/task"
)

// BenchmarkHistoryDisk simulates hours of every-second fires of 1000 tasks
// (3.6 M execution records an hour, scheduled times advancing one second
// per round, one Flush per simulated second as the writer would do) and
// reports the bytes the data directory holds per task after Close. Run it
// once: -benchtime=1x.
func BenchmarkHistoryDisk(b *testing.B) {
	for _, hours := range []int{1, 3} {
		b.Run(fmt.Sprintf("hours=%d", hours), func(b *testing.B) { benchmarkHistoryDisk(b, hours) })
	}
}

func benchmarkHistoryDisk(b *testing.B, hours int) {
	const tasks = 1000
	seconds := 3600 * hours
	ids := make([]string, tasks)
	for i := range ids {
		ids[i] = fmt.Sprintf("task-%012d", i)
	}
	for b.Loop() {
		cfg := DefaultConfig(b.TempDir())
		cfg.Logger = testConfig(b).Logger
		s, err := Open(cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		start := time.Now()
		for sec := range seconds {
			for _, id := range ids {
				s.Record(exec1(id, sec, 1, task.ExecutionOK))
			}
			if err := s.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		dropped := s.Dropped()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		size := dirSize(b, cfg.Dir)
		b.ReportMetric(float64(size)/tasks, "disk-bytes/task")
		b.ReportMetric(float64(tasks*seconds)/elapsed.Seconds(), "records/s")
		b.ReportMetric(float64(tasks*seconds), "records")
		b.ReportMetric(float64(dropped), "dropped")
	}
}

// dirSize is the sum of the sizes of the files under dir.
func dirSize(t testing.TB, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// BenchmarkHistoryFireRate feeds Record at a fixed rate of fires per
// second (in steps of 1 ms, from one goroutine, as the worker pool would)
// for 3 s of real time, the fires going to every task once per second
// (every-second tasks), with the background writer running as configured
// by default. It reports the shares of records dropped and left out by
// sampling, the sampling at the end and the disk used per fire. Run it
// once: -benchtime=1x.
func BenchmarkHistoryFireRate(b *testing.B) {
	for _, rate := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("fires=%d/s", rate), func(b *testing.B) {
			ids := make([]string, rate)
			for i := range ids {
				ids[i] = fmt.Sprintf("task-%012d", i)
			}
			for b.Loop() {
				cfg := DefaultConfig(b.TempDir())
				cfg.Logger = testConfig(b).Logger
				s, err := Open(cfg)
				if err != nil {
					b.Fatal(err)
				}
				const seconds = 3
				perStep := rate / 1000
				start := time.Now()
				n := 0
				for step := range seconds * 1000 {
					for range perStep {
						s.Record(exec1(ids[n%rate], n/rate, 1, task.ExecutionOK))
						n++
					}
					if d := time.Until(start.Add(time.Duration(step+1) * time.Millisecond)); d > 0 {
						time.Sleep(d)
					}
				}
				late := time.Since(start) - seconds*time.Second
				dropped, sampled, k := s.Dropped(), s.Sampled(), s.Sampling()
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(100*float64(dropped)/float64(n), "%dropped")
				b.ReportMetric(100*float64(sampled)/float64(n), "%sampled")
				b.ReportMetric(float64(k), "sampling-k")
				b.ReportMetric(late.Seconds(), "s-behind")
				b.ReportMetric(float64(dirSize(b, cfg.Dir))/float64(n), "disk-bytes/fire")
			}
		})
	}
}
