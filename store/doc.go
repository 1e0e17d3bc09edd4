// Package store is a node's local Badger database (github.com/dgraph-io/badger/v4):
// a cache of the task definitions of each partition with the etcd revision
// it is synced to, and the node's execution history with a TTL.
//
// It knows nothing of etcd or scheduling: values are opaque bytes,
// partitions are uint32, revisions int64. Only etcd is authoritative
// (docs/design.md invariant 9): deleting the data directory loses execution
// history, never a task or a fire, so every failure here can be answered
// by reading etcd again.
//
// # Task cache
//
// A partition is cached together with the revision R it is synced to:
// every change of the partition in etcd up to and including R is in the
// cache. A restarted node reads the cache and resumes its watch at R+1
// instead of range-reading the partition (invariant 7). A task may carry
// the revision etcd created it at (KV.Created), kept beside its value; one
// written without it, as by a version before creations were kept, reads
// 0. Guarantees:
//   - The revision is never ahead of the data, even across a crash: Apply
//     and Reset write the revision in the same transaction as the tasks,
//     or, when the changes exceed one transaction, after them; Reset and
//     Drop delete the old revision before touching tasks. Badger replays
//     its write-ahead log (the memtable logs) in order, whole transactions
//     only, and Open refuses (ErrCorrupt) a log damaged anywhere but at
//     the end of the newest file, where a crash of the process cuts short
//     the entry it was writing: what Badger replays is a prefix of the
//     writes, and a crash of the process loses nothing it wrote. A power
//     loss is weaker without SyncWrites: Badger does not sync a log file
//     when it moves on to the next, so a later file's writes can outlive
//     an earlier one's. Open finds that when the earlier file lost part
//     of a transaction, but not when it lost whole transactions at its
//     end: the revision can then stand over a lost update of a task (the
//     count below catches lost additions and deletions only). After a
//     power loss, a node started with its cache directory removed (its
//     history with it) reads every partition from etcd.
//   - A partition whose Reset or Drop was interrupted reads as never
//     synced: Partition returns revision 0 and no tasks.
//   - Partition reads tasks and revision from one snapshot.
//   - A partition never reads short under a good revision: Open checks
//     the checksum of every block of every table (ErrCorrupt), and the
//     revision key counts its tasks, so that a scan that reads another
//     number (Badger's iterators end silently at a block damaged after
//     Open) is an error matching ErrCorrupt. The count starts at a Reset:
//     an Apply to a partition that reads as never synced records none.
//
// It does not check that revisions increase, and it does not serialise
// writers of one partition: the caller does (one owner per partition).
//
// # Execution history
//
// A task keeps its last HistorySuccessLimit successes and its last
// HistoryFailureLimit failures (any status but "ok"), 10 and 10 by
// default, as Kubernetes keeps a CronJob's successful and failed jobs;
// RecordKeep overrides them per task, up to MaxHistoryLimit. Each class
// of a task is a ring of slots (one Badger key each), and each record
// overwrites the oldest: the disk holds at most tasks x (limits) records
// whatever the fire rate, and HistoryTTL bounds their age besides. A
// slot table in memory (about 20 bytes per task written since Open)
// says where each ring stands; a task not in it is read from disk once,
// so a restarted node continues every ring and keeps exactly the last N.
// A limit lowered (the Config's at a restart, or a task's) deletes a
// ring's extra records only at the task's next record of that class,
// which may never come; History and HistoryKeep answer at most the limits
// they are given at once.
//
// Record appends to a bounded in-memory buffer and returns: no I/O, no
// waiting, no allocation once warm. A background writer writes the buffer
// every FlushInterval (or when a quarter full) in one WriteBatch, each
// record with Badger's TTL (whole seconds). History returns a task's
// records newest first, buffered ones included: the buffer chains each
// task's records, so a read looks at its task's only and holds Record up
// for as long, whatever else is buffered. Records still buffered
// when the process dies are lost; Flush and Close write them. Mode
// "failures" keeps only records whose status is not "ok"; mode "none"
// keeps nothing.
//
// Badger takes some 150 k keys/s on a 2-core machine, so one node cannot
// write a record per fire at 1 M fires/s. When the writer takes half the
// buffer or more in one batch (records arrive faster than it writes them),
// successes are sampled: one in k is kept, chosen by a hash of task id
// and scheduled time, k doubling per such batch up to 1024 and halving
// again once batches are small (Sampling, Sampled). Failures are never
// sampled. A record is dropped (Dropped) only when the buffer is full:
// failures arriving faster than Badger writes them, or a burst within one
// batch.
//
// # Key layout
//
// Every key begins with a one-letter namespace and '/':
//
//	t/<p: uint32 big-endian>/<task id>   task value, as given (opaque)
//	r/<p: uint32 big-endian>             synced revision and task count: two int64 big-endian
//	e/<task id>\x00<class><slot>         execution record (execution.go)
//	m/origin                             the cluster the cached partitions come from (SetOrigin)
//	m/history-seq                        the highest sequence number of the records written: uint64 big-endian
//
// In history keys class is 's' (successes) or 'f' (failures) and slot a
// byte below MaxHistoryLimit; the value is the record's sequence number
// (uint64 big-endian: it orders the records of a ring) followed by the
// record. Sequence numbers increase across restarts whatever the clock
// says: the history writer writes m/history-seq in the WriteBatch of the
// records, and Open starts from the clock in nanoseconds or past that
// mark, whichever is higher. (A directory written before the mark was
// kept starts from the clock once.) Task ids contain no control
// characters (docs/api.md), so \x00 ends the id. The partition prefix t/<p>/
// selects exactly one partition, so a partition is one prefix scan. The
// layout's version is Badger's external magic number (formatVersion): a
// directory with another layout is refused (ErrVersion) and left as it
// is. Earlier versions kept one key per record under h/, without limits;
// Open deletes that namespace.
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
// # A full disk
//
// Badger writes its log into a sparse file mapped into memory: on a full
// disk a write there is a SIGBUS that kills the process, not an error.
// Every write (Apply, Reset, Drop, the history writer, DeleteHistory)
// therefore first checks the free space of the directory's filesystem and
// is refused with ErrDiskFull below Config.MinFreeBytes (default 4 ×
// MemTableSize) plus what the compactions it may set off could write before
// they delete their input: Badger writes their tables through memory-mapped
// files too. A write too big for one transaction (a split Apply or Reset,
// the deletes of a Drop, DropTasks or DeleteHistory, a history batch)
// checks again as it goes, every quarter memtable. History refused or
// failed so is counted (WriteFailed) and logged, once a minute per cause;
// Record never waits on the disk. Writes resume once there is room, and the
// log says so. A directory deleted under the open store refuses writes the
// same way (ErrDirDeleted), and Close still returns: Badger's last flush
// goes to an empty directory made for it and deleted after. Value-log GC,
// which writes live entries again before it deletes their file, is skipped
// while writes are refused, and so is Open's delete of the history of
// earlier versions (it flushes the memtables and rewrites tables).
// Compactions Badger starts on its own are not gated (Badger cannot pause
// them, and they are what frees space): the room check before each write
// keeps room for those it may set off.
//
// # Lifecycle
//
// Open takes an exclusive lock on the directory (ErrLocked if another Store
// or Badger holds it, in this process or another) and checks the tables
// and memtable logs before Badger opens them, so a corrupt directory is an
// *OpenError (matching ErrCorrupt) rather than a panic on one of Badger's
// goroutines, or writes it drops without a word.
// Open starts two goroutines, the history writer and a value-log GC loop
// (RunValueLogGC(0.5) every GCInterval, default 5 minutes); Close writes the
// buffered history, stops both, closes Badger, lets the compactions it has
// due run (settle.go, up to SettleTimeout) and releases the lock.
package store
