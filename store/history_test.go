package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/task"
)

var t0 = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

func exec1(id string, sec, attempt int, status string) task.Execution {
	at := t0.Add(time.Duration(sec) * time.Second)
	return task.Execution{
		TaskID: id, ScheduledAt: at, StartedAt: at.Add(time.Millisecond), FinishedAt: at.Add(20 * time.Millisecond),
		Attempt: attempt, Node: "node-1", Status: status,
	}
}

func history(t testing.TB, s *Store, id string, limit int) []task.Execution {
	t.Helper()
	h, err := s.History(id, limit)
	if err != nil {
		t.Fatalf("History(%q, %d): %v", id, limit, err)
	}
	return h
}

func flush(t testing.TB, s *Store) {
	t.Helper()
	if err := s.Flush(context.Background()); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

func statuses(h []task.Execution) string {
	var out []string
	for _, e := range h {
		out = append(out, e.Status)
	}
	return strings.Join(out, ",")
}

func TestHistory_Modes(t *testing.T) {
	all := []string{task.ExecutionOK, task.ExecutionFailed, task.ExecutionTimeout, task.ExecutionSkipped, task.ExecutionMisfired, task.ExecutionCanceled, "future-status"}
	tests := []struct {
		mode string
		want string // newest first
	}{
		{HistoryAll, "future-status,canceled,misfired,skipped,timeout,failed,ok"},
		{HistoryFailures, "future-status,canceled,misfired,skipped,timeout,failed"},
		{HistoryNone, ""},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.History = tt.mode
			s := openTest(t, cfg)
			for i, st := range all {
				s.Record(exec1("t", i, 1, st))
			}
			flush(t, s)
			if got := statuses(history(t, s, "t", 0)); got != tt.want {
				t.Errorf("History = %s, want %s", got, tt.want)
			}
			if s.Dropped() != 0 {
				t.Errorf("Dropped = %d", s.Dropped())
			}
			if keeps := strings.Contains(tt.want, task.ExecutionOK); s.KeepsSuccesses() != keeps {
				t.Errorf("KeepsSuccesses = %v, want %v", s.KeepsSuccesses(), keeps)
			}
		})
	}
}

func TestHistory_RoundTrip(t *testing.T) {
	s := openTest(t, testConfig(t))
	local := time.FixedZone("X", 3600)
	in := []task.Execution{
		{TaskID: "billing/invoice-42", ScheduledAt: time.Date(2030, 1, 2, 5, 4, 5, 6, local),
			StartedAt: time.Date(2030, 1, 2, 5, 4, 5, 999, local), FinishedAt: time.Date(2030, 1, 2, 3, 5, 0, 0, time.UTC),
			Attempt: 3, Node: "node-é", Status: task.ExecutionTimeout, Error: "context deadline exceeded"},
		// skipped: never started
		{TaskID: "billing/invoice-42", ScheduledAt: time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC), Attempt: 1, Status: task.ExecutionSkipped},
		// before 1970, odd status, a negative attempt, no times at all
		{TaskID: "billing/invoice-42", ScheduledAt: time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC), Attempt: -1, Status: "weird", Node: ""},
		{TaskID: "billing/invoice-42", Status: task.ExecutionOK},
	}
	for _, e := range in {
		s.Record(e)
	}
	check := func(stage string) {
		got := history(t, s, "billing/invoice-42", 0)
		if len(got) != len(in) {
			t.Fatalf("%s: %d records, want %d", stage, len(got), len(in))
		}
		for i, want := range in { // in is newest first
			g := got[i]
			if g.TaskID != want.TaskID || !g.ScheduledAt.Equal(want.ScheduledAt) || !g.StartedAt.Equal(want.StartedAt) ||
				!g.FinishedAt.Equal(want.FinishedAt) || g.Attempt != want.Attempt || g.Node != want.Node ||
				g.Status != want.Status || g.Error != want.Error {
				t.Errorf("%s: record %d = %+v, want %+v", stage, i, g, want)
			}
		}
	}
	check("buffered")
	flush(t, s)
	check("written")
}

// TestHistory_Order records executions in random order and checks that
// History returns them newest first (scheduled time, then attempt) and
// respects the limit, without mixing tasks whose ids share a prefix.
func TestHistory_Order(t *testing.T) {
	cfg := testConfig(t)
	cfg.HistorySuccessLimit = MaxHistoryLimit
	s := openTest(t, cfg)
	rng := rand.New(rand.NewPCG(1, 2))
	type fire struct{ sec, attempt int }
	var fires []fire
	for sec := -5; sec < 40; sec += 3 {
		for a := 1; a <= 3; a++ {
			fires = append(fires, fire{sec, a})
		}
	}
	rng.Shuffle(len(fires), func(i, j int) { fires[i], fires[j] = fires[j], fires[i] })
	for _, f := range fires {
		for _, id := range []string{"a", "a b", "ab", "a/b"} {
			s.Record(exec1(id, f.sec, f.attempt, task.ExecutionOK))
		}
	}
	slices.SortFunc(fires, func(x, y fire) int {
		if x.sec != y.sec {
			return y.sec - x.sec
		}
		return y.attempt - x.attempt
	})
	for _, stage := range []string{"buffered", "written"} {
		if stage == "written" {
			flush(t, s)
		}
		for _, limit := range []int{0, 1, 7, len(fires), len(fires) + 5} {
			got := history(t, s, "a", limit)
			want := fires
			if limit > 0 && limit < len(want) {
				want = want[:limit]
			}
			if len(got) != len(want) {
				t.Fatalf("%s, limit %d: %d records, want %d", stage, limit, len(got), len(want))
			}
			for i, w := range want {
				g := got[i]
				if g.TaskID != "a" || !g.ScheduledAt.Equal(t0.Add(time.Duration(w.sec)*time.Second)) || g.Attempt != w.attempt {
					t.Fatalf("%s, limit %d: record %d = %s %v attempt %d, want a %+v", stage, limit, i, g.TaskID, g.ScheduledAt, g.Attempt, w)
				}
			}
		}
	}
	if h := history(t, s, "unknown", 0); len(h) != 0 {
		t.Errorf("History of an unknown task = %d records", len(h))
	}
}

// TestHistory_SameFireTwice keeps both records of one fire and attempt
// (a trigger at the same millisecond, a retry recorded twice), last first.
func TestHistory_SameFireTwice(t *testing.T) {
	s := openTest(t, testConfig(t))
	first, second := exec1("t", 0, 1, task.ExecutionFailed), exec1("t", 0, 1, task.ExecutionOK)
	s.Record(first)
	flush(t, s)
	s.Record(second)
	if got := statuses(history(t, s, "t", 0)); got != "ok,failed" {
		t.Fatalf("History = %s, want ok,failed", got)
	}
}

// TestHistory_VisibleBeforeFlush: with a writer that does not tick during
// the test, a record is visible right after Record, and exactly once after
// it is written.
func TestHistory_VisibleBeforeFlush(t *testing.T) {
	cfg := testConfig(t)
	cfg.FlushInterval = 10 * time.Second
	s := openTest(t, cfg)
	s.Record(exec1("t", 1, 1, task.ExecutionOK))
	if n := len(history(t, s, "t", 0)); n != 1 {
		t.Fatalf("buffered: %d records, want 1", n)
	}
	flush(t, s)
	s.Record(exec1("t", 2, 1, task.ExecutionOK))
	if got := history(t, s, "t", 0); len(got) != 2 || got[0].ScheduledAt.Equal(got[1].ScheduledAt) {
		t.Fatalf("half written: %+v, want 2 distinct records", got)
	}
}

// blockedWriter makes the history writer stop in its first batch until
// release is called, and returns a channel closed when it got there.
func blockedWriter(cfg *Config) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var once, releaseOnce sync.Once
	cfg.writeHook = func() error {
		once.Do(func() {
			close(in)
			<-out
		})
		return nil
	}
	return in, func() { releaseOnce.Do(func() { close(out) }) }
}

// TestHistory_ReadsOnlyItsBufferedRecords: a read of a task's history
// looks, under the buffer's lock, at that task's buffered records only,
// in flight and pending, not at every record buffered: the lock is
// Record's, the fire path's, and the buffer holds up to HistoryBuffer
// records of other tasks.
func TestHistory_ReadsOnlyItsBufferedRecords(t *testing.T) {
	cfg := testConfig(t)
	cfg.FlushInterval = 10 * time.Second
	entered, release := blockedWriter(&cfg)
	var looked []int
	cfg.bufferRead = func(n int) { looked = append(looked, n) }
	s := openTest(t, cfg)
	t.Cleanup(release)

	s.Record(exec1("x", 0, 1, task.ExecutionFailed))
	s.Record(exec1("y", 0, 1, task.ExecutionOK))
	flushed := make(chan error, 1)
	go func() { flushed <- s.Flush(context.Background()) }()
	<-entered // x's first record and y's are in flight
	for i := range 10_000 {
		s.Record(exec1(fmt.Sprintf("other-%d", i%100), i, 1, task.ExecutionOK))
		if i%5000 == 0 {
			s.Record(exec1("x", 1+i/5000, 1, task.ExecutionOK))
		}
	}
	if got := history(t, s, "x", 0); len(got) != 3 {
		t.Fatalf("x: %d records, want 3", len(got))
	}
	if len(looked) != 1 || looked[0] != 3 {
		t.Errorf("the read looked at %v buffered records, want [3] (x's), not the 10 004 buffered", looked)
	}
	release()
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if got := history(t, s, "x", 0); len(got) != 3 {
		t.Errorf("x once written: %d records, want 3", len(got))
	}
}

// TestRecordList_SharedHash: the records of two ids whose hashes
// collide share a chain, and each id reads its own.
func TestRecordList_SharedHash(t *testing.T) {
	l := newRecordList(1)
	for i, id := range []string{"a", "b", "a", "c", "b", "a"} {
		h := uint64(1)
		if id == "c" {
			h = 2
		}
		l.add(record{e: exec1(id, i, 1, task.ExecutionOK), seq: uint64(i)}, h)
	}
	for _, c := range []struct {
		id   string
		want []uint64 // seq, newest first
	}{{"a", []uint64{5, 2, 0}}, {"b", []uint64{4, 1}}, {"c", []uint64{3}}, {"d", nil}} {
		h := uint64(1)
		if c.id == "c" {
			h = 2
		}
		got, _ := l.appendOf(nil, c.id, h)
		var seqs []uint64
		for _, r := range got {
			seqs = append(seqs, r.seq)
		}
		if !slices.Equal(seqs, c.want) {
			t.Errorf("%s: %v, want %v", c.id, seqs, c.want)
		}
	}
	l.reset()
	if got, looked := l.appendOf(nil, "a", 1); len(got) != 0 || looked != 0 {
		t.Errorf("after reset: %d records, looked at %d", len(got), looked)
	}
}

// TestRecordList_ResetClearsTheHeadsSet: reset clears the heads of the
// chains its records took, which the next batch would otherwise chain
// onto records gone, and writes no other: emptying a batch costs its
// records, not the buffer's chains (16 Mi heads, 64 MiB, at
// MaxHistoryBuffer, cleared at every batch of the writer).
func TestRecordList_ResetClearsTheHeadsSet(t *testing.T) {
	const chains = 1 << 10
	l := newRecordList(chains)
	const untouched = math.MaxUint32 // in the heads of the chains no record takes
	for c := range l.heads {
		l.heads[c] = untouched
	}
	taken := map[uint64]bool{3: true, 7: true, chains - 1: true}
	for c := range taken {
		l.heads[c] = 0
	}
	for i, h := range []uint64{3, 7, 3, chains + 7, chains - 1, 2*chains + 3} {
		l.add(record{e: exec1(fmt.Sprint("t", h), i, 1, task.ExecutionOK), seq: uint64(i)}, h)
	}
	l.reset()
	for c, head := range l.heads {
		if taken[uint64(c)] && head != 0 || !taken[uint64(c)] && head != untouched {
			t.Errorf("chain %d's head after reset: %d (taken: %v)", c, head, taken[uint64(c)])
		}
	}
}

// failingWriter makes every history batch fail with err, as a full disk
// does, while the returned flag is set.
func failingWriter(cfg *Config, err error) *atomic.Bool {
	var failing atomic.Bool
	cfg.writeHook = func() error {
		if failing.Load() {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	}
	return &failing
}

func TestRecord_FullBufferDrops(t *testing.T) {
	cfg := testConfig(t)
	cfg.HistoryBuffer = 4
	cfg.FlushInterval = 10 * time.Second
	entered, release := blockedWriter(&cfg)
	s := openTest(t, cfg)
	t.Cleanup(release) // before Close, which waits for the writer

	s.Record(exec1("t", 0, 1, task.ExecutionOK)) // a quarter of 4: wakes the writer, which takes it and blocks
	<-entered
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= 14; i++ {
			s.Record(exec1("t", i, 1, task.ExecutionOK))
		}
	}()
	// Were Record to wait for room, this would never close.
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Record blocked on a full buffer")
	}
	if got := s.Dropped(); got != 10 {
		t.Errorf("Dropped = %d, want 10 (4 buffered, 1 in the writer)", got)
	}
	release()
	flush(t, s)
	got := history(t, s, "t", 0)
	if len(got) != 5 {
		t.Fatalf("%d records written, want 5", len(got))
	}
	// The first four after the one in flight were kept: scheduled 0..4 s.
	if !got[0].ScheduledAt.Equal(t0.Add(4 * time.Second)) {
		t.Errorf("newest kept record scheduled at %v", got[0].ScheduledAt)
	}
}

func TestFlush_ContextEnds(t *testing.T) {
	cfg := testConfig(t)
	entered, release := blockedWriter(&cfg)
	s := openTest(t, cfg)
	t.Cleanup(release)
	s.Record(exec1("t", 0, 1, task.ExecutionOK))
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Flush(ctx); err != context.Canceled {
		t.Fatalf("Flush with a blocked writer = %v, want context.Canceled", err)
	}
	release()
	flush(t, s)
	if n := len(history(t, s, "t", 0)); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
}

func TestHistory_TTL(t *testing.T) {
	cfg := testConfig(t)
	cfg.HistoryTTL = time.Second
	s := openTest(t, cfg)
	before := time.Now()
	s.Record(exec1("t", 0, 1, task.ExecutionOK))
	flush(t, s)
	after := time.Now()

	// The entry carries the TTL: Badger's expiry, in Unix seconds, lies
	// between the Record and the end of Flush, plus the TTL.
	var expiresAt uint64
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: historyPrefix("t"), AllVersions: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			expiresAt = it.Item().ExpiresAt()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := uint64(before.Add(cfg.HistoryTTL).Unix()), uint64(after.Add(cfg.HistoryTTL).Unix())
	if expiresAt < lo || expiresAt > hi {
		t.Errorf("ExpiresAt = %d, want within [%d, %d]", expiresAt, lo, hi)
	}
	waitFor(t, 10*time.Second, "the record to expire", func() bool {
		return len(history(t, s, "t", 0)) == 0
	})
}

// TestHistory_TTLLoweredAtRestart: records written under a longer
// HistoryTTL than the store now has are not returned once older than the
// new one, though Badger keeps them until the expiry they were written
// with.
func TestHistory_TTLLoweredAtRestart(t *testing.T) {
	cfg := testConfig(t)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, ago := range []time.Duration{2 * time.Hour, time.Minute} {
		e := exec1("t", i, 1, task.ExecutionOK)
		e.ScheduledAt, e.StartedAt, e.FinishedAt = now.Add(-ago-time.Second), now.Add(-ago-time.Second), now.Add(-ago)
		s.Record(e)
	}
	flush(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.HistoryTTL = time.Hour
	s = openTest(t, cfg)
	got := history(t, s, "t", 0)
	if len(got) != 1 || !got[0].FinishedAt.Equal(now.Add(-time.Minute)) {
		t.Errorf("HistoryTTL lowered to 1h: %d records, want the one of a minute ago alone", len(got))
	}
}

func TestDeleteHistory(t *testing.T) {
	s := openTest(t, testConfig(t))
	for i := range 10 {
		s.Record(exec1("gone", i, 1, task.ExecutionOK))
		s.Record(exec1("gone2", i, 1, task.ExecutionOK))
	}
	flush(t, s)
	s.Record(exec1("gone", 99, 1, task.ExecutionOK)) // buffered: DeleteHistory flushes it first
	if err := s.DeleteHistory(context.Background(), "gone"); err != nil {
		t.Fatal(err)
	}
	if n := len(history(t, s, "gone", 0)); n != 0 {
		t.Errorf("after DeleteHistory: %d records", n)
	}
	if n := len(history(t, s, "gone2", 0)); n != 10 {
		t.Errorf("a neighbour's history: %d records, want 10", n)
	}
}

// TestDeleteHistory_AfterALostBatch: a batch lost to a full disk before
// a delete, a batch of any task, does not keep the deleted task's records:
// what was lost is not on disk, so there is nothing of it to delete. The
// loss is still Flush's to report.
func TestDeleteHistory_AfterALostBatch(t *testing.T) {
	cfg := testConfig(t)
	full := failingWriter(&cfg, syscall.ENOSPC)
	s := openTest(t, cfg)
	for i := range 5 {
		s.Record(exec1("gone", i, 1, task.ExecutionOK))
	}
	flush(t, s)
	full.Store(true)
	s.Record(exec1("other", 0, 1, task.ExecutionOK))
	waitFor(t, 10*time.Second, "the batch to be lost", func() bool { return s.WriteFailed() == 1 })
	full.Store(false)
	if err := s.DeleteHistory(t.Context(), "gone"); err != nil {
		t.Errorf("DeleteHistory after a lost batch: %v", err)
	}
	if got := history(t, s, "gone", 0); len(got) != 0 {
		t.Errorf("after DeleteHistory: %d records left", len(got))
	}
	if err := s.Flush(t.Context()); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Flush after the delete = %v, want the lost batch's ENOSPC still reported", err)
	}
}

// TestHistory_Concurrent records from several goroutines while others read
// and flush (run with -race), then checks that each task kept its last
// records and nothing was dropped.
func TestHistory_Concurrent(t *testing.T) {
	cfg := testConfig(t)
	cfg.FlushInterval = 5 * time.Millisecond
	s := openTest(t, cfg)
	const writers, per = 4, 2000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			for i := range per {
				s.Record(exec1(fmt.Sprintf("w%d", w), i, 1, task.ExecutionOK))
			}
		})
	}
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.History("w0", 10); err != nil {
				t.Error(err)
				return
			}
			if err := s.Flush(context.Background()); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	flush(t, s)
	for w := range writers {
		h := history(t, s, fmt.Sprintf("w%d", w), 0)
		if len(h) != DefaultSuccessLimit || !h[0].ScheduledAt.Equal(t0.Add((per-1)*time.Second)) ||
			!h[len(h)-1].ScheduledAt.Equal(t0.Add((per-DefaultSuccessLimit)*time.Second)) {
			t.Errorf("writer %d: %d records from %v to %v, want the last %d (dropped %d)", w, len(h),
				h[0].ScheduledAt, h[len(h)-1].ScheduledAt, DefaultSuccessLimit, s.Dropped())
		}
	}
	if s.Dropped() != 0 || s.Sampled() != 0 {
		t.Errorf("dropped %d, sampled %d", s.Dropped(), s.Sampled())
	}
}

// TestRecord_NoAllocation: once the buffer has room, Record allocates
// nothing (the writer does not run: its tick is far and the buffer far
// from a quarter full).
func TestRecord_NoAllocation(t *testing.T) {
	cfg := testConfig(t)
	cfg.FlushInterval = 10 * time.Second
	s := openTest(t, cfg)
	e := exec1("0123456789abcdef", 0, 1, task.ExecutionFailed)
	if n := testing.AllocsPerRun(500, func() { s.Record(e) }); n != 0 {
		t.Errorf("Record allocates %.1f times per call", n)
	}
}

// TestHistory_DiskFull: while the disk refuses writes (ENOSPC injected
// before each batch), Record still takes every record without waiting,
// Flush reports the error and the lost records are counted; once the disk
// takes writes again, new records are written.
func TestHistory_DiskFull(t *testing.T) {
	cfg := testConfig(t)
	full := failingWriter(&cfg, syscall.ENOSPC)
	full.Store(true)
	s := openTest(t, cfg)
	for i := range 5 {
		s.Record(exec1("t", i, 1, task.ExecutionOK))
	}
	if err := s.Flush(context.Background()); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Flush on a full disk = %v, want ENOSPC", err)
	}
	if got, dropped := s.WriteFailed(), s.Dropped(); got != 5 || dropped != 5 {
		t.Fatalf("WriteFailed = %d, Dropped = %d, want 5 and 5", got, dropped)
	}
	full.Store(false)
	for i := 10; i < 13; i++ {
		s.Record(exec1("t", i, 1, task.ExecutionOK))
	}
	flush(t, s)
	if got := history(t, s, "t", 0); len(got) != 3 || !got[0].ScheduledAt.Equal(t0.Add(12*time.Second)) {
		t.Fatalf("history after the disk freed up: %d records (%s)", len(got), statuses(got))
	}
	if got := s.WriteFailed(); got != 5 {
		t.Errorf("WriteFailed = %d after good writes, want still 5", got)
	}
}

// TestStore_DirectoryDeleted: once the data directory is deleted under an
// open store, writes are refused with an error that says so (history is
// counted as lost) instead of reaching a Badger that can make no new file;
// Close still returns (Badger would retry flushing its memtable into the
// missing directory forever), and the path opens afresh.
func TestStore_DirectoryDeleted(t *testing.T) {
	cfg := testConfig(t)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(0, 1, []KV{{ID: "a", Value: []byte("1")}}, nil); err != nil { // in the memtable
		t.Fatal(err)
	}
	if err := os.RemoveAll(cfg.Dir); err != nil {
		t.Fatal(err)
	}
	s.Record(exec1("t", 1, 1, task.ExecutionOK))
	if err := s.Flush(context.Background()); !errors.Is(err, ErrDirDeleted) {
		t.Errorf("Flush after the directory was deleted = %v, want ErrDirDeleted", err)
	}
	if s.WriteFailed() != 1 {
		t.Errorf("WriteFailed = %d, want 1", s.WriteFailed())
	}
	if err := s.Apply(0, 2, []KV{{ID: "b", Value: []byte("2")}}, nil); !errors.Is(err, ErrDirDeleted) || !strings.Contains(err.Error(), cfg.Dir) {
		t.Errorf("Apply after the directory was deleted = %v, want ErrDirDeleted naming it", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close hung")
	}
	if _, err := os.Stat(cfg.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left %s behind: %v", cfg.Dir, err)
	}
	s = openTest(t, cfg)
	if rev, _ := s.Partition(0, nil); rev != 0 {
		t.Errorf("the reopened directory has revision %d, want a new one", rev)
	}
}

// TestHistory_DiskFullLogsOnceAWhile: while the disk refuses every batch
// (one each FlushInterval, as long as fires end), the writer says so at
// once and then once in a while with the count, not once per batch: ten
// lines a second for as long as the disk is full, on a disk that may be
// the log's too.
func TestHistory_DiskFullLogsOnceAWhile(t *testing.T) {
	cfg := testConfig(t)
	var logs logbuf.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	full := failingWriter(&cfg, ErrDiskFull)
	full.Store(true)
	s := openTest(t, cfg)
	const batches = 20
	for i := range batches {
		s.Record(exec1("t", i, 1, task.ExecutionOK))
		if err := s.Flush(context.Background()); !errors.Is(err, ErrDiskFull) {
			t.Fatalf("Flush on a full disk = %v, want ErrDiskFull", err)
		}
	}
	if got := s.WriteFailed(); got != batches {
		t.Fatalf("WriteFailed = %d, want %d", got, batches)
	}
	lines := strings.Count(logs.String(), "execution records lost")
	if lines != 1 || !strings.Contains(logs.String(), "disk full") {
		t.Fatalf("%d batches refused: %d log lines, want 1 naming the full disk:\n%s", batches, lines, logs.String())
	}
	if strings.Contains(logs.String(), "batches_not_logged") {
		t.Errorf("the first line of a cause counts batches held back, though none were:\n%s", logs.String())
	}
	full.Store(false)
	s.Record(exec1("t", batches, 1, task.ExecutionOK))
	flush(t, s)
	// The writer logs once Flush has its answer, not before.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "execution records are written again"); {
		if time.Now().After(deadline) {
			t.Fatalf("no line once the disk took writes again:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
