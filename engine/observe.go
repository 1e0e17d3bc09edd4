package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/membership"
)

// execBounds are the upper bounds of the execution-duration histogram:
// 1 ms doubling to about 9 minutes.
var execBounds = func() (b [20]time.Duration) {
	d := time.Millisecond
	for i := range b {
		b[i] = d
		d *= 2
	}
	return b
}()

// durations is a histogram of execution durations, safe for concurrent
// use. It is only fed by executors that do real work (not noop), whose
// own cost dwarfs its atomic adds.
type durations struct {
	counts [len(execBounds) + 1]atomic.Uint64 // the last bucket is +Inf
	sum    atomic.Int64                       // nanoseconds
}

func (h *durations) observe(d time.Duration) {
	i := len(execBounds)
	for j, b := range execBounds {
		if d <= b {
			i = j
			break
		}
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

func (h *durations) snapshot() Histogram {
	out := Histogram{Bounds: make([]float64, len(execBounds)), Counts: make([]uint64, len(execBounds))}
	var cum uint64
	for i, b := range execBounds {
		cum += h.counts[i].Load()
		out.Bounds[i], out.Counts[i] = b.Seconds(), cum
	}
	out.Count = cum + h.counts[len(execBounds)].Load()
	out.Sum = time.Duration(h.sum.Load()).Seconds()
	return out
}

// Hand-over phases, timed on the node that goes through them.
const (
	phasePrepare  = iota // acquire: reading the partition while its old owner still fires it
	phaseLockWait        // acquire: from prepared to holding the lock (the old owner's release)
	phaseTake            // acquire: from the lock to the partition armed: the gap in its fires
	phaseRelease         // release: from the mark to the committed checkpoint
	numPhases
)

var phaseNames = [numPhases]string{"prepare", "lock_wait", "take", "release"}

// timed runs an executor and observes how long each execution took.
type timed struct {
	executor.Executor
	h *durations
}

func (t timed) Execute(ctx context.Context, f *executor.Fire) error {
	start := time.Now()
	defer func() { t.h.observe(time.Since(start)) }() // a panic is recovered by the worker; it took this long too
	return t.Executor.Execute(ctx, f)
}

// fences counts the sessions of this node that ended fenced.
type fences struct {
	n    atomic.Uint64
	last atomic.Pointer[membership.Session] // the last session counted
}

// note counts s once, however often it is seen fenced: the dispatch loop
// and the workers check before every batch, and a fenced session stays
// fenced until the node rejoins with a new one.
func (f *fences) note(s *membership.Session) {
	old := f.last.Load()
	if old != s && f.last.CompareAndSwap(old, s) {
		f.n.Add(1)
	}
}
