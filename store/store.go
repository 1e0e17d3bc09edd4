package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/shardcron/shardcron/internal/lograte"
)

// Store is a node's local Badger database: the task cache per partition
// and the execution history. All methods are safe for concurrent use, with
// one rule: calls that write one partition (Apply, Reset, Drop of the same
// p) must not run concurrently with each other; the caller serialises them
// (the engine has one owner per partition). Reads (Partition, History) may
// run alongside anything.
type Store struct {
	cfg  Config
	db   *badger.DB
	lock *os.File // flock on cfg.Dir, released by Close; nil where Badger locks
	log  *slog.Logger

	// opsMu guards closed and the Add side of ops: an operation registers
	// in ops only while the store is open, and Close waits for ops after
	// setting closed, so no operation touches db after it is closed.
	opsMu  sync.Mutex
	closed bool
	ops    sync.WaitGroup

	history   historyBuffer
	slots     slotTable
	lostWarns lograte.Limiter // of history batches lost, by cause; used by the writer only
	lostCause string          // why the writer's last batch was lost, "" if written; writer only

	gcSkipped atomic.Uint64 // value-log GC rounds skipped for want of room since Open

	stop      chan struct{} // closed by Close: stops the writer and GC loops
	hurry     chan struct{} // closed by Hurry: Close stops settling
	hurryOnce sync.Once
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// errLockHeld is what lockDir returns when another holder has the lock.
var errLockHeld = errors.New("lock held")

// Open validates cfg, creates cfg.Dir if needed, takes the directory lock,
// checks the files Badger would read (see ErrCorrupt) and opens Badger. It starts two
// goroutines (the history writer and the value-log GC loop) that Close
// stops. Errors:
//   - a *ValidationError for an invalid cfg;
//   - an error matching ErrLocked when another Store or Badger holds Dir;
//   - an *OpenError for a directory that cannot be created, or opened
//     (corrupt, unreadable, written by an incompatible version); it
//     matches ErrCorrupt when a file failed its checks or made Badger
//     panic, ErrVersion when the directory has another layout.
//
// Open never panics because of the directory's contents.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, &OpenError{Dir: cfg.Dir, Err: err, create: true}
	}
	lock, err := lockDir(cfg.Dir)
	if errors.Is(err, errLockHeld) {
		return nil, &lockedError{dir: cfg.Dir}
	}
	if err != nil {
		return nil, &OpenError{Dir: cfg.Dir, Err: fmt.Errorf("lock: %w", err)}
	}
	db, err := openBadger(cfg)
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		if !ownLock && strings.Contains(err.Error(), "Another process is using this Badger database") {
			return nil, &lockedError{dir: cfg.Dir}
		}
		return nil, &OpenError{Dir: cfg.Dir, Err: err}
	}
	s := &Store{
		cfg:   cfg,
		db:    db,
		lock:  lock,
		log:   cfg.logger(),
		stop:  make(chan struct{}),
		hurry: make(chan struct{}),

		lostWarns: lograte.Limiter{Every: lostWarnEvery},
	}
	if err := s.dropOldHistory(); err != nil {
		db.Close()
		if lock != nil {
			lock.Close()
		}
		return nil, &OpenError{Dir: cfg.Dir, Err: err}
	}
	mark, err := readSeqMark(db)
	if err != nil {
		db.Close()
		if lock != nil {
			lock.Close()
		}
		return nil, &OpenError{Dir: cfg.Dir, Err: fmt.Errorf("read the history sequence mark: %w", err)}
	}
	s.history.init(cfg, mark)
	s.slots.init()
	s.wg.Add(1)
	go s.writeLoop()
	if cfg.GCInterval > 0 {
		s.wg.Add(1)
		go s.gcLoop()
	}
	return s, nil
}

// dropOldHistory deletes the unbounded history of earlier versions (one
// key per record under "h/"), if any, with Badger's DropPrefix, which
// drops whole tables rather than writing a tombstone per record. It leaves
// it while checkRoom refuses writes: nothing reads that namespace.
func (s *Store) dropOldHistory() error {
	old := []byte(nsOldHistory)
	found := false
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: old})
		defer it.Close()
		it.Seek(old)
		found = it.ValidForPrefix(old)
		return nil
	})
	if err != nil || !found {
		return err
	}
	// DropPrefix flushes the memtables and rewrites the tables holding
	// the prefix: it needs the room a write and its compactions need.
	if err := s.checkRoom(); err != nil {
		s.log.Warn("store: the execution history of an earlier version is left for a start with room to delete it", "err", err)
		return nil
	}
	s.log.Info("store: deleting the execution history of an earlier version (one key per record, without limits)")
	if err := s.db.DropPrefix(old); err != nil {
		return fmt.Errorf("delete old history: %w", err)
	}
	return nil
}

// openBadger checks the directory (checkDir), removes the empty logs a
// crash left (removeEmptyLogs), then opens Badger, turning a panic of the
// calling goroutine into an error wrapping ErrCorrupt. A directory that
// fails its checks is left as it is.
func openBadger(cfg Config) (db *badger.DB, err error) {
	opt := cfg.badgerOptions()
	if err := checkDir(cfg.Dir, opt); err != nil {
		return nil, err
	}
	if err := removeEmptyLogs(cfg.Dir, cfg.logger()); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: badger panicked: %s", ErrCorrupt, oneLine(r))
		}
	}()
	return badger.Open(opt)
}

// acquire registers an operation; it fails with ErrClosed once Close has
// begun. Every successful acquire is paired with s.ops.Done().
func (s *Store) acquire() error {
	s.opsMu.Lock()
	defer s.opsMu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.ops.Add(1)
	return nil
}

// Close stops accepting work, writes every execution record accepted so
// far, waits for the operations in progress, stops the goroutines Open
// started, closes Badger and releases the directory. Before it releases
// it, when Badger may have compactions due, it opens Badger again to let
// them run, for up to SettleTimeout (see Hurry), so that the next Open
// does not run them beside the node's start. It is idempotent:
// later calls return the first call's result. Record after Close drops
// (and counts) its record; every other method returns ErrClosed. Close must
// not be called from inside a Partition callback (it would wait for it).
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.opsMu.Lock()
		s.closed = true
		s.opsMu.Unlock()
		s.history.close() // Record drops from now on
		close(s.stop)     // the writer drains the buffer, then exits
		s.wg.Wait()
		s.ops.Wait()
		var errs []error
		if err := s.history.takeErr(); err != nil {
			errs = append(errs, fmt.Errorf("store: write history: %w", err))
		}
		// A directory deleted under the store: Badger's close flushes its
		// memtables into new files there and would retry forever. Give it
		// an empty directory to write them to, then delete that: without
		// the MANIFEST, deleted with the rest, those files are of no use.
		recreated := false
		if _, err := os.Stat(s.cfg.Dir); errors.Is(err, fs.ErrNotExist) {
			recreated = os.MkdirAll(s.cfg.Dir, 0o700) == nil
		}
		opt := s.cfg.badgerOptions()
		// Once hurried, not at all: the reopened Badger starts its
		// compactors, and closing it waits for the one they have begun.
		settle := s.cfg.SettleTimeout > 0 && !recreated && !s.hurried() && settleDue(s.db.Levels(), opt)
		if settle {
			// Compactions write tables through memory-mapped files, as
			// writes do: none on a disk too full to write.
			if err := s.checkRoom(); err != nil {
				s.log.Warn("store: not running the compactions due before closing; the next start runs them", "err", err)
				settle = false
			}
		}
		if err := s.db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("store: close badger: %w", err))
		} else if settle {
			if err := s.settle(opt); err != nil {
				errs = append(errs, fmt.Errorf("store: settle compactions: %w", err))
			}
		}
		if recreated {
			if err := os.RemoveAll(s.cfg.Dir); err != nil {
				errs = append(errs, fmt.Errorf("store: remove the directory made for closing: %w", err))
			}
			s.log.Warn("store: the data directory was deleted while open; what was not written is lost", "dir", s.cfg.Dir)
		}
		if s.lock != nil {
			if err := s.lock.Close(); err != nil {
				errs = append(errs, fmt.Errorf("store: release lock: %w", err))
			}
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// gcLoop runs the value-log GC every GCInterval until Close. Expired
// history and overwritten tasks leave garbage only in the value log's
// files of values above ValueThreshold; everything else is reclaimed by
// compactions. A round is skipped while checkRoom refuses writes: GC
// writes a file's live entries again (into the memtable's log and a new
// value-log file, both memory-mapped) before it deletes the file, so on a
// nearly full disk it would die of SIGBUS as a write would. The first
// round skipped is logged, and the first one run after, with how many were
// skipped: a round every GCInterval for as long as the disk is full.
func (s *Store) gcLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.GCInterval)
	defer t.Stop()
	run := s.db.RunValueLogGC
	if s.cfg.valueLogGC != nil {
		run = s.cfg.valueLogGC
	}
	var skipped uint64 // rounds skipped since the last one run
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if err := s.checkRoom(); err != nil {
			if skipped == 0 {
				s.log.Warn("store: value-log GC skipped until there is room", "err", err)
			}
			skipped++
			s.gcSkipped.Add(1)
			continue
		}
		if skipped > 0 {
			s.log.Info("store: value-log GC runs again", "rounds_skipped", skipped)
			skipped = 0
		}
		// Each successful run rewrites one file; stop at the first run
		// that finds nothing worth rewriting, or after a few files so
		// that Close never waits long.
		for range 8 {
			err := run(0.5)
			if err != nil {
				if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
					s.log.Warn("store: value-log GC", "err", err)
				}
				break
			}
			select {
			case <-s.stop:
				return
			default:
			}
		}
	}
}
