package bench

import (
	"context"
	"testing"
	"time"
)

// TestBaselineMeasure_HeapShrank: a heap smaller at the end than at the
// start (the garbage of an earlier scenario collected meanwhile) is no
// growth, not a uint64 wrapped round to 18 EB a task.
func TestBaselineMeasure_HeapShrank(t *testing.T) {
	cfg := Config{Scenario: Robfig, Tasks: 100, Duration: time.Second}.Defaults()
	b := newBaseline(cfg, cfg.Schedule, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := b.measure(ctx, Robfig, 1, liveHeap()+64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if r.BytesPerTask != 0 {
		t.Errorf("bytes_per_task %v after the heap shrank by 64 MiB: want 0", r.BytesPerTask)
	}
}

func TestHeapGrowth(t *testing.T) {
	for _, tc := range []struct {
		heap0, heap1 uint64
		tasks        int
		want         float64
	}{
		{1000, 3000, 10, 200},
		{3000, 1000, 10, 0},
		{1 << 40, 1, 1, 0},
		{5, 5, 1, 0},
	} {
		if got := heapGrowth(tc.heap0, tc.heap1, tc.tasks); got != tc.want {
			t.Errorf("heapGrowth(%d, %d, %d) = %v, want %v", tc.heap0, tc.heap1, tc.tasks, got, tc.want)
		}
	}
}
