package store

import (
	"fmt"
	"log/slog"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// History modes (Config.History, the --history flag).
const (
	HistoryAll      = "all"      // record every execution
	HistoryFailures = "failures" // record executions whose status is not "ok"
	HistoryNone     = "none"     // record nothing; Record returns at once
)

// MaxHistoryLimit is the largest number of executions of one class
// (successes, failures) that can be kept per task.
const MaxHistoryLimit = 100

// MaxHistoryBuffer is the largest HistoryBuffer: the buffer's index
// numbers records in 32 bits, and 16 Mi records take 2.5 GiB already.
const MaxHistoryBuffer = 1 << 24

// Defaults of Config (DefaultConfig).
const (
	DefaultSuccessLimit   = 10
	DefaultFailureLimit   = 10
	DefaultHistoryTTL     = 168 * time.Hour
	DefaultHistoryBuffer  = 1 << 16
	DefaultFlushInterval  = 100 * time.Millisecond
	DefaultGCInterval     = 5 * time.Minute
	DefaultMemTableSize   = 16 << 20
	DefaultNumMemtables   = 2
	DefaultBlockCacheSize = 4 << 20
	DefaultValueThreshold = 128 << 10
	DefaultNumCompactors  = 2
	DefaultSettleTimeout  = 5 * time.Second
)

// MaxSettleTimeout is the longest SettleTimeout.
const MaxSettleTimeout = time.Minute

// formatVersion is written into Badger's MANIFEST (ExternalMagicVersion): a
// directory written by another layout of keys and values is refused with an
// *OpenError instead of being misread. Bump it when the layout in doc.go
// changes.
const formatVersion uint16 = 1

// Config configures a Store. Sizes are in bytes.
//
// Memory, all on the Go heap and pointer-free (nothing for the GC to
// scan): the active memtable plus up to NumMemtables immutable ones waiting
// for a flush, each an arena of about 1.3 × MemTableSize; the buffers of
// the table builders that flush memtables and compact, which Badger pools
// (up to 8, about a memtable each) and releases one per 2 s once writes
// stop; BlockCacheSize; and up to HistoryBuffer buffered execution records
// (about 150 bytes each, twice: the buffer being filled and the one being
// written) with their index (4 bytes a record of room, twice). Measured
// with the defaults: 22 MiB of heap after Open, 130 to 170 MiB while
// writing 1 M execution records as fast as Badger takes them (about
// 150 k/s), back to about 30 MiB after 20 s without writes. Tables
// are read through mmap, so table data, indexes and bloom filters live in
// the OS page cache. Smaller memtables lower the peak little (8 MiB: 130
// MiB) and make more level-0 tables to compact.
type Config struct {
	// Dir is the data directory, created if missing (mode 0700). Required.
	// One Store at a time may use it (see ErrLocked).
	Dir string

	// History is the execution history mode: HistoryAll (default),
	// HistoryFailures or HistoryNone.
	History string

	// HistorySuccessLimit is how many of a task's most recent successful
	// executions (status "ok") are kept, and HistoryFailureLimit how many
	// of its other executions (failed, timeout, skipped, misfired,
	// canceled), unless the task says otherwise (RecordKeep), as
	// Kubernetes' successfulJobsHistoryLimit and failedJobsHistoryLimit.
	// Default 10 each; 0 to MaxHistoryLimit, 0 keeping none. Each task then
	// holds at most that many records on disk, overwritten in place, so
	// history takes space by the number of tasks, never by the fire rate.
	HistorySuccessLimit int
	HistoryFailureLimit int

	// HistoryTTL is how long an execution record is kept, a second bound
	// besides the limits. Default 168h; at least 1s. Badger expires
	// entries at whole Unix seconds, so a record lives between
	// HistoryTTL-1s and HistoryTTL. Expired records are hidden from
	// History at once and their space is reclaimed by compactions. Records
	// written under a longer HistoryTTL, before a restart, are hidden once
	// they finished longer than HistoryTTL ago; their space goes at the
	// expiry they were written with.
	HistoryTTL time.Duration

	// HistoryBuffer is the number of execution records held in memory
	// before they are written. Default 65536, between 1 and
	// MaxHistoryBuffer. It bounds memory (about 150 bytes per record,
	// twice, and the index History reads them by, 4 bytes per record of
	// room, twice, made at Open) and the burst absorbed while the writer
	// is busy. The writer is woken early when a quarter of it is
	// filled. When the writer takes half of it or more in one batch,
	// successes are sampled (see Sampling); when it is full, Record drops
	// the record and counts it in Dropped.
	HistoryBuffer int

	// FlushInterval is how often the background writer writes buffered
	// execution records, in one Badger WriteBatch. Default 100ms; between
	// 1ms and 10s. Shorter makes records visible sooner (History also
	// returns buffered ones) and loses fewer on a crash; longer makes
	// bigger, cheaper batches.
	FlushInterval time.Duration

	// GCInterval is how often Badger's value-log GC runs
	// (RunValueLogGC(0.5), repeated while it rewrites a file). Default 5m;
	// 0 disables it. Only values of at least ValueThreshold go to the value
	// log, so with small tasks there is rarely anything to collect: the
	// run is then a cheap no-op. A run is skipped while writes are refused
	// for want of room (MinFreeBytes): GC writes live entries again before
	// it deletes their file.
	GCInterval time.Duration

	// MemTableSize is the size of one Badger memtable. Default 16 MiB; at
	// least 1 MiB. Larger absorbs more writes before a flush and makes
	// fewer level-0 tables (less compaction), at the cost of memory (see
	// above). A single transaction holds at most 15% of it, so large Apply
	// and Reset calls are split into several.
	MemTableSize int64

	// MinFreeBytes is the free space on the data directory's filesystem
	// below which every write (task cache, history) is refused with
	// ErrDiskFull: Badger writes its log through a memory-mapped sparse
	// file, where a full disk is a SIGBUS that kills the process instead of
	// an error. 0 means 4 × MemTableSize (64 MiB by default), room for the
	// memtable being written and the next one; negative disables the check.
	// Writes are refused too while the free space is less than MinFreeBytes
	// plus what the compactions they may set off could write before they
	// delete their input, as they write their tables through memory-mapped
	// files too: for each of NumCompactors, level 0's tables and memtables
	// with the level below, or one table with what it overlaps below
	// (compactionRoom); a few times MemTableSize on a small store, more on
	// a large one. Another process filling the disk between a check and a
	// write can still crash the node: keep the data directory on a
	// filesystem of its own, or watch its free space.
	MinFreeBytes int64

	// NumMemtables is the number of immutable memtables that may wait for
	// a flush before writes stall. Default 2; at least 1.
	NumMemtables int

	// BlockCacheSize is the size of Badger's block cache. Default 4 MiB; 0
	// disables it. Tables are uncompressed and unencrypted, so a block is
	// read straight from the mmapped file and the cache only saves parsing
	// block headers: a small one is enough. (Badger's index cache serves
	// encrypted tables only, so it is not configurable here.)
	BlockCacheSize int64

	// ValueThreshold is the value size from which Badger stores a value in
	// its value log instead of the LSM tree. Default 128 KiB, so every task
	// (at most 64 KiB of JSON) and every execution record stays in the LSM
	// tree, where scans are sequential and expired records are dropped by
	// compactions without value-log GC. At most 1 MiB and 15% of
	// MemTableSize.
	ValueThreshold int64

	// NumCompactors is the number of Badger compaction goroutines. Default
	// 2, the least Badger accepts.
	NumCompactors int

	// SettleTimeout is how long Close may let Badger run the compactions
	// it has due, so that the next Open does not run them beside the
	// node's start (see Close). Default 5s; 0 disables; at most 1m.
	SettleTimeout time.Duration

	// SyncWrites makes every write wait for fsync. Default false: the store
	// is a cache (etcd is authoritative) and a crash of the process loses
	// nothing; a power loss may lose writes (see the package doc).
	SyncWrites bool

	// Logger receives the store's warnings and Badger's (Badger's INFO
	// messages are logged at Debug). Default slog.Default().
	Logger *slog.Logger

	// Test hooks, settable only from this package's tests.
	writeHook      func() error                     // called by the writer before it flushes a staged batch; an error fails it
	beforeRevision func() error                     // called by split Apply/Reset before writing the revision
	now            func() time.Time                 // the wall clock Open starts history sequence numbers from; time.Now if nil
	bufferRead     func(looked int)                 // called by History with how many buffered records it looked at
	valueLogGC     func(discardRatio float64) error // run by the GC loop in place of Badger's RunValueLogGC
}

// DefaultConfig returns the defaults above for the data directory dir.
func DefaultConfig(dir string) Config {
	return Config{
		Dir:                 dir,
		History:             HistoryAll,
		HistorySuccessLimit: DefaultSuccessLimit,
		HistoryFailureLimit: DefaultFailureLimit,
		HistoryTTL:          DefaultHistoryTTL,
		HistoryBuffer:       DefaultHistoryBuffer,
		FlushInterval:       DefaultFlushInterval,
		GCInterval:          DefaultGCInterval,
		MemTableSize:        DefaultMemTableSize,
		NumMemtables:        DefaultNumMemtables,
		BlockCacheSize:      DefaultBlockCacheSize,
		ValueThreshold:      DefaultValueThreshold,
		NumCompactors:       DefaultNumCompactors,
		SettleTimeout:       DefaultSettleTimeout,
	}
}

// Validate reports the first invalid field as a *ValidationError. A zero
// Config is invalid: start from DefaultConfig.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Dir == "":
		return bad("Dir", "required")
	case c.History != HistoryAll && c.History != HistoryFailures && c.History != HistoryNone:
		return bad("History", "%q: want %q, %q or %q", c.History, HistoryAll, HistoryFailures, HistoryNone)
	case c.HistorySuccessLimit < 0 || c.HistorySuccessLimit > MaxHistoryLimit:
		return bad("HistorySuccessLimit", "%d: between 0 and %d", c.HistorySuccessLimit, MaxHistoryLimit)
	case c.HistoryFailureLimit < 0 || c.HistoryFailureLimit > MaxHistoryLimit:
		return bad("HistoryFailureLimit", "%d: between 0 and %d", c.HistoryFailureLimit, MaxHistoryLimit)
	case c.HistoryTTL < time.Second:
		return bad("HistoryTTL", "%v: at least 1s (Badger expires entries in whole seconds)", c.HistoryTTL)
	case c.HistoryBuffer < 1 || c.HistoryBuffer > MaxHistoryBuffer:
		return bad("HistoryBuffer", "%d: between 1 and %d", c.HistoryBuffer, MaxHistoryBuffer)
	case c.FlushInterval < time.Millisecond || c.FlushInterval > 10*time.Second:
		return bad("FlushInterval", "%v: between 1ms and 10s", c.FlushInterval)
	case c.GCInterval < 0:
		return bad("GCInterval", "%v: negative (0 disables value-log GC)", c.GCInterval)
	case c.MemTableSize < 1<<20:
		return bad("MemTableSize", "%d: at least 1 MiB", c.MemTableSize)
	case c.NumMemtables < 1:
		return bad("NumMemtables", "%d: at least 1", c.NumMemtables)
	case c.BlockCacheSize < 0:
		return bad("BlockCacheSize", "%d: negative (0 disables the cache)", c.BlockCacheSize)
	case c.ValueThreshold < 1 || c.ValueThreshold > 1<<20:
		return bad("ValueThreshold", "%d: between 1 and 1 MiB", c.ValueThreshold)
	case c.ValueThreshold > c.MemTableSize*15/100:
		// Badger caps a transaction at 15% of a memtable and refuses to
		// open when a value below the threshold could not fit in one.
		return bad("ValueThreshold", "%d: at most 15%% of MemTableSize (%d)", c.ValueThreshold, c.MemTableSize*15/100)
	case c.SettleTimeout < 0 || c.SettleTimeout > MaxSettleTimeout:
		return bad("SettleTimeout", "%v: between 0 and %v", c.SettleTimeout, MaxSettleTimeout)
	case c.NumCompactors < 2:
		return bad("NumCompactors", "%d: at least 2 (Badger refuses 1, and 0 would stall writes)", c.NumCompactors)
	}
	return nil
}

func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// badgerOptions maps c onto Badger's options. Besides the sizes above:
//   - no compression: task JSON and records are small, CPU is the scarce
//     resource, and a corrupt uncompressed block cannot make Badger
//     allocate a huge decompression buffer;
//   - block checksums verified on every read, so a damaged block is never
//     read as data; Badger's reads end at it silently, though (a Get
//     answers not found, an iterator stops), which is why Open checks
//     every block first (checkDir);
//   - no conflict detection: the store never reads and writes the same
//     keys in one transaction against concurrent writers (writes of one
//     partition are serialised by the caller), and blind writes cannot
//     conflict;
//   - Badger's expvar metrics off (the node exports its own);
//   - value-log files of 64 MiB instead of 1 GiB, so GC reclaims in
//     smaller steps.
func (c Config) badgerOptions() badger.Options {
	return badger.DefaultOptions(c.Dir).
		WithLogger(badgerLogger{c.logger()}).
		WithSyncWrites(c.SyncWrites).
		WithMemTableSize(c.MemTableSize).
		WithNumMemtables(c.NumMemtables).
		WithBlockCacheSize(c.BlockCacheSize).
		WithIndexCacheSize(0).
		WithValueThreshold(c.ValueThreshold).
		WithNumCompactors(c.NumCompactors).
		WithCompression(options.None).
		WithChecksumVerificationMode(options.OnBlockRead).
		WithDetectConflicts(false).
		WithMetricsEnabled(false).
		WithValueLogFileSize(64 << 20).
		WithExternalMagic(formatVersion).
		WithBypassLockGuard(ownLock)
}
