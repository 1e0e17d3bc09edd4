package engine

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/shardcron/shardcron/task"
)

// lagBounds are the upper bounds of the fire-lag histogram buckets: from
// 100µs up by a quarter each time to about two minutes, fine enough to
// read a p99 off within a quarter. (Buckets that grew by half read a
// burst whose last fire came at some 4.5 ms as 5.7 ms, its bucket's top.)
var lagBounds = func() (b [64]time.Duration) {
	d := float64(100 * time.Microsecond)
	for i := range b {
		b[i] = time.Duration(d)
		d *= 1.25
	}
	return b
}()

// stats are the engine's counters, updated with atomics on the fire path
// and read by Stats.
type stats struct {
	fires    atomic.Uint64 // fires dispatched (first attempts: scheduled and triggered)
	execs    [numStatus]atomic.Uint64
	lagCount [len(lagBounds) + 1]atomic.Uint64 // the last bucket is +Inf
	lagSum   atomic.Int64                      // nanoseconds
	misfires atomic.Uint64
	staged   atomic.Uint64 // fires released from a stage (stage.go)
	skipped  atomic.Uint64

	stageDrops [numStageDrops]atomic.Uint64 // ticks whose stage could not be used, by cause

	// Issue 9, part 6: misfires by the policy that handled them, and
	// failed writes to the partition cache.
	misfiresBy  [len(misfirePolicies)]atomic.Uint64
	cacheFailed atomic.Uint64

	// Runs past their release (elsewhere.go): those this node marked, and
	// those of other nodes (or of its own, released) its tasks count.
	runsMarked    atomic.Uint64
	runsElsewhere atomic.Int64
}

// misfirePolicies are the policies in the order stats.misfiresBy counts
// them.
var misfirePolicies = [...]task.MisfirePolicy{task.MisfireFireOnce, task.MisfireSkip, task.MisfireFireAll}

// misfire counts a misfire handled by policy p. Called from the dispatch
// loop.
func (s *stats) misfire(p task.MisfirePolicy) {
	s.misfires.Add(1)
	for k, q := range misfirePolicies {
		if q == p {
			s.misfiresBy[k].Add(1)
		}
	}
}

// tally is one worker's share of the counters, added to stats once per
// chunk of fires: atomics on shared counters for every fire would bounce
// their cache lines between the cores.
type tally struct {
	fires    uint64
	execs    [numStatus]uint64
	lagCount [len(lagBounds) + 1]uint64
	lagSum   int64
	bucket   int // the lag bucket of the last fire counted
	dirty    bool
}

// observeLag counts one fire taken lag nanoseconds after it was due (its
// scheduled time plus its jitter). The fires of a chunk were due together
// and mostly share a bucket, so the last fire's is tried first: a binary search's
// branches, unpredictable, were the worker's costliest step in a burst.
func (t *tally) observeLag(lag int64) {
	lag = max(lag, 0)
	d, i := time.Duration(lag), t.bucket
	if i < len(lagBounds) && d > lagBounds[i] || i > 0 && d <= lagBounds[i-1] {
		i, _ = slices.BinarySearch(lagBounds[:], d)
		t.bucket = i
	}
	t.lagCount[i]++
	t.lagSum += lag
	t.dirty = true
}

func (t *tally) exec(st uint8) { t.execs[st]++; t.dirty = true }

// flush adds the tally to s and clears it.
func (t *tally) flush(s *stats) {
	if !t.dirty {
		return
	}
	if t.fires > 0 {
		s.fires.Add(t.fires)
	}
	for i, n := range t.execs {
		if n > 0 {
			s.execs[i].Add(n)
		}
	}
	for i, n := range t.lagCount {
		if n > 0 {
			s.lagCount[i].Add(n)
		}
	}
	s.lagSum.Add(t.lagSum)
	*t = tally{}
}

// Histogram is a cumulative histogram in Prometheus's form.
type Histogram struct {
	Bounds []float64 // upper bounds in seconds, ascending
	Counts []uint64  // observations <= each bound (cumulative)
	Count  uint64
	Sum    float64 // seconds
}

// Quantile estimates the q-quantile (0 < q <= 1) of h in seconds,
// interpolating linearly within the bucket that holds it, as Prometheus's
// histogram_quantile does; past the last bound it answers the last bound.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return 0
	}
	rank := q * float64(h.Count)
	lower, below := 0.0, uint64(0)
	for i, c := range h.Counts {
		if float64(c) >= rank {
			in := float64(c - below)
			if in == 0 {
				return h.Bounds[i]
			}
			return lower + (h.Bounds[i]-lower)*(rank-float64(below))/in
		}
		lower, below = h.Bounds[i], c
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

// misfireLogEvery is how often, at most, a node's log says that it
// misfired.
const misfireLogEvery = time.Minute

// logMisfires warns, at most once every interval, of the misfires counted
// since its last warning (misfires reads the count). A node that falls
// behind its schedule (workers slower than its fires, a starved machine, a
// stall) leaves the fires it missed to their tasks' misfire policies, which
// fire_once and skip resolve by running fewer: without this line, only the
// metrics would say so. behind is how far the workers' dispatch point is
// from now.
func logMisfires(ctx context.Context, log *slog.Logger, every, threshold time.Duration, misfires func() uint64, behind func() time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	seen := misfires()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := misfires()
		if n == seen {
			continue
		}
		late := behind()
		why := "the node is behind its schedule: it needs more workers or more CPU, or fewer tasks"
		if late < threshold {
			// Times missed while nothing ran them, which a node that keeps
			// up cannot help.
			why = "the node keeps up with its schedule now, so the times were missed before: " +
				"while it was down or stalled, while their partition had no owner, or given already past (an @at time)"
		}
		log.Warn("fires came later than the misfire threshold, and their tasks' misfire policies decided which of the missed times run; "+why,
			"misfires", n-seen, "in", every, "threshold", threshold, "dispatch_behind", late.Round(time.Millisecond))
		seen = n
	}
}
