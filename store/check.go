package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"golang.org/x/sync/errgroup"
)

// checkDir checks, under recover, the files Badger's Open reads: the key
// registry, the header of every memtable and value-log file, every entry
// of the memtable logs (checkMemLogs), the MANIFEST, and each table the
// MANIFEST lists, opened the way Badger opens it (footer, index checksum,
// first and last key), and every block of it (verifyBlocks). Any failure
// is an error wrapping ErrCorrupt, and so are tables without a MANIFEST,
// but for a file the system refuses to open or read (see corrupt). A new
// directory passes.
//
// Why: Badger opens tables on goroutines of its own, where a damaged table
// makes it panic beyond any recover; it skips, with only a log line, a
// table whose index checksum fails, which would lose task keys while
// keeping the partition's synced revision; and an Open that fails midway
// leaks two of its goroutines. Checking first turns all of these into a
// clean error before Badger starts.
//
// It reads every table whole, through mmap: on a 1 GiB cache (1 M tasks,
// 10 records each) and 2 cores it adds about 0.25 s to Open with the
// files in the page cache, 0.2 s without (BENCHMARKS.md, BenchmarkOpen).
func checkDir(dir string, opt badger.Options) error {
	// Badger's errors keep only the text of the system's, so the key
	// registry is opened here first to tell a refusal from damage.
	if f, err := os.Open(filepath.Join(dir, badger.KeyRegistryFileName)); err == nil {
		f.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	kr, err := badger.OpenKeyRegistry(badger.KeyRegistryOptions{Dir: dir, ReadOnly: true})
	if err != nil {
		return corrupt(fmt.Errorf("%s: %w", badger.KeyRegistryFileName, err))
	}
	_ = kr.Close()
	if err := checkLogHeaders(dir); err != nil {
		return corrupt(err)
	}
	if err := checkMemLogs(dir); err != nil {
		return corrupt(err)
	}
	f, err := os.Open(filepath.Join(dir, badger.ManifestFilename))
	if errors.Is(err, os.ErrNotExist) {
		// Badger creates the MANIFEST before any table, so tables without
		// one are a MANIFEST lost: Badger would start a new one and delete
		// every table it does not list, the history with them, silently.
		tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
		if err != nil {
			return err
		}
		if len(tables) > 0 {
			return fmt.Errorf("%w: %s missing, %d tables left without it", ErrCorrupt, badger.ManifestFilename, len(tables))
		}
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if v, ok := manifestLayout(f); ok && v != opt.ExternalMagicVersion {
		return fmt.Errorf("%w: layout version %d, this version reads %d", ErrVersion, v, opt.ExternalMagicVersion)
	}
	mf, _, err := replayManifest(f, opt)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, badger.ManifestFilename, err)
	}
	// Tables are checked side by side: the check reads every block, and
	// a start waits for it.
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for id, tm := range mf.Tables {
		g.Go(func() error {
			if err := checkTable(table.NewFilename(id, dir), id, tm, opt); err != nil {
				return corrupt(fmt.Errorf("table %s: %w", table.IDToFilename(id), err))
			}
			return nil
		})
	}
	return g.Wait()
}

// corrupt wraps err, a file of the directory failing its check, into an
// error matching ErrCorrupt, unless the system refused to open or read
// the file (a *fs.PathError but for a file missing: no permission, an I/O
// error): the file's contents were never looked at, and moving the
// directory away, what a caller does with ErrCorrupt, is then the
// operator's call (docs/design.md, Storage and etcd faults). A file the
// MANIFEST lists and the directory lacks is damage. The error's text is
// the same either way.
func corrupt(err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrCorrupt, err)
}

// checkLogHeaders checks that every memtable WAL and value-log file starts
// with the id of no encryption key: the store never encrypts, so anything
// else is damage (Badger would fail with "Invalid datakey id").
func checkLogHeaders(dir string) error {
	for _, pattern := range []string{"*.mem", "*.vlog"} {
		files, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return err
		}
		for _, name := range files {
			f, err := os.Open(name)
			if err != nil {
				return err
			}
			var keyID [8]byte
			_, err = io.ReadFull(f, keyID[:])
			f.Close()
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				continue // shorter than a header: Badger rewrites it
			}
			if err != nil {
				return err
			}
			if id := binary.BigEndian.Uint64(keyID[:]); id != 0 {
				return fmt.Errorf("%s: header names encryption key %d", filepath.Base(name), id)
			}
		}
	}
	return nil
}

// manifestLayout reads the layout version (Badger's external magic
// number) from the header of the MANIFEST f, without moving its offset;
// ok is false when the header is not Badger's.
func manifestLayout(f *os.File) (v uint16, ok bool) {
	var h [8]byte // "Bdgr", the external magic, Badger's own version
	_, err := f.ReadAt(h[:], 0)
	if err != nil || string(h[:4]) != "Bdgr" {
		return 0, false
	}
	return binary.BigEndian.Uint16(h[4:6]), true
}

func replayManifest(f *os.File, opt badger.Options) (m badger.Manifest, off int64, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("unreadable: %s", oneLine(r))
		}
	}()
	return badger.ReplayManifestFile(f, opt.ExternalMagicVersion, opt)
}

func checkTable(path string, id uint64, tm badger.TableManifest, opt badger.Options) (err error) {
	if tm.KeyID != 0 {
		return errors.New("encrypted table (the store never encrypts)")
	}
	data, unmap, err := mmapFile(path)
	if err != nil || data == nil {
		return err
	}
	defer unmap()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("unreadable: %s", oneLine(r))
		}
	}()
	topt := &table.Options{
		BlockSize:   opt.BlockSize,
		Compression: tm.Compression,
		ChkMode:     options.NoVerification,
	}
	t, err := table.OpenInMemoryTable(data, id, topt)
	if err != nil {
		return err
	}
	return verifyBlocks(t)
}

// verifyBlocks checks the checksum of every block of t, not only of the
// first and last that opening it read: Badger's reads end silently at a
// block that fails its checksum (a Get answers not found, an iterator
// stops, a compaction writes what it read and deletes the rest), so
// damage met after Open is data lost without a word. Badger v4.9.6
// panics on a block too damaged to parse (it formats the offset of the
// nil block it got), hence the recover.
func verifyBlocks(t *table.Table) (err error) {
	defer func() {
		if recover() != nil {
			err = errors.New("a block too damaged to parse")
		}
	}()
	return t.VerifyChecksum()
}

// removeEmptyLogs deletes the zero-length memtable and value-log files of
// dir. A process killed between creating such a file and sizing it leaves
// it empty: it holds no entry, not even its header, yet Badger v4.9.6
// refuses to open a directory holding one ("Create a new file").
func removeEmptyLogs(dir string, log *slog.Logger) error {
	for _, pattern := range []string{"*.mem", "*.vlog"} {
		files, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return err
		}
		for _, f := range files {
			fi, err := os.Stat(f)
			if err != nil {
				return err
			}
			if fi.Size() != 0 || !fi.Mode().IsRegular() {
				continue
			}
			log.Warn("store: removing an empty log file left by a crash", "file", f)
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// oneLine renders a recovered panic value on one line: Badger's table
// panics carry a multi-line report.
func oneLine(r any) string {
	var parts []string
	for line := range strings.Lines(fmt.Sprint(r)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "==") {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, "; ")
}
