package timerwheel

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkScheduleExpire schedules n timers spread over one minute, in
// random order, then expires all of them in order. One op is the whole
// round; ns/timer is the figure to compare.
//
// wheel and heap run on simulated time. afterfunc cannot: its minute is
// compressed into afterfuncWindow of real time, which its figure includes.
func BenchmarkScheduleExpire(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000, 10_000_000} {
		for _, impl := range []string{"wheel", "heap", "afterfunc"} {
			if n == 10_000_000 && impl == "afterfunc" {
				continue
			}
			b.Run(fmt.Sprintf("n=%d/impl=%s", n, impl), func(b *testing.B) {
				offsets := spread(n, time.Minute)
				switch impl {
				case "wheel":
					benchWheel(b, offsets)
				case "heap":
					benchHeap(b, offsets)
				case "afterfunc":
					benchAfterFunc(b, offsets)
				}
			})
		}
	}
}

// spread returns n offsets evenly covering d, shuffled.
func spread(n int, d time.Duration) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i) * int64(d) / int64(n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func reportPerTimer(b *testing.B, n int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/timer")
}

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func benchWheel(b *testing.B, offsets []int64) {
	n := len(offsets)
	before := heapInUse()
	w, _ := New(time.Millisecond, 0)
	buf := make([]Expired, 0, 4096)
	round := func(base int64) int {
		for i, off := range offsets {
			w.Schedule(uint32(i), base+off)
		}
		got := 0
		for {
			d, ok := w.NextDeadline()
			if !ok {
				return got
			}
			for {
				buf = w.Advance(d, cap(buf), buf[:0])
				got += len(buf)
				if len(buf) < cap(buf) {
					break
				}
			}
		}
	}
	// Warm up: the wheel allocates pages and blocks on first use, until
	// it has as many as the peak of a round.
	benchRounds(b, n, before, 3, round)
}

type heapItem struct {
	at int64
	id uint32
}

type timerHeap []heapItem

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(heapItem)) }
func (h *timerHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

func benchHeap(b *testing.B, offsets []int64) {
	n := len(offsets)
	before := heapInUse()
	h := make(timerHeap, 0, n)
	round := func(base int64) int {
		for i, off := range offsets {
			heap.Push(&h, heapItem{at: base + off, id: uint32(i)})
		}
		got := 0
		for h.Len() > 0 {
			heap.Pop(&h)
			got++
		}
		return got
	}
	benchRounds(b, n, before, 1, round)
}

// benchRounds is the measurement of benchWheel and benchHeap, shared so
// that their figures compare: round schedules and expires all n timers
// from base and returns how many expired; one op is one round. The warmup
// rounds run first, so that B/timer, the heap in use then above before,
// is what the structure keeps at its peak rather than its growth.
func benchRounds(b *testing.B, n int, before uint64, warmup int, round func(base int64) int) {
	base := int64(time.Hour)
	for range warmup {
		base += int64(2 * time.Minute)
		round(base)
	}
	perTimer := float64(heapInUse()-before) / float64(n)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		base += int64(2 * time.Minute)
		if got := round(base); got != n {
			b.Fatalf("expired %d of %d", got, n)
		}
	}
	reportPerTimer(b, n)
	b.ReportMetric(perTimer, "B/timer")
}

const afterfuncWindow = 10 * time.Millisecond

func benchAfterFunc(b *testing.B, offsets []int64) {
	n := len(offsets)
	scale := int64(time.Minute / afterfuncWindow)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var fired atomic.Int64
		var wg sync.WaitGroup
		wg.Add(n)
		fire := func() {
			fired.Add(1)
			wg.Done()
		}
		for _, off := range offsets {
			time.AfterFunc(time.Duration(off/scale), fire)
		}
		wg.Wait()
		if got := fired.Load(); got != int64(n) {
			b.Fatalf("fired %d of %d", got, n)
		}
	}
	reportPerTimer(b, n)
}

// BenchmarkCascade reports, as cascade-ns, the one Advance that moves a
// level-2 slot of n timers down a level: the longest a tick can stall on a
// cascade. same puts every timer on one tick, as cron does at second
// boundaries (the slot is spliced whole); spread puts them on distinct ticks
// (walked one by one). An op is the whole round, setup included, so that
// the framework does not run the cheap splice millions of times.
func BenchmarkCascade(b *testing.B) {
	for _, n := range []int{1_000_000} {
		for _, layout := range []string{"same", "spread"} {
			b.Run(fmt.Sprintf("n=%d/layout=%s", n, layout), func(b *testing.B) {
				const slot = 1 << 14 // ticks covered by one level-2 slot
				w, _ := New(time.Millisecond, 0)
				base := int64(0)
				var stall time.Duration
				b.ReportAllocs()
				for range b.N {
					base += 4 * slot
					boundary := base + 2*slot // in ticks
					for i := range n {
						at := boundary + 100 // one lower slot: spliced
						if layout == "spread" {
							at = boundary + 1 + int64(i%(slot-1)) // walked
						}
						w.Schedule(uint32(i), at*ms)
					}
					w.Advance((boundary-1)*ms, 0, nil)
					start := time.Now()
					if got := w.Advance(boundary*ms, 0, nil); len(got) != 0 { // the cascade alone
						b.Fatal("early")
					}
					stall += time.Since(start)
					for w.Len() > 0 {
						w.Advance((boundary+slot)*ms, 0, nil)
					}
				}
				b.ReportMetric(float64(stall.Nanoseconds())/float64(b.N), "cascade-ns")
			})
		}
	}
}
