package timerwheel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

func newWheel(t *testing.T, tick time.Duration, now int64) *Wheel {
	t.Helper()
	w, err := New(tick, now)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func ids(exp []Expired) []uint32 {
	out := make([]uint32, len(exp))
	for i, e := range exp {
		out[i] = e.ID
	}
	return out
}

func TestNew_RejectsNonPositiveTick(t *testing.T) {
	for _, tick := range []time.Duration{0, -time.Millisecond} {
		if _, err := New(tick, 0); err == nil {
			t.Errorf("New(%v) succeeded", tick)
		}
	}
}

func TestWheel_NeverEarlyOnExactBoundaries(t *testing.T) {
	base := 1_700_000_000_000 * ms // a second boundary
	for _, tick := range []time.Duration{time.Nanosecond, 7 * time.Nanosecond, time.Millisecond, time.Second} {
		t.Run(tick.String(), func(t *testing.T) {
			w := newWheel(t, tick, base)
			deltas := []int64{0, 1, int64(tick) - 1, int64(tick), int64(tick) + 1,
				255 * int64(tick), 256 * int64(tick), 256*int64(tick) + 1,
				1 << 14 * int64(tick), 1<<14*int64(tick) + 1, 1 << 20 * int64(tick)}
			for i, d := range deltas {
				w.Schedule(uint32(i), base+d)
			}
			for i, d := range deltas {
				at := base + d
				if got := w.Advance(at-1, 0, nil); slices.Contains(ids(got), uint32(i)) {
					t.Fatalf("timer at +%d delivered at +%d: early", d, d-1)
				}
				got := w.Advance(at, 0, nil)
				for _, e := range got {
					if e.At > at {
						t.Fatalf("timer at %d delivered at %d: early", e.At, at)
					}
				}
				// Exact multiples of the tick fire on the Advance that reaches them.
				if at%int64(tick) == 0 && !slices.Contains(ids(got), uint32(i)) {
					if w.Scheduled(uint32(i)) {
						t.Fatalf("timer at +%d not delivered at its own time", d)
					}
				}
			}
		})
	}
}

func TestWheel_PastDeadlineIsDueOnNextAdvance(t *testing.T) {
	w := newWheel(t, time.Millisecond, 1000*ms)
	w.Advance(5000*ms, 0, nil)
	w.Schedule(1, 4000*ms) // in the past
	w.Schedule(2, 5000*ms) // exactly now
	w.Schedule(3, -1)      // before the epoch
	got := w.Advance(5000*ms, 0, nil)
	if !slices.Equal(ids(got), []uint32{1, 2, 3}) {
		t.Fatalf("got %v, want [1 2 3] on the same now", got)
	}
	if got[0].At != 4000*ms || got[2].At != -1 {
		t.Fatalf("deadlines not reported as scheduled: %+v", got)
	}
}

func TestWheel_YearlyTimer(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	at := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	far := time.Date(2226, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	w := newWheel(t, time.Millisecond, start)
	w.Schedule(7, at)
	w.Schedule(8, far)
	if d, ok := w.NextDeadline(); !ok || d > at {
		t.Fatalf("NextDeadline = %d, %v; want <= %d", d, ok, at)
	}
	// Sleep-until-deadline loop: it must reach the timer in a few steps, not
	// one per tick.
	steps := 0
	var got []Expired
	for len(got) == 0 {
		d, ok := w.NextDeadline()
		if !ok {
			t.Fatal("timer lost")
		}
		if d > at {
			t.Fatalf("NextDeadline %d jumped past the timer at %d", d, at)
		}
		got = w.Advance(d, 0, got)
		steps++
	}
	if steps > 2*numLevels || got[0].ID != 7 || got[0].At != at {
		t.Fatalf("after %d steps got %+v", steps, got)
	}
	if got := w.Advance(far-1, 0, nil); len(got) != 0 {
		t.Fatalf("century timer early: %+v", got)
	}
	if got := w.Advance(far, 0, nil); len(got) != 1 || got[0].ID != 8 {
		t.Fatalf("century timer not delivered: %+v", got)
	}
	if _, ok := w.NextDeadline(); ok || w.Len() != 0 {
		t.Fatal("empty wheel reports a deadline")
	}
}

func TestWheel_LimitResumesMidSlot(t *testing.T) {
	w := newWheel(t, time.Millisecond, 0)
	for i := range uint32(1000) {
		w.Schedule(i, 30_000*ms) // one slot, far enough to cascade twice
	}
	var all []uint32
	for batches := 0; ; batches++ {
		got := w.Advance(30_000*ms, 64, nil)
		if len(got) == 0 {
			if batches != 16 {
				t.Fatalf("%d batches, want 16", batches)
			}
			break
		}
		if len(got) > 64 {
			t.Fatalf("batch of %d over the limit", len(got))
		}
		// A timer added to the tick being drained is delivered in it too.
		if batches == 3 {
			w.Schedule(5000, 30_000*ms)
		}
		all = append(all, ids(got)...)
	}
	want := make([]uint32, 1000)
	for i := range want {
		want[i] = uint32(i)
	}
	want = append(want, 5000)
	if !slices.Equal(all, want) {
		t.Fatalf("order or set wrong: got %d ids, first %v", len(all), all[:min(10, len(all))])
	}
}

func TestWheel_CancelAndRescheduleMidCascade(t *testing.T) {
	w := newWheel(t, time.Millisecond, 0)
	// Timers 0..99 share a level-2 slot at 20 s; 100..199 spread over a
	// level-2 slot so that it cascades element by element.
	for i := range uint32(100) {
		w.Schedule(i, 20_000*ms)
		w.Schedule(100+i, 20_000*ms+int64(i)*37*ms)
	}
	// Advance to the cascade of that slot (16384 ticks): they move down.
	w.Advance(16_384*ms, 0, nil)
	for i := uint32(0); i < 200; i += 2 {
		if !w.Cancel(i) {
			t.Fatalf("cancel %d after cascade failed", i)
		}
	}
	w.Reschedule(1, 16_500*ms)   // earlier, now on level 0
	w.Reschedule(101, 40_000*ms) // later, back up a level
	w.Reschedule(199, 20_000*ms) // into the spliced slot
	w.Schedule(0, 20_000*ms+1)   // a cancelled id reused
	if w.Cancel(2) || w.Cancel(100000) {
		t.Fatal("cancel of an unscheduled id reported true")
	}
	got := w.Advance(20_000*ms, 0, nil)
	want := []uint32{1}
	for i := uint32(3); i < 100; i += 2 {
		want = append(want, i)
	}
	want = append(want, 199)
	if !slices.Equal(ids(got), want) {
		t.Fatalf("got %v\nwant %v", ids(got), want)
	}
	got = w.Advance(40_000*ms, 0, nil)
	if n := len(got); n != 50 { // 0, 101, and the odd 103..197
		t.Fatalf("got %d timers, want 50: %v", n, ids(got))
	}
	if w.Len() != 0 {
		t.Fatalf("%d timers left", w.Len())
	}
}

// checkItems verifies the wheel's bookkeeping: slots hold exactly n live
// items and stale dead ones, free blocks are not linked into slots, and
// every block handed out is in a slot or free: none leaks.
func checkItems(w *Wheel) error {
	live, dead := 0, 0
	used := map[int32]bool{}
	for i, s := range w.slots {
		for bi := s.head; bi >= 0; bi = w.block(bi).next {
			if used[bi] {
				return fmt.Errorf("block %d linked twice (slot %d)", bi, i)
			}
			used[bi] = true
			b := w.block(bi)
			for _, it := range b.items[b.start:b.end] {
				if g := w.lookup(it.id); g != nil && *g == it.gen {
					live++
				} else {
					dead++
				}
			}
			if b.next < 0 && bi != s.tail {
				return fmt.Errorf("slot %d: tail %d, chain ends at %d", i, s.tail, bi)
			}
		}
	}
	free := 0
	for bi := w.free; bi >= 0; bi = w.block(bi).next {
		if used[bi] {
			return fmt.Errorf("free block %d is in a slot", bi)
		}
		if free++; free > int(w.nblocks) {
			return fmt.Errorf("the free list loops")
		}
	}
	if len(used)+free != int(w.nblocks) {
		return fmt.Errorf("%d blocks in slots and %d free of %d handed out: %d leaked", len(used), free, w.nblocks, int(w.nblocks)-len(used)-free)
	}
	if live != w.n || dead != w.stale {
		return fmt.Errorf("slots hold %d live and %d stale items; wheel counts %d and %d", live, dead, w.n, w.stale)
	}
	return nil
}

func TestWheel_CompactionAcrossBlocks(t *testing.T) {
	w := newWheel(t, time.Millisecond, 0)
	w.compactMin = 1
	const n = 5 * blockLen
	for i := range uint32(n) {
		w.Schedule(i, 20_000*ms) // one slot, several blocks
		w.Schedule(n+i, 20_000*ms+int64(i)*ms)
	}
	// Cancel two in three: stale items soon outnumber live ones, so
	// compactions run over chains of several blocks.
	var want []uint32
	spread := 0
	for i := range uint32(2 * n) {
		switch {
		case i%3 != 0:
			w.Cancel(i)
		case i < n:
			want = append(want, i)
		default:
			spread++
		}
	}
	if w.stale > w.n {
		t.Fatalf("%d stale items with %d live: not compacted", w.stale, w.n)
	}
	if err := checkItems(w); err != nil {
		t.Fatal(err)
	}
	got := w.Advance(20_000*ms, 0, nil)
	if !slices.Equal(ids(got), want) {
		t.Fatalf("got %v\nwant %v", ids(got), want)
	}
	for _, e := range got {
		if e.At != 20_000*ms {
			t.Fatalf("%+v: deadline corrupted", e)
		}
	}
	rest := w.Advance(30_000*ms, 0, nil)
	if len(rest) != spread || w.Len() != 0 {
		t.Fatalf("%d spread timers delivered, %d left", len(rest), w.Len())
	}
}

// TestWheel_ReusesItsBlocks: blocks freed by an expiry or a compaction
// are used again before new ones, whichever block it is, the first one
// handed out included: in steady state the wheel allocates nothing.
func TestWheel_ReusesItsBlocks(t *testing.T) {
	w := newWheel(t, time.Millisecond, 0)
	for round := range int64(100) {
		for i := range uint32(3 * blockLen) {
			w.Schedule(i, (round+1)*ms)
		}
		w.Advance((round+1)*ms, 0, nil)
	}
	if w.nblocks != 3 {
		t.Fatalf("100 rounds of 3 blocks' worth of timers handed out %d blocks, want 3", w.nblocks)
	}

	// A compaction frees the blocks it emptied at a chain's end: here the
	// first block handed out, reused as the chain's second.
	w = newWheel(t, time.Millisecond, 0)
	w.compactMin = 1
	w.Schedule(0, ms) // block 0
	for i := range uint32(blockLen) {
		w.Schedule(1+i, time.Hour.Nanoseconds()) // block 1
	}
	w.Advance(ms, 0, nil) // block 0 freed
	for i := range uint32(blockLen) {
		w.Schedule(1+blockLen+i, time.Hour.Nanoseconds()) // block 0 again, after block 1
	}
	for i := range uint32(blockLen) {
		w.Cancel(1 + blockLen + i) // the last cancel compacts
	}
	if err := checkItems(w); err != nil {
		t.Fatal(err)
	}
}

func TestWheel_IDReuseAfterExpiry(t *testing.T) {
	w := newWheel(t, time.Millisecond, 0)
	for round := int64(1); round <= 3; round++ {
		w.Schedule(42, round*1000*ms)
		if !w.Scheduled(42) {
			t.Fatal("not scheduled")
		}
		got := w.Advance(round*1000*ms, 0, nil)
		if len(got) != 1 || got[0].ID != 42 {
			t.Fatalf("round %d: %+v", round, got)
		}
		if w.Scheduled(42) {
			t.Fatal("expired timer still scheduled")
		}
	}
}

func TestWheel_ScheduleTakesIDsUpToMaxID(t *testing.T) {
	w := newWheel(t, time.Millisecond, 0)
	w.Schedule(MaxID, ms)
	if got := w.Advance(ms, 0, nil); !slices.Equal(ids(got), []uint32{MaxID}) {
		t.Fatalf("timer MaxID: Advance delivered %v", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	w.Schedule(MaxID+1, 0)
}

// TestWheel_MatchesReference drives the wheel and a reference map with the
// same random operations and checks, after every Advance, that nothing was
// early, nothing was delivered twice or out of tick order, nothing due was
// left behind, and NextDeadline never overshoots.
func TestWheel_MatchesReference(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 40
	}
	for seed := range uint64(seeds) {
		// Odd seeds compact as soon as stale items outnumber live ones.
		compactMin := 1 << 16
		if seed%2 == 1 {
			compactMin = 1
		}
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			if err := checkAgainstReference(seed, 3000, compactMin); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		})
	}
}

type refTimer struct {
	at  int64
	key int64 // tick it is due in: max(ceil(at/tick), wheel tick when scheduled)
}

func checkAgainstReference(seed uint64, ops, compactMin int) error {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ticks := []time.Duration{time.Nanosecond, 3 * time.Nanosecond, time.Millisecond}
	tick := ticks[rng.IntN(len(ticks))]
	T := int64(tick)
	now := rng.Int64N(1 << 50)
	w, err := New(tick, now)
	if err != nil {
		return err
	}
	w.compactMin = compactMin
	ref := map[uint32]refTimer{}
	idSpace := uint32(1 + rng.IntN(5000))
	lastKey := int64(math.MinInt64)
	delta := func() int64 {
		switch rng.IntN(7) {
		case 0:
			return -rng.Int64N(10 * T) // past
		case 1:
			return rng.Int64N(3 * T) // this tick or next
		case 2:
			return rng.Int64N(300 * T) // level 0 and 1
		case 3:
			return rng.Int64N(1 << 20 * T) // levels 1-2
		case 4:
			return rng.Int64N(1<<6) * T << 14 // exact level-2 boundaries
		case 5:
			return rng.Int64N(1 << 40 * T) // far
		default:
			return rng.Int64N(1000) * T // whole ticks: many share a slot
		}
	}
	for op := range ops {
		switch r := rng.IntN(100); {
		case r < 50:
			id := rng.Uint32N(idSpace)
			at := now + delta()
			w.Schedule(id, at)
			cur := w.Now() / T
			ref[id] = refTimer{at: at, key: max(refCeil(at, T), cur)}
		case r < 65:
			id := rng.Uint32N(idSpace)
			_, want := ref[id]
			if got := w.Cancel(id); got != want {
				return fmt.Errorf("op %d: Cancel(%d) = %v, want %v", op, id, got, want)
			}
			if want && w.stale > max(w.n, w.compactMin) {
				return fmt.Errorf("op %d: %d stale items with %d live after a cancel: not compacted", op, w.stale, w.n)
			}
			delete(ref, id)
		default:
			if d, ok := w.NextDeadline(); ok != (len(ref) > 0) {
				return fmt.Errorf("op %d: NextDeadline ok=%v with %d timers", op, ok, len(ref))
			} else if ok {
				for id, rt := range ref {
					if d > mulSat(rt.key, T) {
						return fmt.Errorf("op %d: NextDeadline %d after timer %d due %d", op, d, id, rt.key*T)
					}
				}
				if rng.IntN(2) == 0 {
					now = max(now, d) // sleep until the deadline
				}
			}
			switch rng.IntN(4) {
			case 0:
				now += rng.Int64N(3 * T)
			case 1:
				now += rng.Int64N(500 * T)
			case 2:
				now += rng.Int64N(1 << 22 * T)
			}
			limit := 0
			if rng.IntN(3) == 0 {
				limit = 1 + rng.IntN(20)
			}
			for {
				got := w.Advance(now, limit, nil)
				if limit > 0 && len(got) > limit {
					return fmt.Errorf("op %d: %d delivered over limit %d", op, len(got), limit)
				}
				for _, e := range got {
					rt, ok := ref[e.ID]
					if !ok {
						return fmt.Errorf("op %d: delivered %d which is not scheduled (twice?)", op, e.ID)
					}
					if e.At != rt.at {
						return fmt.Errorf("op %d: %d delivered with at %d, scheduled %d", op, e.ID, e.At, rt.at)
					}
					if e.At > now {
						return fmt.Errorf("op %d: %d due %d delivered early at %d", op, e.ID, e.At, now)
					}
					if rt.key < lastKey {
						return fmt.Errorf("op %d: %d of tick %d delivered after tick %d", op, e.ID, rt.key, lastKey)
					}
					lastKey = rt.key
					delete(ref, e.ID)
				}
				if limit == 0 || len(got) < limit {
					break
				}
			}
			for id, rt := range ref {
				if rt.key <= refFloor(now, T) {
					return fmt.Errorf("op %d: %d due in tick %d left behind at %d", op, id, rt.key, now/T)
				}
			}
		}
		if w.Len() != len(ref) {
			return fmt.Errorf("op %d: Len %d, reference %d", op, w.Len(), len(ref))
		}
		if op%50 == 0 {
			if err := checkItems(w); err != nil {
				return fmt.Errorf("op %d: %v", op, err)
			}
		}

	}
	for id := range idSpace {
		if _, want := ref[id]; w.Scheduled(id) != want {
			return fmt.Errorf("Scheduled(%d) = %v, want %v", id, !want, want)
		}
	}
	return nil
}

// refFloor and refCeil are the reference's own roundings, written apart
// from the wheel's: with the wheel's, a wheel whose rounding delivered
// every timer a tick late passed the reference.
func refFloor(a, b int64) int64 {
	q := a / b
	if q*b > a {
		q--
	}
	return q
}

func refCeil(a, b int64) int64 {
	q := a / b
	if q*b < a {
		q++
	}
	return q
}

// TestWheel_PeekIsWhatAdvanceDelivers checks Peek against Advance under
// random schedules, cancels and advances: whatever Peek returns is the
// start of what the Advance that reaches its time delivers, in order, and
// nothing is due before that time.
func TestWheel_PeekIsWhatAdvanceDelivers(t *testing.T) {
	base := 1_700_000_000_000 * ms
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		w := newWheel(t, time.Millisecond, base)
		now := base
		peeked := 0
		for step := range 300 {
			switch rng.IntN(4) {
			case 0: // a burst on one second, as cron gives
				at := (now/int64(time.Second) + 1 + rng.Int64N(70)) * int64(time.Second)
				for range rng.IntN(300) {
					w.Schedule(uint32(rng.IntN(2000)), at)
				}
			case 1:
				w.Schedule(uint32(rng.IntN(2000)), now+rng.Int64N(5*int64(time.Second)))
			case 2:
				w.Cancel(uint32(rng.IntN(2000)))
			}
			lenAt, n := w.PeekLen()
			if allAt, all := w.Peek(math.MaxInt, nil); allAt != lenAt || n < len(all) {
				t.Fatalf("seed %d step %d: PeekLen = %d timers at %d, Peek = %d at %d", seed, step, n, lenAt, len(all), allAt)
			}
			at, got := w.Peek(1+rng.IntN(400), nil)
			if len(got) == 0 {
				now += rng.Int64N(300 * ms)
				w.Advance(now, 0, nil)
				continue
			}
			peeked++
			if at <= now {
				t.Fatalf("seed %d step %d: peeked a tick at %d, not after now %d", seed, step, at, now)
			}
			if early := w.Advance(at-1, 0, nil); len(early) > 0 {
				t.Fatalf("seed %d step %d: %d timers due before the peeked tick", seed, step, len(early))
			}
			out := w.Advance(at, len(got), nil)
			if !slices.Equal(out, got) {
				t.Fatalf("seed %d step %d: Advance delivered %v, Peek said %v", seed, step, out, got)
			}
			now = at
			w.Advance(now, 0, nil)
		}
		if peeked == 0 {
			t.Fatalf("seed %d: Peek never returned timers", seed)
		}
	}
}

func TestWheel_PeekBurst(t *testing.T) {
	base := 1_700_000_000_000 * ms
	w := newWheel(t, time.Millisecond, base+300*ms)
	at := base + 60*int64(time.Second)
	for i := range uint32(1000) {
		w.Schedule(i, at)
	}
	w.Cancel(7)
	got, gotAt := []Expired(nil), int64(0)
	if gotAt, got = w.Peek(10_000, nil); gotAt != at || len(got) != 999 {
		t.Fatalf("Peek = %d timers due at %d, want 999 at %d", len(got), gotAt, at)
	}
	if _, part := w.Peek(10, nil); !slices.Equal(part, got[:10]) {
		t.Fatalf("Peek(10) = %v, want the first ten %v", part, got[:10])
	}
	if w.Len() != 999 {
		t.Fatalf("Peek removed timers: %d left", w.Len())
	}
	// The cancelled timer is counted until its slot expires.
	if lenAt, n := w.PeekLen(); lenAt != at || n != 1000 {
		t.Fatalf("PeekLen = %d timers at %d, want 1000 at %d", n, lenAt, at)
	}
	// A timer on another tick in the same slot: the cascade may reorder
	// them, so Peek says nothing.
	w.Schedule(5000, at+1)
	if _, mixed := w.Peek(10, nil); len(mixed) != 0 {
		t.Fatalf("Peek of a mixed slot = %v, want nothing", mixed)
	}
	if lenAt, n := w.PeekLen(); lenAt != 0 || n != 0 {
		t.Fatalf("PeekLen of a mixed slot = %d timers at %d, want none", n, lenAt)
	}
	// Once due, the current tick's timers are not ahead.
	w.Cancel(5000)
	w.Advance(at, 1, nil)
	if _, due := w.Peek(10, nil); len(due) != 0 {
		t.Fatalf("Peek of a due tick = %v, want nothing", due)
	}
}

// TestWheel_PeekSaysNothingWhileTheCurrentTickIsDue: the timers of a
// later tick are not the next Advance's first while the current tick's
// are left (an Advance stopped at its limit), in the wheel's first block
// as in any.
func TestWheel_PeekSaysNothingWhileTheCurrentTickIsDue(t *testing.T) {
	base := 1_700_000_000_000 * ms
	w := newWheel(t, time.Millisecond, base)
	w.Schedule(1, base+ms)
	w.Schedule(2, base+ms)
	w.Schedule(3, base+int64(time.Second))
	if got := w.Advance(base+ms, 1, nil); len(got) != 1 {
		t.Fatalf("Advance with a limit of 1 delivered %v", got)
	}
	if at, got := w.Peek(10, nil); len(got) != 0 {
		t.Fatalf("Peek with a timer of the current tick left = %v at %d, want nothing", got, at)
	}
	if at, n := w.PeekLen(); n != 0 {
		t.Fatalf("PeekLen with a timer of the current tick left = %d at %d, want none", n, at)
	}
}

// The wheel's memory is a few large objects, not one per block: each heap
// object costs every garbage collection a mark and its span a sweep, and
// at ten million timers blocks one by one were 80 000 of them.
func TestWheel_BlocksComeInSlabs(t *testing.T) {
	w := newWheel(t, time.Millisecond, 0)
	const n = 1 << 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range uint32(n) {
		w.Schedule(i, int64(i%60_000)*ms) // spread over a minute, as a fleet's fires
	}
	runtime.ReadMemStats(&after)
	// Slots are partly filled: allow twice the blocks n timers fill.
	slabs, pages := 2*n/blockLen/slabLen, n/pageSize
	if got := after.Mallocs - before.Mallocs; got > uint64(slabs+pages+64) {
		t.Errorf("scheduling %d timers made %d heap objects; want at most %d slabs of blocks, %d pages of generations and a few slices",
			n, got, slabs, pages)
	}
}
