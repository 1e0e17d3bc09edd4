package engine

import (
	"context"
	"encoding/json"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardcron/shardcron/task"
)

// While a fire no worker takes holds the watermark, the loop goes on
// noting its partitions' changes, a watch batch each: the log the writer
// folds keeps only what a mark in flight can be folded at, and a fold,
// late, still gives the revisions as they stood when the dispatch point
// reached the watermark. It kept every change (a change a watch batch, 24 bytes,
// for as long as the watermark stood).
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
	put(key, encodeWatermark(w.UnixNano(), nil, map[int]int64{1: 50}, put(key, encodeWatermark(w.UnixNano(), nil, whole, 0))))
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
			_, resume, _, _, rev, err := e.resume(ctx, p, dead)
			if err != nil || resume != w.UnixNano() {
				t.Errorf("partition %d resumes after %v (%v), want after %v", p, time.Unix(0, resume).UTC(), err, w)
			}
			applied[p] = rev
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
