package store

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dgraph-io/badger/v4/y"
)

// The memtable log format of Badger v4.9 (memtable.go, value.go,
// structs.go): a header of 20 bytes (encryption key id and IV), then
// entries, each a header (meta, user meta, then key length, value length
// and expiry as uvarints), the key with its version, the value, and the
// CRC32-C of all of it, big-endian.
const (
	logHeaderSize = 20
	bitTxn        = 1 << 6 // the entry belongs to a transaction
	bitFinTxn     = 1 << 7 // the entry ends a transaction; its value is the commit version
	maxLogKey     = 1 << 16
	// maxLogValue is the largest value a log entry holds: the highest
	// ValueThreshold (Validate's bound, Badger's own), which a directory
	// may have been written with; larger values go to the value log.
	maxLogValue = 1 << 20
	// maxLogEntry bounds an entry: the longest header, key and value.
	maxLogEntry = 22 + maxLogKey + maxLogValue + crc32.Size
)

// checkMemLogs checks the memtable logs (*.mem) of dir, the write-ahead
// log of the memtables a crash left unflushed, oldest first.
//
// Why: Badger replays each file up to the first entry that fails its
// checksum (or breaks its transaction), truncates the file there, and
// goes on with the next file, without a word. Damage in a log would drop
// what follows it in its file (tasks, a partition's revision, history)
// while a newer file's entries are replayed over the gap, so a revision
// could stand over updates of its tasks that are lost. A crash of the
// process leaves no such thing: Badger writes a log in order, one entry
// at a time, into a file it created full of zeros, and moves to a new
// file between transactions, so a crash can only cut short the entry it
// was writing, in the newest file, with nothing written after it. That is
// a torn tail: it passes, and Badger's replay drops it (and the rest of
// its transaction) as the crash lost it, leaving a prefix of the writes.
// Anything else is an error: an entry that fails its checksum with data
// after it, a file older than the newest that ends short of a whole
// transaction or holds data after its last whole entry, and an entry
// Badger would stop at although its checksum holds.
//
// It reads each file whole, holes included: a file is twice
// MemTableSize, most of it never written (BENCHMARKS.md).
func checkMemLogs(dir string) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return err
	}
	type memLog struct {
		fid  int64
		path string
	}
	var logs []memLog
	for _, p := range paths {
		// A name Badger cannot parse is an error of Badger's open.
		if fid, err := strconv.ParseInt(strings.TrimSuffix(filepath.Base(p), ".mem"), 10, 64); err == nil {
			logs = append(logs, memLog{fid, p})
		}
	}
	slices.SortFunc(logs, func(a, b memLog) int { return cmp.Compare(a.fid, b.fid) })
	for i, l := range logs {
		var newer string
		if i+1 < len(logs) {
			newer = filepath.Base(logs[i+1].path)
		}
		if err := checkMemLog(l.path, newer); err != nil {
			return fmt.Errorf("memtable log %s: %w", filepath.Base(l.path), err)
		}
	}
	return nil
}

// checkMemLog checks one memtable log (see checkMemLogs); newer names the
// next log, "" for the newest.
func checkMemLog(path, newer string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Size() < logHeaderSize {
		return nil // Badger rewrites it (checkLogHeaders)
	}
	data, unmap, err := mmapFile(path)
	if err != nil || data == nil {
		return err
	}
	defer unmap()
	end, pending, err := walkLog(data)
	if err != nil {
		return err
	}
	rest := data[end:]
	if newer != "" {
		if pending || firstNonZero(rest) >= 0 {
			return fmt.Errorf("damaged at offset %d, yet the newer log %s follows it (Badger would drop the rest of this one and replay that one)", end, newer)
		}
		return nil
	}
	rest = rest[min(len(rest), tornEntrySize(rest)):] // what a crash cut short
	if i := firstNonZero(rest); i >= 0 {
		return fmt.Errorf("entry at offset %d damaged, data after it at offset %d (Badger would replay up to the damage and drop the rest)", end, len(data)-len(rest)+i)
	}
	return nil
}

// walkLog follows the entries of the memtable log data the way Badger's
// replay does (logFile.iterate) and returns the offset of the first bytes
// that are not a whole entry, and whether a transaction is still open
// there. An entry that Badger's replay would stop at although it is whole
// is an error.
func walkLog(data []byte) (end int, pending bool, err error) {
	off := logHeaderSize
	var txn uint64 // the commit version of the transaction under way, 0 between two
	for {
		e, n := parseLogEntry(data[off:])
		if n == 0 {
			return off, txn != 0, nil
		}
		switch {
		case e.meta&bitTxn != 0:
			ts := y.ParseTs(e.key)
			if txn == 0 {
				txn = ts
			}
			if ts != txn {
				return 0, false, fmt.Errorf("entry at offset %d belongs to a transaction other than the one under way, whose end is missing", off)
			}
		case e.meta&bitFinTxn != 0:
			if ts, err := strconv.ParseUint(string(e.value), 10, 64); err != nil || ts != txn {
				return 0, false, fmt.Errorf("entry at offset %d ends a transaction that is not the one under way", off)
			}
			txn = 0
		case txn != 0:
			return 0, false, fmt.Errorf("entry at offset %d, outside any transaction, follows a transaction whose end is missing", off)
		}
		off += n
	}
}

type logEntry struct {
	meta       byte
	klen, vlen uint32
	key, value []byte
}

// parseLogHeader decodes the header at the start of b as Badger does
// (header.DecodeFrom), and returns its length, 0 if b does not hold one.
func parseLogHeader(b []byte) (e logEntry, n int) {
	if len(b) < 2 {
		return e, 0
	}
	e.meta, n = b[0], 2
	var v [3]uint64 // key length, value length, expiry
	for i := range v {
		x, k := binary.Uvarint(b[n:])
		if k <= 0 {
			return e, 0
		}
		v[i], n = x, n+k
	}
	e.klen, e.vlen = uint32(v[0]), uint32(v[1])
	return e, n
}

// parseLogEntry decodes the entry at the start of b and returns its
// length, or 0 where Badger's replay ends (safeRead.Entry and iterate):
// no whole entry, a key longer than 64 KiB or empty, or a checksum that
// fails.
func parseLogEntry(b []byte) (e logEntry, n int) {
	e, hlen := parseLogHeader(b)
	if hlen == 0 || e.klen > maxLogKey {
		return e, 0
	}
	end := uint64(hlen) + uint64(e.klen) + uint64(e.vlen)
	if end+crc32.Size > uint64(len(b)) || e.klen == 0 {
		return e, 0
	}
	if crc32.Checksum(b[:end], y.CastagnoliCrcTable) != binary.BigEndian.Uint32(b[end:]) {
		return e, 0
	}
	e.key = b[hlen : hlen+int(e.klen)]
	e.value = b[hlen+int(e.klen) : end]
	return e, int(end) + crc32.Size
}

// tornEntrySize is how far the entry a crash cut short at the start of b
// can reach. Go copies an entry into the log in stores of at least 16
// bytes, the first ones first, but for an entry of over 256 bytes, whose
// first 32 it stores after the rest (runtime.memmove on amd64, which can
// leave up to 32 bytes of zeros at its start). So a header either gives
// the key and value lengths of an entry Badger writes (a key longer than
// its 8-byte version), and the entry reaches as far as they say, or
// reads a key length of 0, not written yet, and the entry reaches at
// most as far as the longest. A header that reads otherwise was not torn
// but damaged: 0.
func tornEntrySize(b []byte) int {
	e, n := parseLogHeader(b)
	switch {
	case n == 0:
		return 0
	case e.klen == 0:
		return maxLogEntry
	case e.klen <= 8 || e.klen > maxLogKey || e.vlen > maxLogValue:
		return 0
	}
	return n + int(e.klen) + int(e.vlen) + crc32.Size
}

// firstNonZero returns the index of the first byte of b that is not zero,
// -1 if there is none.
func firstNonZero(b []byte) int {
	var zero [4096]byte
	for off := 0; off < len(b); off += len(zero) {
		chunk := b[off:min(off+len(zero), len(b))]
		if bytes.Equal(chunk, zero[:len(chunk)]) {
			continue
		}
		for i, c := range chunk {
			if c != 0 {
				return off + i
			}
		}
	}
	return -1
}
