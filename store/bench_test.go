package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardcron/shardcron/task"
)

// BenchmarkRecord is the fire path's cost of recording an execution.
// path=buffered: the record is accepted (a mutex and an append into a
// reused buffer) while the writer runs; every 16384 records the timer
// stops for a Flush, so the buffer never fills. path=full: the buffer is
// full and the writer stuck, so every record is dropped and counted.
func BenchmarkRecord(b *testing.B) {
	b.Run("path=buffered", func(b *testing.B) {
		s := openTest(b, testConfig(b))
		e := exec1("0123456789abcdef", 0, 1, task.ExecutionOK)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			if i%16384 == 16383 {
				b.StopTimer()
				if err := s.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			e.Attempt = i
			s.Record(e)
		}
		b.StopTimer()
		if s.Dropped() != 0 {
			b.Fatalf("dropped %d", s.Dropped())
		}
	})
	b.Run("path=full", func(b *testing.B) {
		cfg := testConfig(b)
		cfg.HistoryBuffer = 1024
		entered, release := blockedWriter(&cfg)
		s := openTest(b, cfg)
		b.Cleanup(release)
		e := exec1("0123456789abcdef", 0, 1, task.ExecutionOK)
		s.Record(e)
		<-entered
		for range cfg.HistoryBuffer {
			s.Record(e)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			s.Record(e)
		}
		b.StopTimer()
		if s.Dropped() != uint64(b.N) {
			b.Fatalf("dropped %d of %d", s.Dropped(), b.N)
		}
	})
}

// BenchmarkHistoryWrite is the writer's sustained rate: records per second
// from Record until Flush returns, in batches of 16384 over 1000 tasks.
func BenchmarkHistoryWrite(b *testing.B) {
	s := openTest(b, testConfig(b))
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("task-%012d", i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	n := 0
	for n < b.N {
		for j := 0; j < 16384 && n < b.N; j++ {
			s.Record(exec1(ids[n%len(ids)], n/len(ids), 1, task.ExecutionOK))
			n++
		}
		if err := s.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	if s.Dropped() != 0 {
		b.Fatalf("dropped %d", s.Dropped())
	}
}

// BenchmarkHistoryBatch is one batch of the writer: records records of
// as many tasks, then a Flush, which has the writer write them and empty
// the batch's list for its next turn, under HistoryBuffer buffer: the
// list's chain heads are made for the whole buffer.
func BenchmarkHistoryBatch(b *testing.B) {
	for _, buffer := range []int{DefaultHistoryBuffer, MaxHistoryBuffer} {
		for _, records := range []int{1, 100} {
			b.Run(fmt.Sprintf("buffer=%d/records=%d", buffer, records), func(b *testing.B) {
				cfg := testConfig(b)
				cfg.HistoryBuffer = buffer
				cfg.FlushInterval = 10 * time.Second // batches are taken by Flush
				s := openTest(b, cfg)
				ids := make([]string, records)
				for i := range ids {
					ids[i] = fmt.Sprintf("task-%012d", i)
				}
				b.ReportAllocs()
				for n := 0; b.Loop(); n++ {
					for _, id := range ids {
						s.Record(exec1(id, n, 1, task.ExecutionOK))
					}
					flush(b, s)
				}
			})
		}
	}
}

// taskValue is a task JSON of about 400 bytes, the size docs/design.md plans for.
func taskValue(i int) []byte {
	return fmt.Appendf(nil, `{"id":"task-%012d","schedule":"H/5 * * * *","timezone":"Europe/Berlin",`+
		`"executor":{"type":"http","url":"http://127.0.0.5/hook/%d","method":"POST","headers":{"X-Team":"billing"},`+
		`"body":"{\"k\":1}"},"timeout":"30s","retry":{"max_attempts":3,"backoff":"1s","max_backoff":"1m"},`+
		`"misfire":"fire_once","catchup_window":"1m","concurrency":"allow","jitter":"0s","paused":false,`+
		`"labels":{"team":"billing","env":"prod"}}`, i, i)
}

func BenchmarkPartitionScan(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			s := openTest(b, testConfig(b))
			tasks := make([]KV, n)
			for i := range tasks {
				tasks[i] = KV{ID: fmt.Sprintf("task-%012d", i), Value: taskValue(i)}
			}
			if err := s.Reset(1, 1, tasks); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				count := 0
				if _, err := s.Partition(1, func(string, []byte, int64) error { count++; return nil }); err != nil {
					b.Fatal(err)
				}
				if count != n {
					b.Fatalf("scanned %d tasks, want %d", count, n)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}

// BenchmarkApply applies n updates per call (a watch batch), cycling over
// 100000 ids of one partition.
func BenchmarkApply(b *testing.B) {
	for _, n := range []int{1, 100, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			s := openTest(b, testConfig(b))
			const ids = 100000
			puts := make([]KV, n)
			rev := int64(1)
			if err := s.Reset(1, rev, nil); err != nil { // synced, as the engine's partitions are
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for j := range puts {
					i := (int(rev)*n + j) % ids
					puts[j] = KV{ID: fmt.Sprintf("task-%012d", i), Value: taskValue(i)}
				}
				rev++
				if err := s.Apply(1, rev, puts, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}

// BenchmarkReset loads a partition of n tasks, the fallback after a
// restart whose revision etcd no longer has.
func BenchmarkReset(b *testing.B) {
	for _, n := range []int{10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			s := openTest(b, testConfig(b))
			tasks := make([]KV, n)
			for i := range tasks {
				tasks[i] = KV{ID: fmt.Sprintf("task-%012d", i), Value: taskValue(i)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if err := s.Reset(1, int64(i+1), tasks); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}

// BenchmarkHistory reads the 100 records (MaxHistoryLimit) one task keeps
// of the 1000 recorded for it, beside 999 other tasks of 100 records:
// from=memtable as written, from=tables after a reopen, which writes the
// memtable out.
func BenchmarkHistory(b *testing.B) {
	for _, from := range []string{"memtable", "tables"} {
		b.Run("from="+from, func(b *testing.B) {
			cfg := testConfig(b)
			cfg.HistorySuccessLimit = MaxHistoryLimit
			cfg.MemTableSize = 16 << 20 // holds every record
			s := openTest(b, cfg)
			for i := range 1000 {
				s.Record(exec1("0123456789abcdef", i, 1, task.ExecutionOK))
			}
			for i := range 999 {
				for sec := range 100 {
					s.Record(exec1(fmt.Sprintf("task-%012d", i), sec, 1, task.ExecutionOK))
				}
				if i%100 == 99 {
					flush(b, s) // never enough waiting to be sampled
				}
			}
			flush(b, s)
			if s.Dropped() != 0 || s.Sampled() != 0 {
				b.Fatalf("dropped %d, sampled %d", s.Dropped(), s.Sampled())
			}
			if from == "tables" {
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				s = openTest(b, cfg)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if h, err := s.History("0123456789abcdef", 100); err != nil || len(h) != 100 {
					b.Fatal(len(h), err)
				}
			}
		})
	}
}

// BenchmarkHistoryBuffered is a read of one task's history (5 records)
// while the buffer holds n records of other tasks, the writer stuck in a
// batch of one: op=history is the read alone; op=record is a Record, the
// fire path, while another goroutine reads that history in a loop, so
// what the read's hold of the buffer's lock costs the writers of records
// (the buffer is full: each Record takes the lock and drops), with the
// longest Record and the 99.99th percentile, a fire held up by a read.
func BenchmarkHistoryBuffered(b *testing.B) {
	for _, n := range []int{1024, 65536} {
		for _, op := range []string{"history", "record"} {
			b.Run(fmt.Sprintf("n=%d/op=%s", n, op), func(b *testing.B) {
				cfg := testConfig(b)
				cfg.HistoryBuffer = n + 5
				entered, release := blockedWriter(&cfg)
				s := openTest(b, cfg)
				b.Cleanup(release)
				s.Record(exec1("first", 0, 1, task.ExecutionOK))
				<-entered
				for i := range n {
					s.Record(exec1(fmt.Sprintf("task-%06d", i%4096), i/4096, 1, task.ExecutionOK))
					if i%(n/5) == 0 && i < 5*(n/5) {
						s.Record(exec1("0123456789abcdef", i, 1, task.ExecutionOK))
					}
				}
				if h, err := s.History("0123456789abcdef", 0); err != nil || len(h) != 5 {
					b.Fatal(len(h), err)
				}
				if op == "history" {
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						if h, err := s.History("0123456789abcdef", 0); err != nil || len(h) != 5 {
							b.Fatal(len(h), err)
						}
					}
					return
				}
				stop := make(chan struct{})
				var reader sync.WaitGroup
				reader.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := s.History("0123456789abcdef", 0); err != nil {
							b.Error(err)
							return
						}
					}
				})
				e := exec1("other", 0, 1, task.ExecutionOK)
				var took []time.Duration
				b.ResetTimer()
				for b.Loop() {
					start := time.Now()
					s.Record(e)
					took = append(took, time.Since(start))
				}
				b.StopTimer()
				close(stop)
				reader.Wait()
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)-1].Microseconds()), "max-µs")
				b.ReportMetric(float64(took[len(took)*9999/10000].Microseconds()), "p9999-µs")
			})
		}
	}
}
