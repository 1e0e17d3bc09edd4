package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	badger "github.com/dgraph-io/badger/v4"
	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/task"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir) // never returns: killed by the parent test
	}
	if dir := os.Getenv(openChildEnv); dir != "" {
		openChild(dir) // never returns
	}
	if arg := os.Getenv(fullDiskChildEnv); arg != "" {
		fullDiskChild(arg) // never returns
	}
	goleak.VerifyTestMain(m)
}

// testConfig is DefaultConfig in a temporary directory with small
// memtables and logs at Warn into the test's output.
func testConfig(t testing.TB) Config {
	t.Helper()
	cfg := DefaultConfig(t.TempDir())
	cfg.MemTableSize = 4 << 20
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return cfg
}

// refusedOpen opens cfg, which must fail with an *OpenError for cfg.Dir
// that does not match ErrCorrupt (the server would set the directory
// aside), and returns that error; what names the case in a failure.
func refusedOpen(t *testing.T, cfg Config, what string) error {
	t.Helper()
	s, err := Open(cfg)
	if err == nil {
		s.Close()
		t.Fatalf("Open %s succeeded", what)
	}
	t.Logf("Open: %v", err)
	var oe *OpenError
	if !errors.As(err, &oe) || oe.Dir != cfg.Dir || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open %s = %v, want an *OpenError for %s not matching ErrCorrupt", what, err, cfg.Dir)
	}
	return err
}

func openTest(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		field  string // "" when valid
	}{
		{"default", func(*Config) {}, ""},
		{"history failures", func(c *Config) { c.History = HistoryFailures }, ""},
		{"history none", func(c *Config) { c.History = HistoryNone }, ""},
		{"gc disabled", func(c *Config) { c.GCInterval = 0 }, ""},
		{"no block cache", func(c *Config) { c.BlockCacheSize = 0 }, ""},
		{"no dir", func(c *Config) { c.Dir = "" }, "Dir"},
		{"unknown history", func(c *Config) { c.History = "some" }, "History"},
		{"empty history", func(c *Config) { c.History = "" }, "History"},
		{"ttl under 1s", func(c *Config) { c.HistoryTTL = 999 * time.Millisecond }, "HistoryTTL"},
		{"zero buffer", func(c *Config) { c.HistoryBuffer = 0 }, "HistoryBuffer"},
		{"largest buffer", func(c *Config) { c.HistoryBuffer = MaxHistoryBuffer }, ""},
		{"huge buffer", func(c *Config) { c.HistoryBuffer = MaxHistoryBuffer + 1 }, "HistoryBuffer"},
		{"zero flush interval", func(c *Config) { c.FlushInterval = 0 }, "FlushInterval"},
		{"huge flush interval", func(c *Config) { c.FlushInterval = time.Minute }, "FlushInterval"},
		{"negative gc", func(c *Config) { c.GCInterval = -time.Second }, "GCInterval"},
		{"tiny memtable", func(c *Config) { c.MemTableSize = 1 << 19 }, "MemTableSize"},
		{"no memtables", func(c *Config) { c.NumMemtables = 0 }, "NumMemtables"},
		{"negative block cache", func(c *Config) { c.BlockCacheSize = -1 }, "BlockCacheSize"},
		{"zero value threshold", func(c *Config) { c.ValueThreshold = 0 }, "ValueThreshold"},
		{"value threshold over 1 MiB", func(c *Config) { c.MemTableSize = 64 << 20; c.ValueThreshold = 2 << 20 }, "ValueThreshold"},
		{"value threshold over 15% of memtable", func(c *Config) { c.MemTableSize = 1 << 20; c.ValueThreshold = 256 << 10 }, "ValueThreshold"},
		{"one compactor", func(c *Config) { c.NumCompactors = 1 }, "NumCompactors"},
		{"negative settle timeout", func(c *Config) { c.SettleTimeout = -time.Second }, "SettleTimeout"},
		{"settle timeout too long", func(c *Config) { c.SettleTimeout = MaxSettleTimeout + time.Second }, "SettleTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig("/tmp/x")
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.field {
				t.Fatalf("Validate = %v, want a *ValidationError on %s", err, tt.field)
			}
			if !strings.HasPrefix(err.Error(), "store: ") {
				t.Errorf("message %q lacks the package prefix", err)
			}
		})
	}
}

func TestOpen_InvalidConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.History = "everything"
	s, err := Open(cfg)
	var ve *ValidationError
	if !errors.As(err, &ve) {
		s.Close()
		t.Fatalf("Open = %v, want a *ValidationError", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "MANIFEST")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("invalid config wrote to the directory: %v", err)
	}
}

func TestOpen_Locked(t *testing.T) {
	cfg := testConfig(t)
	first, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Open(cfg)
	if !errors.Is(err, ErrLocked) {
		second.Close()
		first.Close()
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	want := fmt.Sprintf("store: data directory %s is in use by another process", cfg.Dir)
	if err.Error() != want {
		t.Errorf("message = %q, want %q", err, want)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// The lock goes with Close.
	third, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	if err := third.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestClose_Idempotent(t *testing.T) {
	s, err := Open(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := s.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	ctx := context.Background()
	calls := map[string]error{
		"Apply": s.Apply(1, 1, nil, nil),
		"Reset": s.Reset(1, 1, nil),
		"Drop":  s.Drop(1),
		"Flush": s.Flush(ctx),
	}
	_, calls["Partition"] = s.Partition(1, nil)
	_, calls["History"] = s.History("a", 1)
	calls["DeleteHistory"] = s.DeleteHistory(ctx, "a")
	for name, err := range calls {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
	s.Record(task.Execution{TaskID: "a", Status: task.ExecutionOK})
	if got := s.Dropped(); got != 1 {
		t.Errorf("Dropped after a Record after Close = %d, want 1", got)
	}
}

func TestClose_FlushesHistory(t *testing.T) {
	cfg := testConfig(t)
	cfg.FlushInterval = 10 * time.Second // only Close writes
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	const n = 1000
	for i := range n {
		s.Record(task.Execution{TaskID: "t", ScheduledAt: base.Add(time.Duration(i) * time.Second), Attempt: 1, Status: task.ExecutionOK})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, cfg)
	got, err := s.History("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != DefaultSuccessLimit || !got[0].ScheduledAt.Equal(base.Add((n-1)*time.Second)) {
		t.Fatalf("after Close and reopen: %d records, want the last %d", len(got), DefaultSuccessLimit)
	}
	if s.Dropped() != 0 {
		t.Errorf("Dropped = %d", s.Dropped())
	}
}

// TestReopen_KeepsPartitions is invariant 7's part in the store: what was
// applied is there, with its revision, after a restart.
func TestReopen_KeepsPartitions(t *testing.T) {
	cfg := testConfig(t)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(7, 100, []KV{{ID: "a", Value: []byte("A")}, {ID: "b", Value: []byte("B")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(7, 105, []KV{{ID: "c", Value: []byte("C")}}, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, cfg)
	rev, got := scan(t, s, 7)
	if rev != 105 || got != "b=B c=C" {
		t.Fatalf("after reopen: rev %d tasks %q, want 105 \"b=B c=C\"", rev, got)
	}
}

// corruptDir makes a directory with a few flushed tables and returns it.
func corruptDir(t *testing.T) Config {
	t.Helper()
	cfg := testConfig(t)
	cfg.MemTableSize = 1 << 20
	cfg.ValueThreshold = 1 << 10 // some values in the value log too
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(20) {
		var kvs []KV
		for i := range 200 {
			kvs = append(kvs, KV{ID: fmt.Sprintf("task-%d", i), Value: make([]byte, 100+(i%20)*100)})
		}
		if err := s.Reset(p, 1, kvs); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func filesWithSuffix(t *testing.T, dir, suffix string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+suffix))
	if err != nil || len(m) == 0 {
		t.Fatalf("no %s file in %s (%v)", suffix, dir, err)
	}
	return m
}

func overwrite(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

func garbage(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// dirContents lists the files of dir with their sizes and a hash of
// their contents.
func dirContents(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%d:%x ", e.Name(), len(data), xxhash.Sum64(data))
	}
	return b.String()
}

// A panic of Badger's ends up in Open's error, which a start prints on
// one line: the report's lines joined, its blank and "==" rule lines
// left out.
func TestOneLine_JoinsAPanicReport(t *testing.T) {
	report := "\n== Recovering from panic ==\n  block checksum mismatch  \n\n== table 00007.sst ==\noffset 4096\n"
	if got, want := oneLine(report), "block checksum mismatch; offset 4096"; got != want {
		t.Errorf("oneLine = %q, want %q", got, want)
	}
}

func TestOpen_Corrupt(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
		kept   string // a pattern of the files SetAside must keep; "" is the MANIFEST
	}{
		{"MANIFEST garbage", func(t *testing.T, dir string) {
			overwrite(t, filepath.Join(dir, "MANIFEST"), 0, garbage(64))
		}, ""},
		{"MANIFEST missing", func(t *testing.T, dir string) {
			// Badger alone starts a new MANIFEST and deletes every table
			// it does not list: the history gone without a word.
			if err := os.Remove(filepath.Join(dir, "MANIFEST")); err != nil {
				t.Fatal(err)
			}
		}, "*.sst"},
		{"sst garbage", func(t *testing.T, dir string) {
			// This one makes Badger panic on one of its own goroutines.
			for _, f := range filesWithSuffix(t, dir, ".sst") {
				fi, _ := os.Stat(f)
				overwrite(t, f, 0, garbage(int(fi.Size())))
			}
		}, ""},
		{"sst truncated", func(t *testing.T, dir string) {
			f := filesWithSuffix(t, dir, ".sst")[0]
			if err := os.Truncate(f, 10); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"sst index bit flip", func(t *testing.T, dir string) {
			// Badger alone logs the checksum mismatch and opens without
			// the table: tasks gone, revision kept.
			f := filesWithSuffix(t, dir, ".sst")[0]
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			end := len(data) - 4
			end -= int(binary.BigEndian.Uint32(data[end:])) // checksum
			end -= 4                                        // index length
			overwrite(t, f, int64(end-8), []byte{data[end-8] ^ 0xff})
		}, ""},
		{"sst missing", func(t *testing.T, dir string) {
			if err := os.Remove(filesWithSuffix(t, dir, ".sst")[0]); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"vlog garbage", func(t *testing.T, dir string) {
			for _, f := range filesWithSuffix(t, dir, ".vlog") {
				fi, _ := os.Stat(f)
				overwrite(t, f, 0, garbage(int(min(fi.Size(), 4096))))
			}
		}, ""},
		{"KEYREGISTRY garbage", func(t *testing.T, dir string) {
			overwrite(t, filepath.Join(dir, "KEYREGISTRY"), 0, garbage(64))
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := corruptDir(t)
			tt.damage(t, cfg.Dir)
			before := dirContents(t, cfg.Dir)
			s, err := Open(cfg)
			if err == nil {
				s.Close()
				t.Fatal("Open of a corrupt directory succeeded")
			}
			if after := dirContents(t, cfg.Dir); after != before {
				t.Errorf("the failed Open changed the directory:\nbefore %s\nafter  %s", before, after)
			}
			var oe *OpenError
			if !errors.As(err, &oe) || oe.Dir != cfg.Dir {
				t.Fatalf("Open = %v, want an *OpenError for %s", err, cfg.Dir)
			}
			if !strings.Contains(err.Error(), cfg.Dir) {
				t.Errorf("message %q does not name the directory", err)
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("Open = %v, want an error matching ErrCorrupt", err)
			}
			t.Logf("Open: %v", err)
			// The failed Open released the directory: once SetAside has
			// moved it away, the same path opens empty.
			aside, size, err := SetAside(cfg.Dir)
			if err != nil {
				t.Fatal(err)
			}
			if aside != cfg.Dir+AsideSuffix || size <= 0 {
				t.Fatalf("SetAside = %s, %d bytes", aside, size)
			}
			kept, err := filepath.Glob(filepath.Join(aside, cmp.Or(tt.kept, "MANIFEST")))
			if err != nil || len(kept) == 0 {
				t.Fatalf("the corrupt files (%s) were not kept: %v", cmp.Or(tt.kept, "MANIFEST"), err)
			}
			s = openTest(t, cfg)
			if rev, _ := s.Partition(0, nil); rev != 0 {
				t.Errorf("fresh directory has revision %d", rev)
			}
		})
	}
}

// TestOpen_AnotherVersion: a directory another layout version wrote (a
// node rolled back after an upgrade) is refused with an error that says
// so and is not ErrCorrupt, which would have it set aside as damaged and
// its history lost; the failed Open changes nothing in it.
func TestOpen_AnotherVersion(t *testing.T) {
	cfg := corruptDir(t)
	var next [2]byte
	binary.BigEndian.PutUint16(next[:], formatVersion+1)
	overwrite(t, filepath.Join(cfg.Dir, "MANIFEST"), 4, next[:]) // Badger's external magic
	// An empty log a crash left, which Open removes from a directory it opens.
	if err := os.WriteFile(filepath.Join(cfg.Dir, "000099.mem"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before := dirContents(t, cfg.Dir)
	s, err := Open(cfg)
	if err == nil {
		s.Close()
		t.Fatal("Open of another version's directory succeeded")
	}
	var oe *OpenError
	if !errors.As(err, &oe) || !errors.Is(err, ErrVersion) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open = %v, want an *OpenError matching ErrVersion, not ErrCorrupt", err)
	}
	if want := fmt.Sprintf("layout version %d", formatVersion+1); !strings.Contains(err.Error(), want) {
		t.Errorf("message %q does not name the directory's version (%s)", err, want)
	}
	if after := dirContents(t, cfg.Dir); after != before {
		t.Errorf("the failed Open changed the directory:\nbefore %s\nafter  %s", before, after)
	}
	t.Logf("Open: %v", err)
}

// TestOpen_RemovesAnEmptyLogACrashLeft: a memtable or value log left
// empty by a crash between its creation and its sizing, which Badger
// refuses, is removed, every one of them, and the directory opens with
// what it held.
func TestOpen_RemovesAnEmptyLogACrashLeft(t *testing.T) {
	cfg := corruptDir(t)
	var empties []string // as Badger names them
	for _, name := range []string{"00098.mem", "00099.mem", "000099.vlog"} {
		empties = append(empties, filepath.Join(cfg.Dir, name))
	}
	for _, empty := range empties {
		if err := os.WriteFile(empty, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := openTest(t, cfg)
	if rev, _ := s.Partition(0, nil); rev != 1 {
		t.Errorf("partition 0 at revision %d, want 1", rev)
	}
	for _, empty := range empties {
		if _, err := os.Stat(empty); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the empty log %s is still there (%v)", filepath.Base(empty), err)
		}
	}
}

// TestSetAside_ReplacesEarlierCopy: a second SetAside keeps only the
// newest damaged directory, and one of a missing directory fails by name.
func TestSetAside_ReplacesEarlierCopy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	for _, name := range []string{"first", "second"} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		aside, size, err := SetAside(dir)
		if err != nil || size != int64(len(name)) {
			t.Fatalf("SetAside = %s, %d, %v", aside, size, err)
		}
	}
	entries, err := os.ReadDir(dir + AsideSuffix)
	if err != nil || len(entries) != 1 || entries[0].Name() != "second" {
		t.Fatalf("aside holds %v (%v), want only the second copy", entries, err)
	}
	if _, _, err := SetAside(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("SetAside of a missing directory = %v, want an error naming it", err)
	}
}

// gcConfig is testConfig logging at Info into logs, with a value-log GC
// round every millisecond whose runs, counted in runs, find nothing to
// rewrite.
func gcConfig(t *testing.T, logs *logbuf.Buffer) (Config, *atomic.Int32) {
	cfg := testConfig(t)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.GCInterval = time.Millisecond
	var runs atomic.Int32
	cfg.valueLogGC = func(float64) error {
		runs.Add(1)
		return badger.ErrNoRewrite
	}
	return cfg, &runs
}

// TestStore_ValueLogGCWaitsForRoom: value-log GC writes a file's live
// entries again before it deletes the file, through memory-mapped files
// as a write does, so it does not run while writes are refused for want
// of room; and it says so once, not at every round.
func TestStore_ValueLogGCWaitsForRoom(t *testing.T) {
	var logs logbuf.Buffer
	cfg, runs := gcConfig(t, &logs)
	cfg.MinFreeBytes = math.MaxInt64 / 2 // more than any disk has: every write is refused
	s := openTest(t, cfg)
	waitFor(t, 10*time.Second, "5 GC rounds skipped", func() bool { return s.gcSkipped.Load() >= 5 })
	if n := runs.Load(); n > 0 {
		t.Errorf("value-log GC ran %d times on a disk that refuses writes", n)
	}
	if lines := strings.Count(logs.String(), "value-log GC skipped"); lines != 1 || !strings.Contains(logs.String(), "disk full") {
		t.Errorf("%d rounds skipped: %d log lines, want 1 naming the full disk:\n%s", s.gcSkipped.Load(), lines, logs.String())
	}
}

// TestStore_ValueLogGCQuietWithNothingToCollect: a GC round that finds no
// file worth rewriting, every five minutes on most nodes, logs nothing,
// nor does one after a round that was not skipped.
func TestStore_ValueLogGCQuietWithNothingToCollect(t *testing.T) {
	var logs logbuf.Buffer
	cfg, runs := gcConfig(t, &logs)
	s := openTest(t, cfg)
	waitFor(t, 10*time.Second, "5 GC rounds", func() bool { return runs.Load() >= 5 })
	if err := s.Close(); err != nil { // the GC loop is done logging
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "value-log GC") {
		t.Errorf("%d GC rounds with nothing to collect logged:\n%s", runs.Load(), logs.String())
	}
}

// A table overwritten with 4 KiB of garbage anywhere is found by Open
// (ErrCorrupt), or else everything reads back whole. Open used to read one
// block a table, and Badger's reads end silently at a damaged block: a
// Get answered not found (a partition read as never synced), and a scan
// stopped short, which the task count catches but nothing did for the
// history, read back with records missing.
func TestOpen_DamagedBlockAnywhereIsCorrupt(t *testing.T) {
	const partitions, tasks, records = 20, 200, 10
	cfg := testConfig(t)
	cfg.MemTableSize = 1 << 20
	s := openTest(t, cfg)
	for p := range uint32(partitions) {
		var kvs []KV
		for i := range tasks {
			kvs = append(kvs, KV{ID: fmt.Sprintf("task-%d", i), Value: make([]byte, 100+(i%20)*20)})
		}
		if err := s.Reset(p, 1, kvs); err != nil {
			t.Fatal(err)
		}
	}
	for sec := range records {
		for i := range partitions * tasks {
			s.Record(exec1(fmt.Sprintf("task-%d", i), sec, 1, task.ExecutionOK))
		}
		if err := s.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	found := 0
	pristine := cfg.Dir
	for _, name := range filesWithSuffix(t, pristine, ".sst") {
		whole, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		size := len(whole)
		for _, off := range []int{0, size / 4, size / 2, size * 3 / 4, size - 4096} {
			for _, damage := range []struct {
				what string
				data []byte
			}{{"4 KiB of garbage", garbage(4096)}, {"a byte flipped", []byte{^whole[off]}}} {
				// A copy each time: Badger compacts at Open, and rewrites
				// what it reads of the damaged table.
				cfg.Dir = filepath.Join(t.TempDir(), "cache")
				if err := os.CopyFS(cfg.Dir, os.DirFS(pristine)); err != nil {
					t.Fatal(err)
				}
				f := filepath.Join(cfg.Dir, filepath.Base(name))
				overwrite(t, f, int64(off), damage.data)
				where := fmt.Sprintf("%s at %d of %s", damage.what, off, filepath.Base(f))
				s, err := Open(cfg)
				if err != nil {
					t.Logf("%s: %v", where, err)
					if !errors.Is(err, ErrCorrupt) {
						t.Errorf("%s: Open = %v, want an error matching ErrCorrupt", where, err)
					}
					found++
					continue
				}
				var short []string
				for p := range uint32(partitions) {
					n := 0
					rev, err := s.Partition(p, func(string, []byte, int64) error { n++; return nil })
					if rev != 1 || n != tasks || err != nil {
						short = append(short, fmt.Sprintf("partition %d: revision %d, %d tasks, %v", p, rev, n, err))
					}
				}
				for i := range partitions * tasks {
					id := fmt.Sprintf("task-%d", i)
					if h, err := s.History(id, 0); len(h) != records || err != nil {
						short = append(short, fmt.Sprintf("history of %s: %d records, %v", id, len(h), err))
					}
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				if len(short) > 0 {
					t.Errorf("%s: Open succeeded and %d reads were short or failed, first %s", where, len(short), short[0])
				}
			}
		}
	}
	if found == 0 {
		t.Error("Open found no damage")
	}
}
