package store

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/task"
)

// countKeys counts the live keys under prefix.
func countKeys(t testing.TB, s *Store, prefix string) int {
	t.Helper()
	n := 0
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix), PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// wantSeconds checks that h is exactly the records scheduled at the given
// seconds after t0, in that order.
func wantSeconds(t testing.TB, what string, h []task.Execution, secs ...int) {
	t.Helper()
	ok := len(h) == len(secs)
	for i := 0; ok && i < len(h); i++ {
		ok = h[i].ScheduledAt.Equal(t0.Add(time.Duration(secs[i]) * time.Second))
	}
	if !ok {
		var got []int
		for _, e := range h {
			got = append(got, int(e.ScheduledAt.Sub(t0)/time.Second))
		}
		t.Fatalf("%s: records at seconds %v, want %v", what, got, secs)
	}
}

func span(from, to int) []int { // from down to to, inclusive
	var s []int
	for i := from; i >= to; i-- {
		s = append(s, i)
	}
	return s
}

// TestHistory_DefaultLimits: with the defaults a task keeps its last 10
// successes and its last 10 failures, counted apart, buffered or written,
// and the disk holds no more than those.
func TestHistory_DefaultLimits(t *testing.T) {
	s := openTest(t, testConfig(t))
	statuses := []string{task.ExecutionFailed, task.ExecutionTimeout, task.ExecutionSkipped, task.ExecutionMisfired, task.ExecutionCanceled}
	for i := range 50 {
		st := task.ExecutionOK
		if i%2 == 1 {
			st = statuses[i/2%len(statuses)]
		}
		s.Record(exec1("t", i, 1, st))
	}
	want := append(span(49, 30), nil...) // 10 failures (odd) and 10 successes (even)
	for _, stage := range []string{"buffered", "written"} {
		if stage == "written" {
			flush(t, s)
		}
		wantSeconds(t, stage, history(t, s, "t", 0), want...)
		wantSeconds(t, stage+", limit 3", history(t, s, "t", 3), 49, 48, 47)
	}
	if n := countKeys(t, s, nsHistory); n != 20 {
		t.Errorf("%d history keys on disk, want 20", n)
	}
}

// TestHistory_TaskLimits: RecordKeep's limit is per task and per class;
// 0 keeps nothing, above MaxHistoryLimit is capped, negative is the
// default.
func TestHistory_TaskLimits(t *testing.T) {
	cfg := testConfig(t)
	cfg.HistorySuccessLimit, cfg.HistoryFailureLimit = 4, 2
	s := openTest(t, cfg)
	for i := range 150 {
		s.RecordKeep(exec1("three", i, 1, task.ExecutionOK), 3)
		s.RecordKeep(exec1("none", i, 1, task.ExecutionOK), 0)
		s.RecordKeep(exec1("capped", i, 1, task.ExecutionOK), 1000)
		s.RecordKeep(exec1("default", i, 1, task.ExecutionOK), -1)
		s.Record(exec1("failing", i, 1, task.ExecutionFailed))
	}
	flush(t, s)
	wantSeconds(t, "keep 3", history(t, s, "three", 0), 149, 148, 147)
	wantSeconds(t, "keep 0", history(t, s, "none", 0))
	capped, err := s.HistoryKeep("capped", 0, 1000, -1) // read as kept: History would answer the Config's 4
	if err != nil {
		t.Fatal(err)
	}
	wantSeconds(t, "keep 1000", capped, span(149, 150-MaxHistoryLimit)...)
	wantSeconds(t, "keep -1", history(t, s, "default", 0), 149, 148, 147, 146)
	wantSeconds(t, "failures", history(t, s, "failing", 0), 149, 148)
	if n := countKeys(t, s, nsHistory); n != 3+MaxHistoryLimit+4+2 {
		t.Errorf("%d history keys on disk, want %d", n, 3+MaxHistoryLimit+4+2)
	}
}

// TestHistory_LimitChanges: a lowered limit deletes the extra records at
// the task's next write; a raised one lets the ring grow.
func TestHistory_LimitChanges(t *testing.T) {
	s := openTest(t, testConfig(t))
	for i := range 10 {
		s.RecordKeep(exec1("t", i, 1, task.ExecutionOK), 10)
	}
	flush(t, s)
	s.RecordKeep(exec1("t", 10, 1, task.ExecutionOK), 3)
	wantSeconds(t, "buffered, lowered to 3", history(t, s, "t", 0), 10, 9, 8)
	flush(t, s)
	wantSeconds(t, "written, lowered to 3", history(t, s, "t", 0), 10, 9, 8)
	if n := countKeys(t, s, string(historyPrefix("t"))); n != 3 {
		t.Errorf("%d keys after lowering the limit to 3, want 3", n)
	}
	for i := 11; i < 20; i++ {
		s.RecordKeep(exec1("t", i, 1, task.ExecutionOK), 5)
	}
	flush(t, s)
	wantSeconds(t, "raised to 5", history(t, s, "t", 0), 19, 18, 17, 16, 15)
}

// TestHistory_LimitLoweredWhileBuffered: a read of records still
// buffered, the limit lowered between them, keeps as many as the newest
// says, as the disk will once they are written.
func TestHistory_LimitLoweredWhileBuffered(t *testing.T) {
	cfg := testConfig(t)
	cfg.FlushInterval = 10 * time.Second
	s := openTest(t, cfg)
	for i := range 5 {
		s.RecordKeep(exec1("t", i, 1, task.ExecutionOK), 5)
	}
	s.RecordKeep(exec1("t", 5, 1, task.ExecutionOK), 2)
	wantSeconds(t, "buffered, lowered to 2", history(t, s, "t", 0), 5, 4)
	flush(t, s)
	wantSeconds(t, "written, lowered to 2", history(t, s, "t", 0), 5, 4)
}

// TestHistory_LimitLoweredToZero: a task's limit lowered to 0 keeps
// none of its records of that class from its next fire on, those written
// before included (buffered, then on disk), and leaves the other class
// alone; a limit raised again starts over.
func TestHistory_LimitLoweredToZero(t *testing.T) {
	s := openTest(t, testConfig(t))
	for i := range 4 {
		s.RecordKeep(exec1("t", i, 1, task.ExecutionOK), 10)
		s.RecordKeep(exec1("t", i, 1, task.ExecutionFailed), 10)
	}
	flush(t, s)
	s.RecordKeep(exec1("t", 4, 1, task.ExecutionOK), 0)
	if got := statuses(history(t, s, "t", 0)); got != "failed,failed,failed,failed" {
		t.Errorf("buffered, successes lowered to 0: %s, want the 4 failures", got)
	}
	flush(t, s)
	if got := statuses(history(t, s, "t", 0)); got != "failed,failed,failed,failed" {
		t.Errorf("written, successes lowered to 0: %s, want the 4 failures", got)
	}
	if n := countKeys(t, s, string(historyPrefix("t"))); n != 4 {
		t.Errorf("%d keys on disk, want the 4 failures'", n)
	}
	s.RecordKeep(exec1("t", 5, 1, task.ExecutionOK), 2)
	flush(t, s)
	wantSeconds(t, "raised to 2", history(t, s, "t", 0), 5, 3, 2, 1, 0)
}

// TestHistory_LostBatchKeepsTheLastN: a batch whose write failed leaves
// each ring where it stood, so the next record overwrites the oldest one
// kept, not a newer one.
func TestHistory_LostBatchKeepsTheLastN(t *testing.T) {
	cfg := testConfig(t)
	full := failingWriter(&cfg, syscall.EIO)
	s := openTest(t, cfg)
	for i := range 3 {
		s.RecordKeep(exec1("t", i, 1, task.ExecutionOK), 3)
	}
	flush(t, s)
	full.Store(true)
	s.RecordKeep(exec1("t", 3, 1, task.ExecutionOK), 3)
	s.RecordKeep(exec1("t", 4, 1, task.ExecutionOK), 3)
	if err := s.Flush(t.Context()); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Flush of the failing batch = %v, want EIO", err)
	}
	full.Store(false)
	s.RecordKeep(exec1("t", 5, 1, task.ExecutionOK), 3)
	flush(t, s)
	wantSeconds(t, "after a lost batch", history(t, s, "t", 0), 5, 2, 1)
}

// TestHistory_RestartKeepsLastN: a reopened store continues each task's
// ring where it stopped, overwriting the oldest record, not the newest.
func TestHistory_RestartKeepsLastN(t *testing.T) {
	cfg := testConfig(t)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		s.Record(exec1("t", i, 1, task.ExecutionOK))
		s.Record(exec1("t", i, 1, task.ExecutionFailed))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, cfg)
	for i := 15; i < 20; i++ {
		s.Record(exec1("t", i, 1, task.ExecutionOK))
	}
	flush(t, s)
	var oks, fails []task.Execution
	for _, e := range history(t, s, "t", 0) {
		if e.Status == task.ExecutionOK {
			oks = append(oks, e)
		} else {
			fails = append(fails, e)
		}
	}
	wantSeconds(t, "successes after restart", oks, span(19, 10)...)
	wantSeconds(t, "failures after restart", fails, span(14, 5)...)
}

// TestHistory_LimitsLoweredAtARestart: records kept under the limits of
// an earlier Open, higher than the Config's now, stay on disk until the
// task's next record of their class, which may never come on this node;
// a read answers at most the limits it is given (the Config's by
// default) at once, 0 none, and keeps what a task's own limit keeps.
func TestHistory_LimitsLoweredAtARestart(t *testing.T) {
	cfg := testConfig(t)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		s.Record(exec1("t", i, 1, task.ExecutionOK))
		s.Record(exec1("t", i, 1, task.ExecutionFailed))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.HistorySuccessLimit, cfg.HistoryFailureLimit = 3, 0
	s = openTest(t, cfg)
	wantSeconds(t, "the Config's limits, 3 and 0", history(t, s, "t", 0), 9, 8, 7)
	for _, c := range []struct {
		successes, failures int
		want                string
	}{
		{-1, 2, "failed,ok,failed,ok,ok"},
		{10, 1, "failed,ok" + strings.Repeat(",ok", 9)},
		{1000, 1000, "failed,ok" + strings.Repeat(",failed,ok", 9)},
	} {
		h, err := s.HistoryKeep("t", 0, c.successes, c.failures)
		if err != nil {
			t.Fatal(err)
		}
		if got := statuses(h); got != c.want {
			t.Errorf("kept %d and %d: %s, want %s", c.successes, c.failures, got, c.want)
		}
	}
	if n := countKeys(t, s, string(historyPrefix("t"))); n != 20 {
		t.Errorf("%d keys on disk before the task's next record, want the 20 written", n)
	}
}

// TestHistory_DiskBoundedByTasks: however many fires, the disk holds at
// most the limits' worth of records per task.
func TestHistory_DiskBoundedByTasks(t *testing.T) {
	s := openTest(t, testConfig(t))
	const tasks, rounds = 200, 60
	for r := range rounds {
		for i := range tasks {
			st := task.ExecutionOK
			if (i+r)%7 == 0 {
				st = task.ExecutionFailed
			}
			s.Record(exec1(fmt.Sprintf("task-%d", i), r, 1, st))
		}
		flush(t, s)
	}
	if n, most := countKeys(t, s, nsHistory), tasks*(DefaultSuccessLimit+DefaultFailureLimit); n > most {
		t.Errorf("%d history keys for %d tasks, want at most %d", n, tasks, most)
	}
	if s.Dropped() != 0 || s.Sampled() != 0 {
		t.Errorf("dropped %d, sampled %d", s.Dropped(), s.Sampled())
	}
}

// TestHistory_DeleteForgetsSlots: after DeleteHistory a task starts a new
// ring, and its records are only the new ones.
func TestHistory_DeleteForgetsSlots(t *testing.T) {
	s := openTest(t, testConfig(t))
	for i := range 7 {
		s.Record(exec1("t", i, 1, task.ExecutionOK))
	}
	flush(t, s)
	if err := s.DeleteHistory(t.Context(), "t"); err != nil {
		t.Fatal(err)
	}
	s.Record(exec1("t", 100, 1, task.ExecutionOK))
	flush(t, s)
	wantSeconds(t, "after delete", history(t, s, "t", 0), 100)
}

// TestSampling_Adapts: sampling rises at once by the factor that brings
// the next batch to a quarter of the buffer when a batch and the records
// refused meanwhile reach half of it, and halves per batch under an
// eighth.
func TestSampling_Adapts(t *testing.T) {
	var h historyBuffer
	h.init(Config{History: HistoryAll, HistoryBuffer: 64}, 0)
	steps := []struct {
		n, refused int
		want       uint32
	}{
		{10, 0, 1}, {31, 0, 1}, {32, 0, 2}, {40, 0, 6}, {16, 0, 6}, {64, 100, 66}, {20, 0, 66},
		{8, 0, 66}, // an eighth of the buffer is not under it
		{7, 0, 33}, {0, 0, 16}, {0, 0, 8}, {0, 0, 4}, {0, 0, 2}, {0, 0, 1}, {0, 0, 1},
		{2, 1, 2}, // a single refusal doubles it
	}
	for i, st := range steps {
		h.refused = st.refused
		h.adapt(st.n)
		if got := h.sampling.Load(); got != st.want || h.refused != 0 {
			t.Fatalf("step %d (batch %d, refused %d): sampling %d, want %d", i, st.n, st.refused, got, st.want)
		}
	}
	for range 20 {
		h.adapt(64)
	}
	if got := h.sampling.Load(); got != maxSampling {
		t.Errorf("sampling under constant overload = %d, want the cap %d", got, maxSampling)
	}
}

// TestSampling_KeepsFailures: while sampling, about one success in k of
// every task is kept, every failure is, and the rest are counted.
func TestSampling_KeepsFailures(t *testing.T) {
	cfg := testConfig(t)
	cfg.HistorySuccessLimit, cfg.HistoryFailureLimit = MaxHistoryLimit, MaxHistoryLimit
	cfg.FlushInterval = time.Millisecond
	entered, release := blockedWriter(&cfg)
	s := openTest(t, cfg)
	t.Cleanup(release)
	s.Record(exec1("warm", 0, 1, task.ExecutionOK))
	<-entered
	s.history.sampling.Store(4)
	const n = 200 // about 50 kept: under the limit
	for i := range n {
		s.Record(exec1("a", i, 1, task.ExecutionOK))
		s.Record(exec1("b", i, 1, task.ExecutionOK))
		if i%10 == 0 {
			s.Record(exec1("a", i, 2, task.ExecutionFailed))
		}
	}
	kept := map[string]int{}
	for _, id := range []string{"a", "b"} {
		for _, e := range history(t, s, id, 0) {
			kept[id+" "+e.Status]++
		}
	}
	if kept["a failed"] != n/10 {
		t.Errorf("%d failures kept, want all %d", kept["a failed"], n/10)
	}
	for _, id := range []string{"a", "b"} {
		if k := kept[id+" ok"]; k < n/4/2 || k > n/4*2 {
			t.Errorf("task %s: %d of %d successes kept, want about one in 4", id, k, n)
		}
	}
	if got, want := s.Sampled(), uint64(2*n-kept["a ok"]-kept["b ok"]); got != want {
		t.Errorf("Sampled = %d, want %d", got, want)
	}
}

// oldHistoryDir returns the config of a closed store that holds 100
// keys of the unbounded history of earlier versions and partition 1 at
// revision 5.
func oldHistoryDir(t *testing.T) Config {
	t.Helper()
	cfg := testConfig(t)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(1, 5, []KV{{ID: "kept", Value: []byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	err = s.db.Update(func(txn *badger.Txn) error {
		for i := range 100 {
			if err := txn.Set(fmt.Appendf(nil, "%stask\x00%020d", nsOldHistory, i), []byte{1, 0}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestOpen_DropsOldHistory: the unbounded history of earlier versions is
// deleted at Open; the task cache is not touched.
func TestOpen_DropsOldHistory(t *testing.T) {
	cfg := oldHistoryDir(t)
	s := openTest(t, cfg)
	if n := countKeys(t, s, nsOldHistory); n != 0 {
		t.Errorf("%d old history keys after Open, want 0", n)
	}
	rev, err := s.Partition(1, func(string, []byte, int64) error { return nil })
	if err != nil || rev != 5 {
		t.Errorf("partition after Open: revision %d, %v", rev, err)
	}
}

// TestOpen_WithoutOldHistoryLogsNothingOfIt: a directory without the history of
// earlier versions opens without a word of it, with room or without: an
// operator is not told of a deletion or a leftover that is not there.
func TestOpen_WithoutOldHistoryLogsNothingOfIt(t *testing.T) {
	cfg := testConfig(t)
	var logs logbuf.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	for _, minFree := range []int64{cfg.MinFreeBytes, math.MaxInt64 / 2} {
		cfg.MinFreeBytes = minFree
		s, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(logs.String(), "earlier version") {
		t.Errorf("Open of a directory without old history logged about it:\n%s", logs.String())
	}
}

// TestOpen_KeepsOldHistoryWithoutRoom: deleting the history of earlier
// versions flushes the memtables and rewrites the tables that hold it, as
// a write and its compactions would, so an Open on a disk that refuses
// writes leaves it for a later Open, and opens.
func TestOpen_KeepsOldHistoryWithoutRoom(t *testing.T) {
	cfg := oldHistoryDir(t)
	cfg.MinFreeBytes = math.MaxInt64 / 2 // more than any disk has: every write is refused
	s := openTest(t, cfg)
	if n := countKeys(t, s, nsOldHistory); n != 100 {
		t.Errorf("%d old history keys after an Open without room, want the 100 written", n)
	}
}

// TestHistory_ClockBehindAtRestart: a store reopened with its clock behind
// the previous run's (stepped back, a VM restored from a snapshot) still
// orders what it records after everything recorded before: a new record
// is kept while buffered, listed before an earlier record of the same
// fire, and is not the one the ring overwrites after the next restart.
func TestHistory_ClockBehindAtRestart(t *testing.T) {
	cfg := testConfig(t)
	cfg.HistorySuccessLimit = 3
	cfg.FlushInterval = 10 * time.Second // records stay buffered until flushed
	open := func(behind time.Duration) *Store {
		cfg.now = func() time.Time { return time.Now().Add(-behind) }
		return openTest(t, cfg)
	}
	rec := func(s *Store, sec int, node string) {
		e := exec1("t", sec, 1, task.ExecutionOK)
		e.Node = node
		s.Record(e)
	}
	want := func(s *Store, what string, want ...string) {
		t.Helper()
		var got []string
		for _, e := range history(t, s, "t", 0) {
			got = append(got, fmt.Sprintf("%d/%s", int(e.ScheduledAt.Sub(t0)/time.Second), e.Node))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: history %v, want %v", what, got, want)
		}
	}

	s := open(0)
	for sec := range 4 {
		rec(s, sec, "a")
	}
	rec(s, 4, "first") // ring: 3, 4/first, 2
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(time.Hour)
	rec(s, 4, "again") // the same fire recorded again, after the restart
	want(s, "buffered, clock an hour behind", "4/again", "4/first", "3/a")
	flush(t, s)
	want(s, "written, clock an hour behind", "4/again", "4/first", "3/a")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(time.Hour)
	rec(s, 5, "a") // overwrites the oldest, 3
	flush(t, s)
	want(s, "after another restart", "5/a", "4/again", "4/first")
}

// TestHistory_ReadLimitOfZero: a read given a limit of 0 for a class
// answers none of its records, buffered or written, whatever the Config
// keeps: a task's history_limit lowered to 0 holds for its history
// answers at once, before its next record deletes the ring.
func TestHistory_ReadLimitOfZero(t *testing.T) {
	cfg := testConfig(t)
	cfg.FlushInterval = 10 * time.Second // records stay buffered until flushed
	s := openTest(t, cfg)
	for i := range 3 {
		s.Record(exec1("t", i, 1, task.ExecutionOK))
		s.Record(exec1("t", i, 2, task.ExecutionFailed))
	}
	for _, stage := range []string{"buffered", "written"} {
		if stage == "written" {
			flush(t, s)
		}
		for _, c := range []struct {
			successes, failures int
			want                string
		}{
			{0, -1, "failed,failed,failed"},
			{-1, 0, "ok,ok,ok"},
			{0, 0, ""},
		} {
			h, err := s.HistoryKeep("t", 0, c.successes, c.failures)
			if err != nil {
				t.Fatal(err)
			}
			if got := statuses(h); got != c.want {
				t.Errorf("%s, kept %d and %d: %q, want %q", stage, c.successes, c.failures, got, c.want)
			}
		}
	}
}

// TestSampling_SmallBufferOnlyWhenRefused: a buffer of fewer than 8
// records is half full in ordinary traffic, so only a record refused for
// room starts sampling there; from 8 on, a batch of half the buffer does.
func TestSampling_SmallBufferOnlyWhenRefused(t *testing.T) {
	for _, c := range []struct {
		buffer, n, refused int
		want               uint32
	}{
		{7, 7, 0, 1},
		{7, 1, 1, 2},
		{8, 3, 0, 1},
		{8, 4, 0, 2},
	} {
		var h historyBuffer
		h.init(Config{History: HistoryAll, HistoryBuffer: c.buffer}, 0)
		h.refused = c.refused
		h.adapt(c.n)
		if got := h.sampling.Load(); got != c.want {
			t.Errorf("buffer %d, batch %d, refused %d: sampling %d, want %d", c.buffer, c.n, c.refused, got, c.want)
		}
	}
}
