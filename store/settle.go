package store

import (
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// Settling. Badger runs a compaction once level 0 holds NumLevelZeroTables
// tables or a level below it holds its target size, and it starts the
// ones due as soon as it opens. A node stopped soon after a burst of
// writes (its first load of a million tasks, say) leaves such debt, often
// only by the memtable its own Close flushes into level 0; the next start
// then pays it beside its load from the cache, on the same cores (a warm
// restart at 1 M tasks: ready in 4.6 s with the debt, 2.5 s without,
// BENCHMARKS.md). Badger's own ways to compact on request do not fit:
// CompactL0OnClose compacts level 0 at every Close, due or not, and
// Flatten rewrites every level into one, neither with a bound or a way to
// stop; nor can its compactors be stopped or started after Open. So
// Close opens Badger once more and lets its compactors run while it
// waits, for up to SettleTimeout.

// settleDue tells from the levels of the open database whether the next
// Open may have a compaction to run: each memtable Close flushes adds one
// table to level 0, and the database does not say how many hold data, so
// every one it may have is counted.
func settleDue(levels []badger.LevelInfo, opt badger.Options) bool {
	l0 := levels[0].NumTables + opt.NumMemtables + 1
	return l0 >= opt.NumLevelZeroTables || compactionDue(levels, opt.NumLevelZeroTables)
}

// compactionDue reports whether Badger has a compaction to run or running
// with its levels as levels says: level 0 holds l0Tables tables or more,
// or a level above the last holds its target size or more. The sizes count
// the tables being compacted until the compaction ends, so a level stays
// due while its compaction runs (Badger's own score leaves them out).
func compactionDue(levels []badger.LevelInfo, l0Tables int) bool {
	for _, l := range levels[:len(levels)-1] {
		if l.Level == 0 && l.NumTables >= l0Tables || l.Level > 0 && l.Size >= l.TargetSize {
			return true
		}
	}
	return false
}

// settle opens the closed Badger database again and waits while its
// compactors run the compactions due, until none is, SettleTimeout passes
// or Hurry is called; closing it waits for the compaction under way.
func (s *Store) settle(opt badger.Options) error {
	start := time.Now()
	db, err := badger.Open(opt)
	if err != nil {
		return err
	}
	timeout := time.NewTimer(s.cfg.SettleTimeout)
	defer timeout.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	result := "none was due"
wait:
	for compactionDue(db.Levels(), opt.NumLevelZeroTables) {
		result = "settled"
		select {
		case <-poll.C:
		case <-timeout.C:
			result = "cut at the settle timeout; the next start runs the rest"
			break wait
		case <-s.hurry:
			result = "cut short; the next start runs the rest"
			break wait
		}
	}
	err = db.Close()
	s.log.Info("store: let Badger run the compactions due before closing, so that the next start need not", "result", result, "took", time.Since(start).Round(time.Millisecond).String())
	return err
}

// Hurry makes Close, under way or to come, stop waiting for compactions
// (SettleTimeout); one to come does not open Badger again at all: for a
// second signal at shutdown.
func (s *Store) Hurry() { s.hurryOnce.Do(func() { close(s.hurry) }) }

// hurried reports whether Hurry has been called.
func (s *Store) hurried() bool {
	select {
	case <-s.hurry:
		return true
	default:
		return false
	}
}
