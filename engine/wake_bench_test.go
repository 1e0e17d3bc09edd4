package engine

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkWake measures how late the loop would start a staged tick:
// woken by a Go timer set for the tick (timer), or by one set wakeEarly
// before it and then sleepPrecise for the rest (early+sleep), as
// awaitStage does. One op is one wait for an instant 5 to 6 ms ahead;
// reported: the lateness at p50 and p99, in µs.
func BenchmarkWake(b *testing.B) {
	for _, tc := range []struct {
		name  string
		early time.Duration
	}{{"timer", 0}, {"early+sleep", wakeEarly}} {
		b.Run(tc.name, func(b *testing.B) {
			late := make([]time.Duration, 0, b.N)
			t := time.NewTimer(time.Hour)
			defer t.Stop()
			for i := 0; b.Loop(); i++ {
				at := time.Now().Add(5*time.Millisecond + time.Duration(i*37%1000)*time.Microsecond)
				t.Reset(time.Until(at) - tc.early)
				<-t.C
				if d := time.Until(at); tc.early > 0 && d > 0 {
					sleepPrecise(d)
				}
				late = append(late, time.Since(at))
			}
			slices.Sort(late)
			b.ReportMetric(float64(late[len(late)/2].Microseconds()), "p50-late-µs")
			b.ReportMetric(float64(late[len(late)*99/100].Microseconds()), "p99-late-µs")
		})
	}
}
