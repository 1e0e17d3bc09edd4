package engine

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/logbuf"
)

func TestHistogram_Quantile(t *testing.T) {
	h := Histogram{Bounds: []float64{0.1, 0.2, 0.4}, Counts: []uint64{50, 90, 100}, Count: 100}
	for _, tt := range []struct{ q, want float64 }{{0.5, 0.1}, {0.25, 0.05}, {0.7, 0.15}, {0.95, 0.3}, {1, 0.4}} {
		if got := h.Quantile(tt.q); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if got := (Histogram{}).Quantile(0.99); got != 0 {
		t.Errorf("empty histogram: %v", got)
	}
}

// A worker's tally counts each lag in the bucket a search of the bounds
// finds, whatever bucket its last fire fell in: on bounds, between them,
// past the last, in runs and in jumps either way.
func TestTally_LagBuckets(t *testing.T) {
	var lags []int64
	for i, b := range lagBounds {
		lags = append(lags, int64(b), int64(b)+1, int64(b)-1, int64(lagBounds[len(lagBounds)-1-i]))
	}
	lags = append(lags, 0, -5, int64(lagBounds[len(lagBounds)-1])*2, 1, 1, 1, math.MaxInt64)
	var tl tally
	var want [len(lagBounds) + 1]uint64
	for _, lag := range lags {
		tl.observeLag(lag)
		i, _ := slices.BinarySearch(lagBounds[:], time.Duration(max(lag, 0)))
		want[i]++
		if tl.lagCount != want {
			t.Fatalf("after a lag of %v the buckets are %v, want %v", time.Duration(lag), tl.lagCount, want)
		}
	}
}

// A node that misfires says so in its log, once an interval at most, with
// the count since its last line; an interval without misfires is silent.
func TestLogMisfires_OnceAnIntervalWithTheCount(t *testing.T) {
	for _, tc := range []struct {
		behind time.Duration
		why    string
	}{
		{7 * time.Second, "the node is behind its schedule"},
		// Caught up: the times were missed before (downtime, a past @at
		// time), which more workers would not help.
		{time.Second, "the node keeps up with its schedule now"},
	} {
		var (
			buf      logbuf.Buffer
			misfires atomic.Uint64
		)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			logMisfires(ctx, slog.New(slog.NewTextHandler(&buf, nil)), 20*time.Millisecond, 5*time.Second,
				misfires.Load, func() time.Duration { return tc.behind })
		}()
		time.Sleep(100 * time.Millisecond) // quiet intervals
		misfires.Add(3)
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(buf.String(), "misfires=3") && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // more quiet intervals
		cancel()
		<-done
		out := buf.String()
		if n := strings.Count(out, "level=WARN"); n != 1 || !strings.Contains(out, "misfires=3") ||
			!strings.Contains(out, "dispatch_behind="+tc.behind.String()) || !strings.Contains(out, tc.why) {
			t.Errorf("want one warning of 3 misfires, %v behind, saying %q; got %d lines:\n%s", tc.behind, tc.why, n, out)
		}
	}
}
