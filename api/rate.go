package api

import (
	"sync"
	"time"
)

// Fire rates are computed from samples of the engine's fire counter, taken
// every sampleInterval and kept for rateWindow: the rate is the fires since
// the oldest kept sample divided by the time since then.
const (
	sampleInterval = time.Second
	rateWindow     = 10 * time.Second
	// rateSamples holds a window's samples and one more, so that the oldest
	// kept sample is about rateWindow old.
	rateSamples = int(rateWindow/sampleInterval) + 1
)

type sample struct {
	at    time.Time // with its monotonic reading
	fires uint64
}

// rateSampler keeps the last rateSamples samples of a counter.
type rateSampler struct {
	mu      sync.Mutex // guards samples, next and n
	samples [rateSamples]sample
	next    int // where the next sample goes
	n       int // samples held
}

func (r *rateSampler) add(at time.Time, fires uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples[r.next] = sample{at, fires}
	r.next = (r.next + 1) % rateSamples
	r.n = min(r.n+1, rateSamples)
}

// rate returns the counter's rate per second between the oldest sample at
// most rateWindow (plus half an interval of slack) before the newest, and
// the newest; without a fresh sample, before now and (now, fires). It is 0
// without such a sample, or when the counter went back. Two samples are
// whole seconds apart, taken at the same point of the second: tasks fire
// in bursts at each second's start, and a window that ends now holds one
// burst more than its length about as often as not (a node of 525 tasks
// showed 543.6 fires/s).
func (r *rateSampler) rate(now time.Time, fires uint64) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n > 0 {
		if newest := r.samples[(r.next-1+rateSamples)%rateSamples]; now.Sub(newest.at) <= sampleInterval*3/2 {
			now, fires = newest.at, newest.fires
		}
	}
	for i := range r.n {
		// Oldest first.
		s := r.samples[(r.next-r.n+i+rateSamples)%rateSamples]
		age := now.Sub(s.at)
		if age > rateWindow+sampleInterval/2 {
			continue
		}
		if age <= 0 || fires < s.fires {
			return 0
		}
		return float64(fires-s.fires) / age.Seconds()
	}
	return 0
}
