package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// record is an accepted Execution with the sequence number of its key.
type record struct {
	e   Execution
	seq uint64
}

// historyBuffer holds execution records between Record and the writer.
// Record appends under mu into pending; the writer swaps pending for the
// slice of the previous batch, writes the batch without holding mu, then
// keeps its slice as the next spare. After warm-up no call allocates.
type historyBuffer struct {
	mode   string        // Config.History; immutable
	max    int           // Config.HistoryBuffer; immutable
	wakeAt int           // len(pending) at which Record wakes the writer; immutable
	kick   chan struct{} // capacity 1: wakes the writer before its tick

	dropped atomic.Uint64 // records refused (buffer full, closed) or whose write failed

	mu       sync.Mutex    // guards the fields below
	closed   bool          // set by Close: Record drops from then on
	pending  []record      // accepted, not yet taken by the writer
	inflight []record      // the batch being written; read-only until written
	spare    []record      // empty slice to become pending at the next swap
	seq      uint64        // last sequence number handed out
	accepted uint64        // records accepted since Open
	written  uint64        // accepted records the writer is done with (written or failed)
	progress chan struct{} // closed and replaced whenever written advances
	err      error         // first write error not yet returned by Flush or Close
}

func (h *historyBuffer) init(cfg Config) {
	h.mode = cfg.History
	h.max = cfg.HistoryBuffer
	h.wakeAt = max(1, cfg.HistoryBuffer/4)
	h.kick = make(chan struct{}, 1)
	initial := min(cfg.HistoryBuffer, 1024)
	h.pending = make([]record, 0, initial)
	h.spare = make([]record, 0, initial)
	// Sequence numbers only order records of the same fire and attempt;
	// starting from the clock keeps them increasing across restarts.
	h.seq = uint64(time.Now().UnixNano())
	h.progress = make(chan struct{})
}

func (h *historyBuffer) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
}

func (h *historyBuffer) takeErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.err
	h.err = nil
	return err
}

// Record accepts e for the execution history. It never blocks on I/O and
// never waits for the writer: it appends e to an in-memory buffer that a
// background goroutine writes every FlushInterval (or sooner when a
// quarter of the buffer is filled) in one Badger WriteBatch, with a TTL of
// HistoryTTL. It costs one uncontended mutex and no allocation once the
// buffer has grown.
//
// In mode HistoryNone, Record does nothing; in HistoryFailures it ignores
// records whose Status is StatusOK. When HistoryBuffer records are already
// waiting, or after Close, e is dropped and counted in Dropped. Records
// still buffered are lost if the process dies; Flush and Close write them.
func (s *Store) Record(e Execution) {
	h := &s.history
	switch h.mode {
	case HistoryNone:
		return
	case HistoryFailures:
		if e.Status == StatusOK {
			return
		}
	}
	h.mu.Lock()
	if h.closed || len(h.pending) >= h.max {
		h.mu.Unlock()
		h.dropped.Add(1)
		return
	}
	h.seq++
	h.pending = append(h.pending, record{e: e, seq: h.seq})
	h.accepted++
	wake := len(h.pending) == h.wakeAt
	h.mu.Unlock()
	if wake {
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
}

// Dropped returns how many records Record has dropped since Open: refused
// because the buffer was full or the store closed, or lost because their
// write failed.
func (s *Store) Dropped() uint64 { return s.history.dropped.Load() }

// Flush waits until every record accepted by Record before the call is
// written to Badger (or its write failed), waking the writer at once. It
// returns the first write error since the previous Flush, ctx's error if
// ctx ends first (the records are still written later), or ErrClosed.
func (s *Store) Flush(ctx context.Context) error {
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	h := &s.history
	h.mu.Lock()
	target := h.accepted
	for h.written < target {
		progress := h.progress
		h.mu.Unlock()
		select {
		case h.kick <- struct{}{}:
		default:
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return ctx.Err()
		}
		h.mu.Lock()
	}
	err := h.err
	h.err = nil
	h.mu.Unlock()
	if err != nil {
		return fmt.Errorf("store: write history: %w", err)
	}
	return nil
}

// writeLoop is the history writer. It owns the inflight batch and is the
// only goroutine that writes history to Badger.
func (s *Store) writeLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			// Record accepts nothing after Close, so this ends.
			for s.writeBatch() > 0 {
			}
			return
		case <-t.C:
		case <-s.history.kick:
		}
		// Keep going while Records arrive faster than a tick.
		for s.writeBatch() >= s.history.wakeAt {
		}
	}
}

// writeBatch writes what is pending and returns how many records that was.
// Called only from writeLoop.
func (s *Store) writeBatch() int {
	h := &s.history
	h.mu.Lock()
	batch := h.pending
	if len(batch) == 0 {
		h.mu.Unlock()
		return 0
	}
	h.pending, h.spare = h.spare[:0], nil
	h.inflight = batch
	h.mu.Unlock()

	err := s.writeRecords(batch)

	h.mu.Lock()
	n := len(batch)
	clear(batch) // drop the strings so the GC can have them
	h.spare = batch[:0]
	h.inflight = nil
	h.written += uint64(n)
	if err != nil {
		h.dropped.Add(uint64(n))
		if h.err == nil {
			h.err = err
		}
	}
	close(h.progress)
	h.progress = make(chan struct{})
	h.mu.Unlock()
	if err != nil {
		s.log.Warn("store: execution records lost", "records", n, "err", err)
	}
	return n
}

// writeRecords writes batch in one WriteBatch (which Badger splits into
// transactions of at most 15% of a memtable). Keys and values are encoded
// into one buffer sized up front.
func (s *Store) writeRecords(batch []record) error {
	if s.cfg.writeHook != nil {
		s.cfg.writeHook()
	}
	size := 0
	for i := range batch {
		e := &batch[i].e
		size += len(nsHistory) + len(e.TaskID) + 1 + historySuffixLen + recordSize(e)
	}
	buf := make([]byte, 0, size)
	entries := make([]badger.Entry, len(batch))
	expiresAt := uint64(time.Now().Add(s.cfg.HistoryTTL).Unix())

	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	for i := range batch {
		r := &batch[i]
		start := len(buf)
		buf = appendHistoryKey(buf, r.e.TaskID, r.e.ScheduledAt, r.e.Attempt, r.seq)
		mid := len(buf)
		buf = appendRecord(buf, &r.e)
		end := len(buf)
		entries[i] = badger.Entry{Key: buf[start:mid:mid], Value: buf[mid:end:end], ExpiresAt: expiresAt}
		if err := wb.SetEntry(&entries[i]); err != nil {
			return err
		}
	}
	return wb.Flush()
}

// History returns up to limit execution records of taskID (all of them
// when limit <= 0), newest first: by scheduled time, then attempt, then
// the order they were recorded in. Records still buffered are included,
// so a record is visible as soon as Record returns. Expired records are
// never returned. A record that cannot be decoded is skipped and logged.
func (s *Store) History(taskID string, limit int) ([]Execution, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	defer s.ops.Done()

	type keyed struct {
		key []byte
		e   Execution
	}
	// Buffered records first: one that leaves the buffer afterwards has
	// been written by then, so the scan below sees it.
	var buffered []keyed
	h := &s.history
	h.mu.Lock()
	for _, list := range [2][]record{h.inflight, h.pending} {
		for i := range list {
			if r := &list[i]; r.e.TaskID == taskID {
				key := appendHistoryKey(nil, taskID, r.e.ScheduledAt, r.e.Attempt, r.seq)
				buffered = append(buffered, keyed{key, r.e})
			}
		}
	}
	h.mu.Unlock()

	var out []keyed
	prefix := historyPrefix(taskID)
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			item := it.Item()
			if len(item.Key()) != len(prefix)+historySuffixLen {
				continue
			}
			var e Execution
			if err := item.Value(func(v []byte) error { return decodeRecord(v, &e) }); err != nil {
				if errors.Is(err, errBadRecord) {
					s.log.Warn("store: skipping undecodable execution record", "task", taskID, "key", fmt.Sprintf("%x", item.Key()))
					continue
				}
				return err
			}
			e.TaskID = taskID
			out = append(out, keyed{item.KeyCopy(nil), e})
			if limit > 0 && len(out) >= limit {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: history of %q: %w", taskID, err)
	}
	if len(buffered) > 0 {
		// A buffered record may be written already: keep one copy. One
		// written but beyond the limit sorts after every scanned record
		// and is cut below.
		seen := make(map[string]bool, len(out))
		for _, k := range out {
			seen[string(k.key)] = true
		}
		for _, b := range buffered {
			if !seen[string(b.key)] {
				out = append(out, b)
			}
		}
		slices.SortFunc(out, func(a, b keyed) int { return bytes.Compare(a.key, b.key) })
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	res := make([]Execution, len(out))
	for i := range out {
		res[i] = out[i].e
	}
	return res, nil
}

// DeleteHistory flushes the buffer (see Flush), then deletes every record
// of taskID, for when the task itself is deleted. Records of taskID
// recorded after the call began may survive; they expire with their TTL.
func (s *Store) DeleteHistory(ctx context.Context, taskID string) error {
	if err := s.Flush(ctx); err != nil {
		return err
	}
	if err := s.acquire(); err != nil {
		return err
	}
	defer s.ops.Done()
	if err := s.deletePrefix(historyPrefix(taskID)); err != nil {
		return fmt.Errorf("store: delete history of %q: %w", taskID, err)
	}
	return nil
}

// deletePrefix deletes every key under prefix with one WriteBatch, reading
// the keys from a snapshot taken before the first delete.
func (s *Store) deletePrefix(prefix []byte) error {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return wb.Flush()
}
