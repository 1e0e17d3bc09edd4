package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/shardcron/shardcron/task"
)

// scan returns p's revision and tasks as "id=value id=value".
func scan(t testing.TB, s *Store, p uint32) (int64, string) {
	t.Helper()
	var parts []string
	rev, err := s.Partition(p, func(id string, v []byte, _ int64) error {
		parts = append(parts, id+"="+string(v))
		return nil
	})
	if err != nil {
		t.Fatalf("Partition(%d): %v", p, err)
	}
	return rev, strings.Join(parts, " ")
}

func kvs(pairs ...string) []KV {
	var out []KV
	for _, p := range pairs {
		id, v, _ := strings.Cut(p, "=")
		out = append(out, KV{ID: id, Value: []byte(v)})
	}
	return out
}

// A task's creation revision is cached with it, through a Reset and an
// Apply, split or not; a task cached without one (as every task of a
// cache written before creations were kept) reads 0, its value as
// written. A value marked with a creation revision too short to hold one
// is corrupt.
func TestPartition_CreatedRevisions(t *testing.T) {
	for _, n := range []int{10, 1000} { // 1000 take the split path
		t.Run(fmt.Sprintf("tasks=%d", n), func(t *testing.T) {
			cfg := splitConfig(t)
			splits := 0
			cfg.beforeRevision = func() error { splits++; return nil }
			s := openTest(t, cfg)
			tasks := bigTasks("a", n, 'x')
			for i := range tasks[1:] {
				tasks[1+i].Created = int64(10 + i)
			}
			if err := s.Reset(1, 5000, tasks); err != nil {
				t.Fatal(err)
			}
			again := bigTasks("a", n, 'y')[1:] // all but the first, created again
			for i := range again {
				again[i].Created = int64(5001 + i)
			}
			if err := s.Apply(1, 5001, again, nil); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 0, true: 2}[n == 1000]; splits != want {
				t.Fatalf("%d split writes, want %d", splits, want)
			}
			checkTasks(t, s, 1, 5001, append(tasks[:1:1], again...))
			got := map[string]int64{}
			if _, err := s.Partition(1, func(id string, _ []byte, created int64) error { got[id] = created; return nil }); err != nil {
				t.Fatal(err)
			}
			if got[tasks[0].ID] != 0 || got[again[0].ID] != 5001 || got[again[n-2].ID] != int64(5001+n-2) {
				t.Errorf("created %d, %d, %d, want 0 (cached without), 5001, %d", got[tasks[0].ID], got[again[0].ID], got[again[n-2].ID], 5001+n-2)
			}
		})
	}
	s := openTest(t, testConfig(t))
	if err := s.Reset(1, 100, kvs("a=1")); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(txn *badger.Txn) error {
		return txn.SetEntry(badger.NewEntry(taskKey(1, "a"), []byte("1")).WithMeta(metaCreated))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Partition(1, func(string, []byte, int64) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a value marked with a creation revision of 1 byte: %v, want ErrCorrupt", err)
	}
}

// An empty value cached with its creation revision is the revision alone
// (8 bytes): it reads back empty with its revision, not as corrupt, which
// would send the caller to etcd for p at every read.
func TestPartition_EmptyValueWithItsCreation(t *testing.T) {
	s := openTest(t, testConfig(t))
	if err := s.Reset(1, 100, []KV{{ID: "a", Created: 7}}); err != nil {
		t.Fatal(err)
	}
	created, value := int64(-1), []byte("unset")
	rev, err := s.Partition(1, func(_ string, v []byte, c int64) error {
		created, value = c, bytes.Clone(v)
		return nil
	})
	if err != nil || rev != 100 || created != 7 || len(value) != 0 {
		t.Errorf("Partition = %d, %v; task created %d, value %q; want 100, nil, 7, empty", rev, err, created, value)
	}
}

func TestPartition_NeverSynced(t *testing.T) {
	s := openTest(t, testConfig(t))
	called := false
	rev, err := s.Partition(3, func(string, []byte, int64) error { called = true; return nil })
	if rev != 0 || err != nil || called {
		t.Fatalf("Partition of an empty store = %d, %v (fn called: %v), want 0, nil, not called", rev, err, called)
	}
}

// TestPartition_Steps applies a sequence of writes to one store and checks
// every partition after each.
func TestPartition_Steps(t *testing.T) {
	type state struct {
		rev   int64
		tasks string
	}
	const (
		p1 = 1
		p2 = 0x100 // shares no prefix with p1 despite the bytes
		pM = math.MaxUint32
	)
	steps := []struct {
		name string
		do   func(s *Store) error
		want map[uint32]state
	}{
		{"reset p1", func(s *Store) error { return s.Reset(p1, 10, kvs("a=1", "b=2")) },
			map[uint32]state{p1: {10, "a=1 b=2"}, p2: {0, ""}}},
		{"apply puts", func(s *Store) error { return s.Apply(p1, 11, kvs("c=3", "a=9"), nil) },
			map[uint32]state{p1: {11, "a=9 b=2 c=3"}}},
		{"apply deletes, one unknown", func(s *Store) error { return s.Apply(p1, 12, nil, []string{"b", "zz"}) },
			map[uint32]state{p1: {12, "a=9 c=3"}}},
		{"apply put and delete of one id", func(s *Store) error { return s.Apply(p1, 13, kvs("d=4"), []string{"d"}) },
			map[uint32]state{p1: {13, "a=9 c=3"}}},
		{"apply nothing moves the revision", func(s *Store) error { return s.Apply(p1, 14, nil, nil) },
			map[uint32]state{p1: {14, "a=9 c=3"}}},
		{"reset p2", func(s *Store) error { return s.Reset(p2, 5, kvs("x=1")) },
			map[uint32]state{p1: {14, "a=9 c=3"}, p2: {5, "x=1"}}},
		{"reset p1 replaces", func(s *Store) error { return s.Reset(p1, 20, kvs("c=30", "e=5")) },
			map[uint32]state{p1: {20, "c=30 e=5"}, p2: {5, "x=1"}}},
		{"ids with separators", func(s *Store) error { return s.Apply(pM, 1, kvs("a/b=1", "a b=2", "é=3"), nil) },
			map[uint32]state{pM: {1, "a b=2 a/b=1 é=3"}}},
		{"drop p1", func(s *Store) error { return s.Drop(p1) },
			map[uint32]state{p1: {0, ""}, p2: {5, "x=1"}, pM: {1, "a b=2 a/b=1 é=3"}}},
		{"drop unknown", func(s *Store) error { return s.Drop(42) },
			map[uint32]state{42: {0, ""}, p2: {5, "x=1"}}},
		{"apply after drop", func(s *Store) error { return s.Apply(p1, 21, kvs("f=6"), nil) },
			map[uint32]state{p1: {21, "f=6"}}},
		{"reset to empty", func(s *Store) error { return s.Reset(p2, 6, nil) },
			map[uint32]state{p2: {6, ""}}},
	}
	s := openTest(t, testConfig(t))
	for _, st := range steps {
		if err := st.do(s); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		for p, want := range st.want {
			rev, tasks := scan(t, s, p)
			if rev != want.rev || tasks != want.tasks {
				t.Fatalf("%s: partition %d = %d %q, want %d %q", st.name, p, rev, tasks, want.rev, want.tasks)
			}
		}
	}
}

func TestPartition_Errors(t *testing.T) {
	s := openTest(t, testConfig(t))
	for _, rev := range []int64{0, -1} {
		if err := s.Apply(1, rev, kvs("a=1"), nil); err == nil {
			t.Errorf("Apply at revision %d succeeded", rev)
		}
		if err := s.Reset(1, rev, kvs("a=1")); err == nil {
			t.Errorf("Reset at revision %d succeeded", rev)
		}
	}
	if rev, tasks := scan(t, s, 1); rev != 0 || tasks != "" {
		t.Errorf("refused writes changed the partition: %d %q", rev, tasks)
	}

	if err := s.Reset(1, 3, kvs("a=1", "b=2", "c=3")); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("stop")
	n := 0
	_, err := s.Partition(1, func(string, []byte, int64) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("Partition with a failing fn = %v after %d calls, want the fn's error after 1", err, n)
	}
	rev, err := s.Partition(1, nil)
	if rev != 3 || err != nil {
		t.Errorf("Partition(nil fn) = %d, %v, want 3, nil", rev, err)
	}
}

// splitConfig makes transactions small (15% of 1 MiB) so that a few
// hundred KiB of tasks take the split path.
func splitConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.MemTableSize = 1 << 20
	cfg.ValueThreshold = 1 << 10
	return cfg
}

func bigTasks(prefix string, n int, gen byte) []KV {
	out := make([]KV, n)
	for i := range out {
		out[i] = KV{ID: fmt.Sprintf("%s%05d", prefix, i), Value: bytes.Repeat([]byte{gen}, 1000)}
	}
	return out
}

// checkTasks asserts that p is at rev and holds exactly want.
func checkTasks(t *testing.T, s *Store, p uint32, wantRev int64, want []KV) {
	t.Helper()
	got := map[string][]byte{}
	rev, err := s.Partition(p, func(id string, v []byte, _ int64) error {
		got[id] = bytes.Clone(v)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rev != wantRev {
		t.Errorf("revision %d, want %d", rev, wantRev)
	}
	if len(got) != len(want) {
		t.Errorf("%d tasks, want %d", len(got), len(want))
	}
	for _, kv := range want {
		if !bytes.Equal(got[kv.ID], kv.Value) {
			t.Fatalf("task %s = %.10q..., want %.10q...", kv.ID, got[kv.ID], kv.Value)
		}
	}
}

func TestApply_Split(t *testing.T) {
	cfg := splitConfig(t)
	splits := 0
	cfg.beforeRevision = func() error { splits++; return nil }
	s := openTest(t, cfg)
	first := bigTasks("a", 1000, 'x')
	if err := s.Apply(1, 10, first, nil); err != nil {
		t.Fatal(err)
	}
	if splits != 1 {
		t.Fatalf("%d split writes, want 1 (the test needs a change too big for one transaction)", splits)
	}
	checkTasks(t, s, 1, 10, first)

	// Update half, delete a quarter.
	second := bigTasks("a", 500, 'y')
	var deletes []string
	for _, kv := range first[750:] {
		deletes = append(deletes, kv.ID)
	}
	if err := s.Apply(1, 11, second, deletes); err != nil {
		t.Fatal(err)
	}
	checkTasks(t, s, 1, 11, append(second, first[500:750]...))
}

func TestReset_Split(t *testing.T) {
	cfg := splitConfig(t)
	splits := 0
	cfg.beforeRevision = func() error { splits++; return nil }
	s := openTest(t, cfg)
	if err := s.Reset(1, 10, append(bigTasks("a", 1000, 'x'), bigTasks("b", 200, 'x')...)); err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(2, 10, bigTasks("a", 10, 'z')); err != nil { // a neighbour that must survive
		t.Fatal(err)
	}
	next := append(bigTasks("a", 600, 'y'), bigTasks("c", 400, 'y')...)
	if err := s.Reset(1, 20, next); err != nil {
		t.Fatal(err)
	}
	if splits != 2 {
		t.Fatalf("%d split writes, want 2", splits)
	}
	checkTasks(t, s, 1, 20, next)
	checkTasks(t, s, 2, 10, bigTasks("a", 10, 'z'))
}

// errCrash is what a split write returns once interruptible's flag is set.
var errCrash = errors.New("crash")

// interruptible is splitConfig whose split writes fail with errCrash, as a
// crash would, just before their revision once *interrupt is set.
func interruptible(t *testing.T) (cfg Config, interrupt *bool) {
	cfg = splitConfig(t)
	interrupt = new(bool)
	cfg.beforeRevision = func() error {
		if *interrupt {
			return errCrash
		}
		return nil
	}
	return cfg, interrupt
}

// TestSplit_InterruptedBeforeRevision stops a split write just before its
// revision, as a crash would: Apply leaves the new data under the old
// revision (a replay from there reapplies it; they update held ids, so the
// count holds), Reset leaves the partition unsynced. Both survive a reopen
// that way.
func TestSplit_InterruptedBeforeRevision(t *testing.T) {
	cfg, interrupt := interruptible(t)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	old := bigTasks("a", 1000, 'x')
	if err := s.Reset(1, 10, old); err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(2, 10, old); err != nil {
		t.Fatal(err)
	}
	*interrupt = true
	newer := bigTasks("a", 1000, 'y')
	if err := s.Apply(1, 11, newer, nil); !errors.Is(err, errCrash) {
		t.Fatalf("Apply = %v, want the interruption", err)
	}
	if err := s.Reset(2, 11, newer); !errors.Is(err, errCrash) {
		t.Fatalf("Reset = %v, want the interruption", err)
	}
	check := func() {
		t.Helper()
		checkTasks(t, s, 1, 10, newer) // ahead of its revision: allowed
		rev, tasks := scan(t, s, 2)
		if rev != 0 || tasks != "" {
			t.Errorf("interrupted Reset: partition 2 = %d with tasks, want unsynced", rev)
		}
	}
	check()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, cfg)
	check()
}

// recorded returns the number of tasks p's revision key records.
func recorded(t *testing.T, s *Store, p uint32) int64 {
	t.Helper()
	var r synced
	if err := s.db.View(func(txn *badger.Txn) (err error) {
		r, err = readRevision(txn, p)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return r.count
}

// The count kept with a partition's revision follows every write: puts of
// new and of held ids, an id put twice, deletes of held and of missing
// ids, an id both put and deleted, in one transaction and split.
func TestPartition_CountFollowsWrites(t *testing.T) {
	s := openTest(t, splitConfig(t))
	steps := []struct {
		name    string
		write   func() error
		holding int64
	}{
		{"reset", func() error { return s.Reset(1, 10, kvs("a=1", "b=1")) }, 2},
		{"puts new and held, one twice", func() error { return s.Apply(1, 11, kvs("b=2", "c=1", "c=2"), nil) }, 3},
		{"deletes held and missing", func() error { return s.Apply(1, 12, nil, []string{"a", "nope"}) }, 2},
		{"put and delete of one id", func() error { return s.Apply(1, 13, kvs("d=1", "b=3"), []string{"d", "b"}) }, 1},
		{"split puts", func() error { return s.Apply(1, 14, bigTasks("x", 1000, 'x'), nil) }, 1001},
		{"split puts held, deletes", func() error {
			return s.Apply(1, 15, bigTasks("x", 1000, 'y'), []string{"x00000", "x00001", "c"})
		}, 998},
		{"split reset", func() error { return s.Reset(1, 16, bigTasks("y", 1200, 'z')) }, 1200},
		{"reset to one", func() error { return s.Reset(1, 17, kvs("z=1")) }, 1},
	}
	for _, st := range steps {
		if err := st.write(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		n := 0
		if _, err := s.Partition(1, func(string, []byte, int64) error { n++; return nil }); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := recorded(t, s, 1); got != st.holding || int64(n) != st.holding {
			t.Fatalf("%s: %d tasks recorded, %d read, want %d", st.name, got, n, st.holding)
		}
	}
}

// A partition whose tasks are fewer than its count records is an error
// matching ErrCorrupt, not a shorter list under a good revision.
func TestPartition_FewerTasksThanRecordedIsCorrupt(t *testing.T) {
	s := openTest(t, testConfig(t))
	if err := s.Reset(3, 10, kvs("a=1", "b=1", "c=1")); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(taskKey(3, "b")) }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Partition(3, func(string, []byte, int64) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Partition = %v, want an error matching ErrCorrupt", err)
	}
}

// A block damaged after Open, which checked every block, is met by a
// scan, where Badger's iterator ends silently at it. Every partition
// reads whole, or fails.
func TestPartition_DamagedBlockIsCorrupt(t *testing.T) {
	cfg := corruptDir(t)
	s := openTest(t, cfg)
	tables := s.db.Tables()
	if len(tables) == 0 {
		t.Fatal("no table")
	}
	f := table.NewFilename(tables[0].ID, cfg.Dir)
	fi, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	// Badger reads its tables through a shared mapping: it sees this.
	overwrite(t, f, fi.Size()/3, garbage(64))
	failed := 0
	for p := range uint32(20) {
		n := 0
		_, err := s.Partition(p, func(string, []byte, int64) error { n++; return nil })
		switch {
		case errors.Is(err, ErrCorrupt):
			failed++
		case err != nil:
			t.Errorf("partition %d: %v, want an error matching ErrCorrupt", p, err)
		case n != 200:
			t.Errorf("partition %d: %d tasks and no error, want 200 or an error", p, n)
		}
	}
	if failed == 0 {
		t.Error("no partition failed: the damage missed every block read")
	}
}

// A partition cached before counts were kept (an 8-byte revision) reads
// as never synced, so that it is read from etcd once; its Reset counts it.
func TestPartition_RevisionWithoutCount(t *testing.T) {
	s := openTest(t, testConfig(t))
	if err := s.Reset(4, 10, kvs("a=1", "b=1")); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(txn *badger.Txn) error {
		return txn.Set(revisionKey(4), binary.BigEndian.AppendUint64(nil, 10))
	}); err != nil {
		t.Fatal(err)
	}
	if rev, got := scan(t, s, 4); rev != 0 || got != "" {
		t.Fatalf("rev %d tasks %q, want never synced", rev, got)
	}
	if err := s.Reset(4, 12, kvs("a=1")); err != nil {
		t.Fatal(err)
	}
	if rev, got := scan(t, s, 4); rev != 12 || got != "a=1" || recorded(t, s, 4) != 1 {
		t.Fatalf("after a Reset: rev %d tasks %q count %d, want 12, a=1, 1", rev, got, recorded(t, s, 4))
	}
}

// A split Apply cut off before its revision keeps the old one; when it
// added tasks, the count tells: the next scan is ErrCorrupt, and the
// caller reads the partition from etcd.
func TestSplit_InterruptedAddIsCorrupt(t *testing.T) {
	cfg, interrupt := interruptible(t)
	s := openTest(t, cfg)
	if err := s.Reset(1, 10, bigTasks("a", 10, 'x')); err != nil {
		t.Fatal(err)
	}
	*interrupt = true
	if err := s.Apply(1, 11, bigTasks("b", 1000, 'y'), nil); !errors.Is(err, errCrash) {
		t.Fatalf("Apply = %v, want the interruption", err)
	}
	if _, err := s.Partition(1, func(string, []byte, int64) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Partition = %v, want an error matching ErrCorrupt", err)
	}
}

// An origin survives a reopen, and DropTasks forgets every partition (the
// revisions with the tasks) but keeps the origin and the history.
func TestOrigin_DropTasksForgetsEveryPartition(t *testing.T) {
	cfg := testConfig(t)
	s := openTest(t, cfg)
	if o, err := s.Origin(); o != nil || err != nil {
		t.Fatalf("Origin of an empty store = %q, %v, want nil, nil", o, err)
	}
	if err := s.SetOrigin([]byte("cluster-a")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint32{0, 7, math.MaxUint32} {
		if err := s.Reset(p, 10, kvs("a=1", "b=2")); err != nil {
			t.Fatal(err)
		}
	}
	s.Record(task.Execution{TaskID: "a", ScheduledAt: time.Unix(100, 0), Attempt: 1, Node: "n1", Status: task.ExecutionOK})
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.DropTasks(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint32{0, 7, math.MaxUint32} {
		if rev, tasks := scan(t, s, p); rev != 0 || tasks != "" {
			t.Errorf("partition %d after DropTasks: revision %d, tasks %q; want none", p, rev, tasks)
		}
	}
	if h, err := s.History("a", 10); err != nil || len(h) != 1 {
		t.Errorf("history after DropTasks: %v, %v; want the one record", h, err)
	}
	if o, err := s.Origin(); string(o) != "cluster-a" || err != nil {
		t.Errorf("Origin after DropTasks = %q, %v, want cluster-a", o, err)
	}
}
