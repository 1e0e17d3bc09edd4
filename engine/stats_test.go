package engine

import (
	"math"
	"testing"
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
