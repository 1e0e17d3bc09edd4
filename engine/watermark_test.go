package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardcron/shardcron/task"
)

// While a fire no worker takes holds the watermark, the loop goes on
// noting its partitions' changes, a watch batch each: the log the writer
// folds keeps only what a mark in flight can be folded at, and a fold,
// late, still gives the revisions as they stood when the dispatch point
// reached the watermark. It kept every change (a change a watch batch,
// 24 bytes, for as long as the watermark stood).
func TestLoop_AppliedLogStaysBoundedWhileTheWatermarkStands(t *testing.T) {
	at := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	tl := newTestLoop(t, at, nil)
	prof := noopProfile(task.MisfireFireOnce)
	tl.add(t, 0, at, prof, "* * * * * *", "x")
	tl.add(t, 1, at, prof, "* * * * * *", "y")
	// applied[n] is the partitions' revisions after the n-th change.
	applied := map[uint64][2]int64{tl.appliedSeq: {tl.parts[0].applied, tl.parts[1].applied}}
	revs := map[int]int64{}
	const n = 4 * appliedRoom
	for i := range n {
		tl.handle(&eventsCmd{part: i % 2, rev: int64(100 + i)})
		applied[tl.appliedSeq] = [2]int64{tl.parts[0].applied, tl.parts[1].applied}
		tl.clock.Advance(time.Millisecond)
		tl.dispatchAll()
	}
	if got := len(tl.dispatched(0)); got == 0 {
		t.Fatal("no fire waits in the queue: the watermark never stood")
	}
	tl.applieds.fold(revs) // the writer, late: etcd was slow
	tl.pool.mu.Lock()
	seq := tl.pool.seq
	tl.pool.mu.Unlock()
	if want := applied[seq]; revs[0] != want[0] || revs[1] != want[1] {
		t.Errorf("the standing watermark goes with revisions %v, want those after change %d: %v", revs, seq, want)
	}
	if got := len(tl.applieds.changes); got > appliedRoom {
		t.Errorf("the log holds %d changes after %d to 2 partitions while the watermark stood, want at most %d",
			got, n, appliedRoom)
	}
	tl.takeQueued()
	tl.publish()
	tl.applieds.fold(revs)
	if want := map[int]int64{0: tl.parts[0].applied, 1: tl.parts[1].applied}; !maps.Equal(revs, want) {
		t.Errorf("every fire taken, the watermark goes with revisions %v, want %v", revs, want)
	}
	if tl.applieds.room != 0 {
		t.Errorf("the log, folded whole, compacts past %d changes: the room of the stand before", tl.applieds.room)
	}
}

// compact keeps of a partition's changes between two counts only the
// last: a fold at any count it was given, or at one past all the changes,
// gives what it gave before.
func TestAppliedLog_CompactFoldsAsBefore(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var whole appliedLog
		for seq := uint64(1); seq <= 300; seq++ {
			whole.changes = append(whole.changes, appliedChange{seq: seq, p: rng.IntN(4), rev: int64(rng.IntN(5))})
		}
		var seqs []uint64
		for seq := uint64(0); seq <= 300; seq += 1 + uint64(rng.IntN(40)) {
			seqs = append(seqs, seq)
		}
		compacted := appliedLog{changes: slices.Clone(whole.changes)}
		compacted.compact(seqs)
		if len(compacted.changes) > 4*(len(seqs)+1) {
			t.Fatalf("%d changes kept over %d spans of 4 partitions", len(compacted.changes), len(seqs)+1)
		}
		want, got := map[int]int64{}, map[int]int64{}
		for _, seq := range append(seqs, 300) {
			whole.foldTo(seq, want)
			compacted.foldTo(seq, got)
			if !maps.Equal(got, want) {
				t.Fatalf("folded at %d: %v, want %v", seq, got, want)
			}
		}
	}
}

// After a crash, the acquires of a round read the dead session's
// watermark key once, and the value its applied revisions are based on
// once, whatever the partitions: each read both for itself, 2 048 reads
// for a session that held 1 024 partitions.
func TestEngine_AnAcquireRoundReadsADeadSessionsWatermarkOnce(t *testing.T) {
	const parts = 8
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, cli := resumingEngine(t, base)
	faults := injectFaults(cli)
	ctx := context.Background()
	put := func(k, v string) int64 { t.Helper(); return putKey(t, cli, k, v) }
	key := e.keys.watermark("node-a", "s1")
	named, _ := json.Marshal(checkpoint{Node: "node-a", Session: "s1", Watermark: base})
	whole := map[int]int64{}
	for p := range parts {
		put(e.keys.checkpoint(p), string(named))
		whole[p] = int64(40 + p)
	}
	w := base.Add(10 * time.Second)
	put(key, encodeWatermark(w.UnixNano(), nil, map[int]int64{1: 50}, put(key, encodeWatermark(w.UnixNano(), nil, whole, 0, carriedLists{})), carriedLists{}))
	var reads atomic.Int64
	hook := func(k string) {
		if k == key {
			reads.Add(1)
		}
	}
	faults.afterGet.Store(&hook)

	dead := newDeadMarks()
	var wg sync.WaitGroup
	applied := make([]int64, parts)
	for p := range parts {
		wg.Go(func() {
			res, err := e.resume(ctx, p, dead)
			if err != nil || res.w != w.UnixNano() {
				t.Errorf("partition %d resumes after %v (%v), want after %v", p, time.Unix(0, res.w).UTC(), err, w)
			}
			applied[p] = res.applied
		})
	}
	wg.Wait()
	for p, rev := range applied {
		if want := map[bool]int64{true: 50, false: whole[p]}[p == 1]; rev != want {
			t.Errorf("partition %d resumes with applied %d, want %d", p, rev, want)
		}
	}
	if n := reads.Load(); n != 2 {
		t.Errorf("the round's %d acquires read the dead session's watermark key %d times, want twice: its value and its base", parts, n)
	}
}

// The log as the loop, the workers and the writer drive it: changes
// noted (a release's among them, rev 0, and a re-acquire's after it), the
// dispatch point moved and published or left unpublished behind jobs
// waiting for room, jobs pushed without moving it, taken, dropped by a
// fence's reset, and the writer folding seldom enough that the log
// compacts under marks in flight. Each fold, at whatever count the
// pool's watermark goes with then, gives what the whole log gives at it:
// compact is given every count a later fold can be at (pool.seqs and the
// loop's throughSeq), which TestAppliedLog_CompactFoldsAsBefore takes as
// given.
func TestAppliedLog_FoldsAsTheWholeLogUnderThePoolsMarks(t *testing.T) {
	seeds := uint64(8)
	if raceEnabled {
		seeds = 2 // one goroutine: nothing for the detector to find, and 8 times as slow
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(seed, 3))
		p := &pool{}
		log := &appliedLog{pool: p}
		var whole appliedLog
		var seq, throughSeq uint64
		var through int64
		got, want := map[int]int64{}, map[int]int64{}
		folds, compactions, inFlight := 0, 0, 0
		stalled := false // workers take nothing: the marks pile up
		fold := func() {
			log.fold(got)
			_, at := p.marked()
			whole.foldTo(at, want)
			folds++
			if !maps.Equal(got, want) {
				t.Fatalf("seed %d, fold %d at change %d of %d: %v, want %v", seed, folds, at, seq, got, want)
			}
		}
		// probe checks a fold at every count a later one can be at: the
		// watermark's, those of the marks in flight, the loop's.
		probe := func() {
			p.mu.Lock()
			at := []uint64{p.seq, throughSeq}
			for _, m := range p.marks[p.mhead:] {
				at = append(at, m.seq)
			}
			p.mu.Unlock()
			slices.Sort(at)
			at = slices.Compact(at)
			g, x := foldsAt(log.changes, got, at), foldsAt(whole.changes, want, at)
			for i, c := range at {
				if !maps.Equal(g[i], x[i]) {
					t.Fatalf("seed %d: a fold at change %d of %d would give %v, want %v", seed, c, seq, g[i], x[i])
				}
			}
		}
		for range 100_000 {
			switch r := rng.IntN(100); {
			case rng.IntN(20_000) == 0:
				fold()
			case rng.IntN(250) == 0:
				probe()
			case rng.IntN(1_000) == 0:
				stalled = !stalled
			case r < 60:
				seq++
				c := appliedChange{seq: seq, p: rng.IntN(6), rev: int64(seq)}
				if rng.IntN(5) == 0 {
					c.rev = 0
				}
				whole.changes = append(whole.changes, c)
				n := len(log.changes)
				log.note(c.seq, c.p, c.rev, throughSeq)
				if len(log.changes) <= n {
					compactions++
					inFlight = max(inFlight, len(p.marks)-p.mhead)
				}
			case r < 70: // rescheduleReleased
				through++
				throughSeq = seq
				if rng.IntN(3) > 0 { // else jobs wait for room: no publish
					p.publish(through, throughSeq)
				}
			case r < 85: // pushJobs
				p.mu.Lock()
				p.pushed += uint64(1 + rng.IntN(3))
				p.mu.Unlock()
				if rng.IntN(3) > 0 {
					p.publish(through, throughSeq)
				}
			case r < 99 && !stalled: // a worker's take
				p.mu.Lock()
				p.taken = min(p.pushed, p.taken+uint64(1+rng.IntN(4)))
				p.advanceMarks()
				p.mu.Unlock()
			case r == 99: // a fence drops the queue
				p.reset()
			}
		}
		fold()
		p.mu.Lock()
		p.taken = p.pushed
		p.mu.Unlock()
		through, throughSeq = through+1, seq
		p.publish(through, throughSeq)
		fold()
		if compactions == 0 || inFlight < 2 {
			t.Fatalf("seed %d: the log compacted %d times over %d changes, with at most %d marks in flight", seed, compactions, seq, inFlight)
		}
	}
}

// foldsAt returns what folds of changes into revs at each count of at
// (ascending) would give, leaving both as they are.
func foldsAt(changes []appliedChange, revs map[int]int64, at []uint64) []map[int]int64 {
	out := make([]map[int]int64, 0, len(at))
	cur := maps.Clone(revs)
	rest := slices.Clone(changes)
	for _, seq := range at {
		n, _ := slices.BinarySearchFunc(rest, seq+1, func(c appliedChange, s uint64) int { return cmp.Compare(c.seq, s) })
		(&appliedLog{changes: rest[:n]}).foldTo(seq, cur)
		rest = rest[n:]
		out = append(out, maps.Clone(cur))
	}
	return out
}

// A read of a dead session's watermark key that failed for its own
// acquire's cancel (the ring moved that partition on) poisons none of
// the round: the acquire that waited for it reads for itself, and the
// next to ask reads again, for the round.
func TestDeadMarks_AFailedReadIsNotKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDeadMarks()
		var reads atomic.Int64
		read := func(ctx context.Context, key string) (deadMark, error) {
			if reads.Add(1) == 1 {
				<-ctx.Done()
				return deadMark{}, ctx.Err()
			}
			return deadMark{found: true}, nil
		}
		moved, cancel := context.WithCancel(context.Background())
		var first, second error
		var m deadMark
		var wg sync.WaitGroup
		wg.Go(func() { _, first = d.get(moved, "k", read) })
		synctest.Wait()
		wg.Go(func() { m, second = d.get(context.Background(), "k", read) })
		synctest.Wait() // waiting for the first read
		cancel()
		wg.Wait()
		if !errors.Is(first, context.Canceled) {
			t.Fatalf("the canceled acquire's read returned %v, want its cancel", first)
		}
		if second != nil || !m.found {
			t.Errorf("the acquire that waited for it got the key found %v, %v: want it as read for itself", m.found, second)
		}
		for range 2 {
			if m, err := d.get(context.Background(), "k", read); err != nil || !m.found {
				t.Errorf("a later acquire got the key found %v, %v: want it as read", m.found, err)
			}
		}
		if n := reads.Load(); n != 3 {
			t.Errorf("the key was read %d times, want 3: the canceled read, the waiter's, and one for the later two", n)
		}
	})
}
