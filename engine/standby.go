package engine

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/ring"
)

// Warm standby for a crash.
//
// A node that crashes keeps its partitions until etcd expires its lease, a
// TTL after its last keep-alive; only then do the survivors read its tasks
// from etcd, and at a million tasks that read, not the lease, was most of
// the gap past the TTL. Every node writes its watermark every
// WatermarkInterval, so a node whose watermark key stops being written for
// suspectAfter is likely dead (killed, cut off from etcd, stopped) and about
// to lose its lease. The nodes that the ring without it names for its
// partitions then prepare them at once, as a join's make-before-break does
// (read and decode the tasks, at a revision the acquire catches up from),
// and keep them in standby: when the member set drops the node, each
// acquire finds its partition prepared and only locks, catches up and arms.
//
// Nothing else moves ahead of the lease: no lock is asked for and nothing
// is published, so a suspect that writes again (a pause, a slow etcd) loses
// nothing; the survivors drop what they prepared. While this node's own
// watermark is not written either (etcd refuses or is slow), or more than
// half of the members look stale, the stall is etcd's and no one new is
// suspected: preparing every partition of the fleet would not help. One
// suspected before stays so until it writes again: its silence says as
// much as before, and what was prepared for it is not read again; or
// until it has been silent for three lease TTLs: a member that long
// silent still holds its lease, so it is alive and stuck (suspicious).

// marksPoll is how often a node reads the watermark keys to see whose
// stopped moving.
const marksPoll = time.Second

// suspectAfter is how long a node's watermark key must go unwritten before
// the others prepare its partitions: a third of the lease TTL, when the
// node's own keep-alive would have retried twice, and at least ten
// watermark intervals.
func (e *Engine) suspectAfter() time.Duration {
	return max(e.cfg.LeaseTTL/3, 10*e.cfg.WatermarkInterval)
}

// watchMarks sends, every marksPoll until ctx ends, when each node's
// watermark key was last seen written (its newest session's mod revision
// moving), by node id; then it closes the channel.
func (e *Engine) watchMarks(ctx context.Context) <-chan map[string]time.Time {
	out := make(chan map[string]time.Time, 1)
	go func() {
		defer close(out)
		t := time.NewTicker(marksPoll)
		defer t.Stop()
		revs := map[string]int64{}      // by node: the newest mod revision of its keys
		moved := map[string]time.Time{} // by node: when revs last grew
		var last int64                  // etcd's revision at the last poll
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
			resp, err := e.cli.Get(rctx, e.keys.watermarks(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			cancel()
			if err != nil {
				continue // not a node's silence: etcd's
			}
			if resp.Header.Revision < last {
				// etcd was restored from a backup: its revisions start again
				// below those seen, and every node starts over as written
				// now. Compared with the revisions before, none would move
				// until etcd passed them, and what was prepared for a
				// suspect would stay, read from a history etcd lost.
				clear(revs)
				clear(moved)
			}
			last = resp.Header.Revision
			now := time.Now()
			seen := map[string]int64{}
			for _, kv := range resp.Kvs {
				node, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), e.keys.watermarks()), "/")
				seen[node] = max(seen[node], kv.ModRevision)
			}
			for node, rev := range seen {
				if rev > revs[node] {
					revs[node], moved[node] = rev, now
				}
			}
			for node := range revs {
				if _, ok := seen[node]; !ok {
					delete(revs, node)
					delete(moved, node)
				}
			}
			select {
			case <-out: // the reader takes the newest only
			default:
			}
			out <- maps.Clone(moved)
		}
	}()
	return out
}

// silent reports whether node's watermark was last seen written, by moved
// (watchMarks), suspectAfter or longer before now.
func (e *Engine) silent(moved map[string]time.Time, node string, now time.Time) bool {
	t, ok := moved[node]
	return ok && now.Sub(t) >= e.suspectAfter()
}

// suspicious reports whether member node looks dead: silent, but not for
// so long that a dead node's lease would have ended. A member silent for
// three lease TTLs still holds its lease, so it is alive, and stuck:
// what was prepared for it would be kept, and caught up from an ever
// older read, for as long as that lasted.
func (e *Engine) suspicious(moved map[string]time.Time, node string, now time.Time) bool {
	return e.silent(moved, node, now) && now.Sub(moved[node]) < 3*e.cfg.LeaseTTL
}

// suspects returns the members of a that are silent, and true; or nil and
// false, no verdict, while this node's own watermark is not written
// either, or when more than half the members would be.
func (e *Engine) suspects(a *ring.Assignment, moved map[string]time.Time, now time.Time) ([]string, bool) {
	if a == nil {
		return nil, true
	}
	if _, ok := moved[e.cfg.NodeID]; !ok || e.silent(moved, e.cfg.NodeID, now) {
		return nil, false
	}
	members := a.Members()
	var out []string
	for _, m := range members {
		if m != e.cfg.NodeID && e.suspicious(moved, m, now) {
			out = append(out, m)
		}
	}
	if len(out)*2 > len(members) {
		return nil, false
	}
	return out, true
}

// standby holds the partitions prepared ahead of a suspect's lease's end,
// until an acquire takes them (take) or the suspicion ends (reset).
type standby struct {
	mu      sync.Mutex            // guards parts and reading
	parts   map[int]*prepared     // prepared, not yet taken
	reading map[int]chan struct{} // the last prepare begun of each partition being prepared: closed when it ended
	ready   atomic.Int64          // len(parts), for Stats
	taken   atomic.Uint64         // partitions acquires took from here, for Stats
}

func newStandby() *standby {
	return &standby{parts: map[int]*prepared{}, reading: map[int]chan struct{}{}}
}

// begin records a prepare of p about to start, and returns the one begun
// before, if still under way (else nil), which it must wait for: a
// prepare replaces p's cache, and only the last may. Its caller calls end
// with the channel returned second once the prepare ended.
func (s *standby) begin(p int) (before, mine chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before, mine = s.reading[p], make(chan struct{})
	s.reading[p] = mine
	return before, mine
}

// end says that the prepare of p begun with mine ended, its read in the
// cache and, still wanted, in parts.
func (s *standby) end(p int, mine chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reading[p] == mine {
		delete(s.reading, p)
	}
	close(mine)
}

// put keeps prep, unless ctx, the suspicion it was prepared for, ended.
func (s *standby) put(ctx context.Context, prep *prepared) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() == nil {
		s.parts[prep.p] = prep
		s.ready.Store(int64(len(s.parts)))
	}
}

// take returns partition p prepared, and forgets it; nil if not held. It
// waits for a prepare of p under way to end first, or ctx.
func (s *standby) take(ctx context.Context, p int) (*prepared, error) {
	s.mu.Lock()
	reading := s.reading[p]
	s.mu.Unlock()
	if reading != nil {
		select {
		case <-reading:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prep := s.parts[p]
	if prep != nil {
		delete(s.parts, p)
		s.ready.Store(int64(len(s.parts)))
		s.taken.Add(1)
	}
	return prep, nil
}

// drop forgets partition p. Its put must have been canceled first.
func (s *standby) drop(p int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.parts, p)
	s.ready.Store(int64(len(s.parts)))
}

// reset forgets every partition held. Their puts must have been canceled
// first.
func (s *standby) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.parts)
	s.ready.Store(0)
}

// standing is a partition this node prepares, or prepared, for a suspect.
type standing struct {
	from   string             // the suspect that holds it
	cancel context.CancelFunc // ends its preparing, and its put
	failed atomic.Bool        // its prepare failed: the next poll prepares it again
}

// suspect follows the watermarks seen moving (watchMarks). It prepares the
// partitions that the ring without the suspects gives this node among
// those they hold, and drops what it prepared once the partition is
// acquired, or its suspect writes again, or, gone from the member set, its
// suspect's partition went to another node. A prepare that failed is
// begun again. What it prepared for a suspect gone from the member set
// stays for the acquires the change starts, however they queue.
func (s *serving) suspect(moved map[string]time.Time) {
	e := s.e
	now := time.Now()
	sus, verdict := e.suspects(s.assign, moved, now)
	var members []string
	if s.assign != nil {
		members = s.assign.Members()
	}
	if !verdict {
		// No new suspect, but those suspected that did not write again
		// still look dead: what was prepared for them stays.
		sus = slices.DeleteFunc(slices.Clone(s.suspected), func(m string) bool {
			return !slices.Contains(members, m) || !e.suspicious(moved, m, now)
		})
	}
	plan := map[int]bool{}
	if len(sus) > 0 {
		staying := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return slices.Contains(sus, m) })
		without, err := ring.NewAssignment(s.assign.Config(), staying)
		if err != nil {
			if !slices.Equal(sus, s.suspected) { // once, not every poll
				e.log.Warn("the ring without the nodes that look dead does not fit; preparing nothing", "nodes", sus, "err", err)
			}
		} else {
			for _, p := range without.Owned(e.cfg.NodeID) {
				if slices.Contains(sus, s.assign.Owner(p)) {
					plan[p] = true
				}
			}
		}
	}
	for p, st := range s.standing {
		alive := slices.Contains(members, st.from) && !slices.Contains(sus, st.from)
		gone := !slices.Contains(members, st.from)
		if s.parts[p] != nil || alive || (gone && !s.desired[p]) || (!gone && !plan[p]) || st.failed.Load() {
			st.cancel()
			e.standby.drop(p)
			delete(s.standing, p)
		}
	}
	var started int
	for p := range plan {
		if s.standing[p] != nil || s.parts[p] != nil || s.acquiring[p] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(s.ctx)
		st := &standing{from: s.assign.Owner(p), cancel: cancel}
		s.standing[p] = st
		started++
		// Begun here, on the goroutine that starts the acquires: an acquire
		// of p started after this waits for it (take).
		before, mine := e.standby.begin(p)
		s.wg.Go(func() {
			defer e.standby.end(p, mine)
			if before != nil {
				// Canceled (its standing was dropped for this one), it ends
				// soon; not waited for, it could still replace the cache
				// after the acquire that waits for this one read it.
				<-before
			}
			prep, err := e.prepareTurn(ctx, p)
			switch {
			case err == nil:
				e.standby.put(ctx, prep)
			case ctx.Err() == nil:
				// A read that failed as etcd was slow or out of reach for a
				// moment, as it may be while a node dies.
				e.log.Debug("preparing a partition for a node that looks dead failed; trying again", "partition", p, "err", err)
				st.failed.Store(true)
			}
		})
	}
	if !slices.Equal(sus, s.suspected) {
		if len(sus) > 0 {
			e.log.Info("nodes look dead (their watermarks stopped); preparing the partitions this node would take from them",
				"nodes", sus, "silent_for_at_least", e.suspectAfter(), "partitions", started)
		} else {
			e.log.Info("no node looks dead any more", "nodes", s.suspected, "kept_for_acquires", len(s.standing))
		}
		s.suspected = sus
	}
}
