package engine

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkWatermarkValue measures the watermark values a node writes
// while it arms n partitions, each armed up to a revision of its own (an
// etcd of tens of millions of revisions): changed is how many of them
// moved since the last value that carried them all, the base; changed=n
// is a value that carries them all, as a session's first write, one a
// minute, and one where more than a quarter moved do. One op is one value
// built as the writer builds it. Reported: bytes/value.
//
//	go test ./engine -run '^$' -bench WatermarkValue
func BenchmarkWatermarkValue(b *testing.B) {
	for _, n := range []int{1024} {
		for _, changed := range []int{0, 16, n} {
			b.Run(fmt.Sprintf("partitions=%d/changed=%d", n, changed), func(b *testing.B) { benchWatermarkValue(b, n, changed) })
		}
	}
}

func benchWatermarkValue(b *testing.B, n, changed int) {
	w := time.Date(2026, 12, 6, 20, 0, 0, 123456789, time.UTC).UnixNano()
	a := appliedRevs{armed: map[int]int64{}}
	for p := range n {
		a.armed[p] = 31_000_000 + int64(p)*1_009
	}
	if changed < n {
		a.value(w, nil, nil, "s")
		a.wrote(31_000_000+int64(n)*1_009, nil)
		for i := range changed {
			a.armed[i*(n/changed)] += 977
		}
	}
	b.ReportAllocs()
	var size int
	b.ResetTimer()
	for range b.N {
		v, _ := a.value(w, nil, nil, "s")
		size = len(v)
	}
	b.ReportMetric(float64(size), "bytes/value")
}
