package store

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
)

var (
	// ErrLocked is matched (errors.Is) by the error Open returns when the
	// data directory is held by another Store, in this process or another.
	// Its message names the directory: "store: data directory <dir> is in
	// use by another process".
	ErrLocked = errors.New("store: data directory is in use by another process")

	// ErrClosed is returned by the methods of a Store after Close.
	ErrClosed = errors.New("store: closed")

	// ErrCorrupt is matched (errors.Is) by the *OpenError Open returns when a
	// file of the data directory fails its checks (bad magic, checksum of
	// any block of a table, truncated table, a table the MANIFEST lists
	// missing, a memtable log damaged other than by a crash cutting its
	// last entry short), when tables are
	// left without a MANIFEST, or when a file makes Badger panic, and by the
	// error of a Partition that read another number of tasks than its count.
	// A file the system refuses to open or read (permissions, an I/O
	// error) is not matched: its contents were not looked at.
	ErrCorrupt = errors.New("store: data directory is corrupt")

	// ErrVersion is matched (errors.Is) by the *OpenError Open returns for
	// a directory written with another layout of keys and values (see
	// formatVersion), by a newer version of shardcron, say, before a
	// rollback. Nothing in it is damaged, and Open changes nothing in it:
	// the version that wrote it opens it, or it may be moved away (etcd
	// is authoritative: only the history it holds is lost).
	ErrVersion = errors.New("store: data directory written by another version")

	// ErrDiskFull is matched (errors.Is) by the error of a write refused
	// because the data directory's filesystem has less free space than
	// Config.MinFreeBytes. Nothing was written; later writes succeed once
	// there is room again.
	ErrDiskFull = errors.New("store: disk full")

	// ErrDirDeleted is matched by the error of a write refused because the
	// data directory was deleted under the open store: Badger could make
	// no new file there, and its writes would stall. Reads of what it holds
	// go on; a restart starts a new directory.
	ErrDirDeleted = errors.New("store: data directory deleted")
)

// lockedError is ErrLocked with the directory in its message.
type lockedError struct{ dir string }

func (e *lockedError) Error() string {
	return fmt.Sprintf("store: data directory %s is in use by another process", e.dir)
}

func (e *lockedError) Is(target error) bool { return target == ErrLocked }

// OpenError reports a data directory that exists but cannot be opened:
// corrupt, unreadable, or written by an incompatible format version. The
// directory holds a cache and execution history only (etcd is
// authoritative), so moving it away and starting again is always safe: the
// node reloads its partitions from etcd and loses only history. Its message
// says so, but for a directory the system refuses (permissions, a
// read-only filesystem), whose contents are whole: it says what to fix.
// Of a directory that could not be created, it says which part of its
// path stopped it and what to fix there, or to choose another directory.
type OpenError struct {
	Dir    string
	Err    error
	create bool // Dir did not exist and could not be made: it holds nothing
}

func (e *OpenError) Error() string {
	verb, advice, whole := "open", "it holds only a cache and execution history: moving it away is safe", "; nothing in it is damaged"
	if e.create {
		verb, advice, whole = "create", "choose another directory", ""
	}
	switch {
	case errors.Is(e.Err, fs.ErrPermission) && e.create:
		// The directory that refused is the one the refused path goes in.
		parent := filepath.Dir(e.Dir)
		var pe *fs.PathError
		if errors.As(e.Err, &pe) {
			parent = filepath.Dir(pe.Path)
		}
		advice = "fix the permissions or the owner of " + parent + ": the node's user must be allowed to create directories in it"
	case errors.Is(e.Err, fs.ErrPermission):
		advice = "fix the permissions or the owner of the directory and its files: the node's user must read and write them" + whole
	case errors.Is(e.Err, syscall.EROFS):
		advice = "its filesystem is read-only: mount it read-write" + whole
	case errors.Is(e.Err, syscall.ENOTDIR) && e.create:
		advice = "a file stands in its path: move the file away, or choose another directory"
	}
	return fmt.Sprintf("store: cannot %s data directory %s: %v (%s)", verb, e.Dir, e.Err, advice)
}

func (e *OpenError) Unwrap() error { return e.Err }

// ValidationError reports an invalid Config field.
type ValidationError struct {
	Field  string // the Config field, e.g. "History"
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("store: config: %s: %s", e.Field, e.Reason)
}
