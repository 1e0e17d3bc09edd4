package engine

import (
	"sync/atomic"
	"time"
)

// lagBounds are the upper bounds of the fire-lag histogram buckets.
var lagBounds = [...]time.Duration{
	500 * time.Microsecond, time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2500 * time.Millisecond,
	5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute,
}

// stats are the engine's counters, updated with atomics on the fire path
// and read by Stats.
type stats struct {
	fires    atomic.Uint64 // fires dispatched (first attempts: scheduled and triggered)
	execs    [numStatus]atomic.Uint64
	lagCount [len(lagBounds) + 1]atomic.Uint64 // the last bucket is +Inf
	lagSum   atomic.Int64                       // nanoseconds
	misfires atomic.Uint64
	skipped  atomic.Uint64
}

// observeLag counts one fire taken lag nanoseconds after the wheel
// released it.
func (s *stats) observeLag(lag int64) {
	lag = max(lag, 0)
	i := 0
	for i < len(lagBounds) && lag > int64(lagBounds[i]) {
		i++
	}
	s.lagCount[i].Add(1)
	s.lagSum.Add(lag)
}

// Histogram is a cumulative histogram in Prometheus's form.
type Histogram struct {
	Bounds []float64 // upper bounds in seconds, ascending
	Counts []uint64  // observations <= each bound (cumulative)
	Count  uint64
	Sum    float64 // seconds
}

// Quantile estimates the q-quantile (0 < q <= 1) as the upper bound of
// the bucket that holds it.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 {
		return 0
	}
	rank := uint64(q * float64(h.Count))
	for i, c := range h.Counts {
		if c >= rank {
			return h.Bounds[i]
		}
	}
	return h.Bounds[len(h.Bounds)-1]
}

func (s *stats) lag() Histogram {
	h := Histogram{Bounds: make([]float64, len(lagBounds)), Counts: make([]uint64, len(lagBounds))}
	var cum uint64
	for i, b := range lagBounds {
		cum += s.lagCount[i].Load()
		h.Bounds[i] = b.Seconds()
		h.Counts[i] = cum
	}
	h.Count = cum + s.lagCount[len(lagBounds)].Load()
	h.Sum = time.Duration(s.lagSum.Load()).Seconds()
	return h
}
