package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4/y"
)

// memLogRevisions is how many revisions memLogDir writes: two of them
// (crashTasks) too big for one transaction, all in one memtable.
const memLogRevisions = 7

// memLogDir writes revisions 1 to memLogRevisions of partition 1
// (crashTasks) through a store whose memtable holds them all, copies its
// directory while it is open, as a kill leaves it (the writes in a
// memtable log only; nothing writes during the copy: no flush, no
// history, no value-log GC), and returns the copy's Config, the path of its
// memtable log and the log's entries: the offset of each, and its end
// last.
func memLogDir(t *testing.T) (cfg Config, log string, entries []int) {
	t.Helper()
	cfg = crashConfig(t.TempDir())
	cfg.Logger = testConfig(t).Logger
	cfg.GCInterval = 0
	s := openTest(t, cfg)
	for rev := int64(1); rev <= memLogRevisions; rev++ {
		if err := s.Apply(1, rev, crashTasks(rev), nil); err != nil {
			t.Fatal(err)
		}
	}
	pristine := filepath.Join(t.TempDir(), "pristine")
	copySparse(t, pristine, cfg.Dir)
	cfg.Dir = pristine
	logs := filesWithSuffix(t, pristine, ".mem")
	if len(logs) != 1 {
		t.Fatalf("%d memtable logs, want 1 (a memtable flushed?)", len(logs))
	}
	data, err := os.ReadFile(logs[0])
	if err != nil {
		t.Fatal(err)
	}
	for off := logHeaderSize; ; {
		entries = append(entries, off)
		_, n := parseLogEntry(data[off:])
		if n == 0 {
			break
		}
		off += n
	}
	return cfg, logs[0], entries
}

// copySparse copies the files of the directory src into dst (see
// copySparseFile).
func copySparse(t testing.TB, dst, src string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		copySparseFile(t, filepath.Join(dst, e.Name()), filepath.Join(src, e.Name()))
	}
}

// copySparseFile copies the file src to dst, leaving unwritten the 4 KiB
// blocks that hold only zeros: Badger's files are mostly holes (a value
// log of 128 MiB), which a plain copy would write.
func copySparseFile(t testing.TB, dst, src string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	var zero, block [4096]byte
	var off int64
	for {
		n, err := io.ReadFull(in, block[:])
		if n > 0 && !bytes.Equal(block[:n], zero[:n]) {
			if _, err := out.WriteAt(block[:n], off); err != nil {
				t.Fatal(err)
			}
		}
		off += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := out.Truncate(off); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// zero overwrites the bytes from off to end of path with zeros.
func zero(t *testing.T, path string, off, end int) {
	t.Helper()
	overwrite(t, path, int64(off), make([]byte, end-off))
}

// flip inverts the byte at off of path.
func flip(t *testing.T, path string, off int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	overwrite(t, path, int64(off), []byte{^data[off]})
}

// TestOpen_TornMemtableLogOpensAPrefix: a memtable log whose newest entry
// a kill cut short, at any point of the log, opens, with a revision that
// has all its tasks (a prefix of the writes), and the whole log opens at
// the last revision. A long entry torn by Go's copy has its first 32
// bytes unwritten (see tornEntrySize), which opens too.
func TestOpen_TornMemtableLogOpensAPrefix(t *testing.T) {
	pristine, log, entries := memLogDir(t)
	end := entries[len(entries)-1]
	type tear struct {
		what string
		off  int // the entry cut short
		at   int // where the write stopped
		head bool
	}
	var tears []tear
	for i, off := range entries[:len(entries)-1] {
		// Every small entry (a revision, the end of a transaction, a
		// task of a small one), a few of the split batches' tasks.
		if size := entries[i+1] - off; i%50 == 0 || size < 500 {
			tears = append(tears, tear{"cut short", off, off + size/2, false})
			if size > 256 {
				tears = append(tears, tear{"cut short, header unwritten", off, off + size/2, true})
			}
		}
	}
	tears = append(tears, tear{what: "no tear", off: end, at: end})
	last := int64(0)
	for _, tr := range tears {
		cfg := pristine
		cfg.Dir = filepath.Join(t.TempDir(), "cache")
		copySparse(t, cfg.Dir, pristine.Dir)
		f := filepath.Join(cfg.Dir, filepath.Base(log))
		zero(t, f, tr.at, end)
		if tr.head {
			zero(t, f, tr.off, tr.off+32)
		}
		where := fmt.Sprintf("%s at %d, entry at %d", tr.what, tr.at, tr.off)
		s, err := Open(cfg)
		if err != nil {
			t.Fatalf("%s: Open: %v", where, err)
		}
		rev, n, err := readCrashed(s)
		if cerr := s.Close(); cerr != nil {
			t.Fatal(cerr)
		}
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if rev < last {
			t.Errorf("%s: revision %d, but a shorter log read %d", where, rev, last)
		}
		last = rev
		if tr.at == end && rev != memLogRevisions {
			t.Errorf("%s: revision %d, want %d", where, rev, memLogRevisions)
		}
		t.Logf("%s: revision %d, %d tasks", where, rev, n)
	}
}

// reseal changes, in the memtable log at path, the first entry from the
// offset from on that change takes (given the entry before it, the entry
// and its bytes), and writes the entry back with its checksum made whole
// again: damage that Badger's replay acts on though no checksum fails.
func reseal(t *testing.T, path string, entries []int, from int, change func(prev, e logEntry, b []byte) bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, off := range entries[1 : len(entries)-1] {
		prev, _ := parseLogEntry(data[entries[i]:])
		e, n := parseLogEntry(data[off:])
		if off < from || !change(prev, e, data[off:off+n]) {
			continue
		}
		end := off + n - crc32.Size
		binary.BigEndian.PutUint32(data[end:], crc32.Checksum(data[off:end], y.CastagnoliCrcTable))
		overwrite(t, path, int64(off), data[off:off+n])
		return
	}
	t.Fatal("no entry to change")
}

// TestOpen_DamagedMemtableLogIsCorrupt: damage in a memtable log with
// writes after it, which Badger's replay would drop without a word, and
// damage in a log older than the newest, after which Badger would replay
// the newer log over the gap, make Open fail with ErrCorrupt, the
// directory unchanged.
func TestOpen_DamagedMemtableLogIsCorrupt(t *testing.T) {
	pristine, log, entries := memLogDir(t)
	end := entries[len(entries)-1]
	mid := entries[len(entries)/2]
	// split rewrites the log as two, the first ending before the entry
	// off, which must start a transaction, as Badger leaves a log it
	// moved on from.
	split := func(t *testing.T, dir string, off int) (older, newer string) {
		older = filepath.Join(dir, filepath.Base(log))
		newer = filepath.Join(dir, fmt.Sprintf("%05d.mem", 2))
		data, err := os.ReadFile(older)
		if err != nil {
			t.Fatal(err)
		}
		second := make([]byte, len(data))
		copy(second, data[:logHeaderSize])
		copy(second[logHeaderSize:], data[off:end])
		if err := os.WriteFile(newer, second, 0o600); err != nil {
			t.Fatal(err)
		}
		zero(t, older, off, end)
		return older, newer
	}
	// The first entry from the middle that starts a transaction.
	boundary := func(t *testing.T, dir string) int {
		data, err := os.ReadFile(filepath.Join(dir, filepath.Base(log)))
		if err != nil {
			t.Fatal(err)
		}
		for i, off := range entries[:len(entries)-1] {
			if e, _ := parseLogEntry(data[off:]); off >= mid && e.meta&bitFinTxn != 0 {
				return entries[i+1]
			}
		}
		t.Fatal("no transaction ends after the middle")
		return 0
	}
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
	}{
		{"garbage in the middle", func(t *testing.T, dir string) {
			overwrite(t, filepath.Join(dir, filepath.Base(log)), int64(mid+10), garbage(300))
		}},
		{"a page of zeros in the middle", func(t *testing.T, dir string) {
			zero(t, filepath.Join(dir, filepath.Base(log)), mid+10, mid+10+4096)
		}},
		{"a byte flipped in an entry", func(t *testing.T, dir string) {
			flip(t, filepath.Join(dir, filepath.Base(log)), mid+20)
		}},
		{"an entry's key length flipped", func(t *testing.T, dir string) {
			overwrite(t, filepath.Join(dir, filepath.Base(log)), int64(mid+2), []byte{0x7f})
		}},
		{"an entry of the last transaction damaged", func(t *testing.T, dir string) {
			// Its end marker follows it, so it was no tear.
			flip(t, filepath.Join(dir, filepath.Base(log)), entries[len(entries)-3]+20)
		}},
		{"a transaction's end naming another, its checksum whole", func(t *testing.T, dir string) {
			// Badger's replay stops at it (an invalid transaction) and
			// drops the rest of the log.
			reseal(t, filepath.Join(dir, filepath.Base(log)), entries, mid, func(_, e logEntry, b []byte) bool {
				if e.meta&bitFinTxn == 0 {
					return false
				}
				b[len(b)-crc32.Size-1] ^= 1 // the last digit of its commit version: another digit
				return true
			})
		}},
		{"an entry outside transactions inside one, its checksum whole", func(t *testing.T, dir string) {
			// Badger's replay stops at it too.
			reseal(t, filepath.Join(dir, filepath.Base(log)), entries, mid, func(prev, e logEntry, b []byte) bool {
				if prev.meta&bitTxn == 0 || e.meta&bitTxn == 0 {
					return false
				}
				b[0] &^= bitTxn
				return true
			})
		}},
		{"the older of two logs damaged in the middle", func(t *testing.T, dir string) {
			older, _ := split(t, dir, boundary(t, dir))
			flip(t, older, entries[len(entries)/4]+20)
		}},
		{"the older of two logs damaged where a transaction starts", func(t *testing.T, dir string) {
			// No transaction is under way where Badger's replay of it
			// stops: the bytes after that tell.
			older, _ := split(t, dir, boundary(t, dir))
			data, err := os.ReadFile(older)
			if err != nil {
				t.Fatal(err)
			}
			for i, off := range entries[:len(entries)/2] {
				if e, _ := parseLogEntry(data[off:]); e.meta&bitFinTxn != 0 {
					flip(t, older, entries[i+1]+20)
					return
				}
			}
			t.Fatal("no transaction ends in the first half")
		}},
		{"the older of two logs cut short", func(t *testing.T, dir string) {
			off := boundary(t, dir)
			older, _ := split(t, dir, off)
			// Its last entry, the end of a transaction, lost.
			for i, e := range entries {
				if e == off {
					zero(t, older, entries[i-1], off)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := pristine
			cfg.Dir = filepath.Join(t.TempDir(), "cache")
			copySparse(t, cfg.Dir, pristine.Dir)
			tt.damage(t, cfg.Dir)
			before := dirContents(t, cfg.Dir)
			s, err := Open(cfg)
			if err == nil {
				rev, n, err := readCrashed(s)
				s.Close()
				t.Fatalf("Open succeeded: partition 1 at revision %d of %d with %d tasks (%v)", rev, memLogRevisions, n, err)
			}
			t.Logf("Open: %v", err)
			var oe *OpenError
			if !errors.As(err, &oe) || !errors.Is(err, ErrCorrupt) {
				t.Errorf("Open = %v, want an *OpenError matching ErrCorrupt", err)
			}
			if after := dirContents(t, cfg.Dir); after != before {
				t.Errorf("the failed Open changed the directory:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}
