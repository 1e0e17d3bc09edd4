// Package store is a node's local Badger database (github.com/dgraph-io/badger/v4):
// a cache of the task definitions of each partition with the etcd revision
// it is synced to, and the node's execution history with a TTL.
//
// It knows nothing of etcd or scheduling: values are opaque bytes,
// partitions are uint32, revisions int64. Only etcd is authoritative
// (DESIGN.md invariant 9): deleting the data directory loses execution
// history, never a task or a fire, so every failure here can be answered
// by reading etcd again.
//
// # Task cache
//
// A partition is cached together with the revision R it is synced to:
// every change of the partition in etcd up to and including R is in the
// cache. A restarted node reads the cache and resumes its watch at R+1
// instead of range-reading the partition (invariant 7). Guarantees:
//   - The revision is never ahead of the data, even across a crash: Apply
//     and Reset write the revision in the same transaction as the tasks,
//     or, when the changes exceed one transaction, after them; Reset and
//     Drop delete the old revision before touching tasks. Badger replays
//     its write-ahead log in order and stops at the first damaged entry,
//     so even a power loss loses a suffix of the writes, never an earlier
//     write while keeping a later one.
//   - A partition whose Reset or Drop was interrupted reads as never
//     synced: Partition returns revision 0 and no tasks.
//   - Partition reads tasks and revision from one snapshot.
//
// It does not check that revisions increase, and it does not serialise
// writers of one partition: the caller does (one owner per partition).
//
// # Execution history
//
// Record appends to a bounded in-memory buffer and returns: no I/O, no
// waiting, no allocation once warm. A background writer writes the buffer
// every FlushInterval (or when a quarter full) in one WriteBatch, each
// record with Badger's TTL (Config.HistoryTTL, whole seconds). When the
// buffer is full, Record drops the record and counts it (Dropped): the
// fire path never slows down for history. History returns a task's records
// newest first, buffered ones included. Records still buffered when the
// process dies are lost; Flush and Close write them. Mode "failures" keeps
// only records whose status is not "ok"; mode "none" keeps nothing.
//
// # Key layout
//
// Every key begins with a one-letter namespace and '/':
//
//	t/<p: uint32 big-endian>/<task id>   task value, as given (opaque)
//	r/<p: uint32 big-endian>             synced revision: int64 big-endian
//	h/<task id>\x00<^ms><^attempt><^seq> execution record (execution.go)
//
// In history keys ^ms is the scheduled time in Unix milliseconds with the
// sign bit flipped, then all bits inverted (8 bytes), ^attempt the attempt
// inverted (4 bytes), ^seq a per-store sequence number inverted (8 bytes),
// all big-endian, so a forward scan of h/<task id>\x00 yields the newest
// scheduled time first, then the highest attempt, then the last recorded.
// Task ids contain no control characters (API.md), so \x00 ends the id.
// The partition prefix t/<p>/ selects exactly one partition, so a
// partition is one prefix scan. The layout's version is Badger's external
// magic number (formatVersion): a directory with another layout is refused.
//
// # Badger settings and footprint
//
// Badger's defaults (five 64 MiB memtables, a 256 MiB block cache, four
// compactors) suit a database server, not a daemon sharing a 2-core
// machine. DefaultConfig uses 16 MiB memtables with at most 2 waiting to be
// flushed, a 4 MiB block cache, 2 compactors, no compression, and a value
// threshold of 128 KiB so that every task (64 KiB at most) and every record
// stays in the LSM tree: scans are sequential and expired history is
// dropped by compactions. Measured heap: 22 MiB after Open, up to about
// 170 MiB while Badger writes flat out, about 30 MiB again once writes
// stop (see Config); table data is read through mmap, in the OS page
// cache. Badger logs through the Config's slog.Logger, its INFO chatter at
// Debug.
//
// # Lifecycle
//
// Open takes an exclusive lock on the directory (ErrLocked if another Store
// or Badger holds it, in this process or another) and checks the tables
// before Badger opens them, so a corrupt directory is an *OpenError
// (matching ErrCorrupt) rather than a panic on one of Badger's goroutines.
// Open starts two goroutines, the history writer and a value-log GC loop
// (RunValueLogGC(0.5) every GCInterval, default 5 minutes); Close writes the
// buffered history, stops both, closes Badger and releases the lock.
package store
