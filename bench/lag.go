package bench

import (
	"math"
	"sync/atomic"
	"time"
)

// lagBuckets are the upper bounds of a lagHist's buckets: 10 µs up by 15 %
// each to about ten minutes, so a quantile is off by at most 15 %.
var lagBuckets = func() []int64 {
	var b []int64
	for d := float64(10 * time.Microsecond); d < float64(10*time.Minute); d *= 1.15 {
		b = append(b, int64(d))
	}
	return b
}()

// lagHist is a histogram of lags, safe for concurrent use.
type lagHist struct {
	counts []atomic.Uint64 // len(lagBuckets)+1; the last is +Inf
	max    atomic.Int64
	n      atomic.Uint64
}

func newLagHist() *lagHist { return &lagHist{counts: make([]atomic.Uint64, len(lagBuckets)+1)} }

// bucketOf returns the index of the bucket that holds lag (ns).
func bucketOf(lag int64) int {
	if lag <= lagBuckets[0] {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(lag)/float64(lagBuckets[0])) / math.Log(1.15)))
	// The float estimate may be one off either way.
	for i > 0 && i <= len(lagBuckets) && lagBuckets[i-1] >= lag {
		i--
	}
	for i < len(lagBuckets) && lagBuckets[i] < lag {
		i++
	}
	return i
}

func (h *lagHist) observe(lag int64) {
	lag = max(lag, 0)
	h.counts[bucketOf(lag)].Add(1)
	h.n.Add(1)
	for {
		m := h.max.Load()
		if lag <= m || h.max.CompareAndSwap(m, lag) {
			return
		}
	}
}

// add merges o into h.
func (h *lagHist) add(o *lagHist) {
	for i := range o.counts {
		h.counts[i].Add(o.counts[i].Load())
	}
	h.n.Add(o.n.Load())
	if m := o.max.Load(); m > h.max.Load() {
		h.max.Store(m)
	}
}

// quantileMs returns the upper bound of the bucket holding the q-quantile,
// in milliseconds, capped by the maximum seen; 0 when empty.
func (h *lagHist) quantileMs(q float64) float64 {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	var cum uint64
	for i := range h.counts {
		cum += h.counts[i].Load()
		if cum >= rank {
			if i < len(lagBuckets) {
				return ms(min(lagBuckets[i], h.max.Load()))
			}
			break
		}
	}
	return h.maxMs()
}

func (h *lagHist) maxMs() float64 { return ms(h.max.Load()) }

// buckets returns the non-empty span of the distribution.
func (h *lagHist) buckets() []Bucket {
	var out []Bucket
	lo, hi := -1, -1
	for i := range h.counts {
		if h.counts[i].Load() > 0 {
			if lo < 0 {
				lo = i
			}
			hi = i
		}
	}
	if lo < 0 {
		return nil
	}
	for i := lo; i <= hi; i++ {
		upper := h.maxMs()
		if i < len(lagBuckets) {
			upper = ms(lagBuckets[i])
		}
		out = append(out, Bucket{UpperMs: upper, Count: h.counts[i].Load()})
	}
	return out
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }
