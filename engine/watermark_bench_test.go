package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkWatermarkValue measures the watermark values a node writes
// while it arms n partitions, each armed up to a revision of its own (an
// etcd of tens of millions of revisions): changed is how many of them
// moved since the last value that carried them all, the base; changed=n
// is a value that carries them all, as a session's first write, one a
// minute, and one where more than a quarter moved do. retries is how
// many retries wait in the wheel, in as many partitions, as the loop
// publishes them (retryMarks): retries of plain fires, without an
// override; fresh of them came since the base (a value carries those
// of their partitions). One op is one value built as the writer builds
// it. Reported: bytes/value.
//
//	go test ./engine -run '^$' -bench WatermarkValue
func BenchmarkWatermarkValue(b *testing.B) {
	for _, n := range []int{1024} {
		for _, changed := range []int{0, 16, n} {
			for _, retries := range []int{0, 100, 1000} {
				for _, fresh := range []int{0, 1} {
					if fresh > 0 && (retries == 0 || changed == n) {
						continue // no retries, or all of them
					}
					b.Run(fmt.Sprintf("partitions=%d/changed=%d/retries=%d/fresh=%d", n, changed, retries, fresh), func(b *testing.B) {
						benchWatermarkValue(b, n, changed, retries, fresh)
					})
				}
			}
		}
	}
}

func benchWatermarkValue(b *testing.B, n, changed, retries, fresh int) {
	w := time.Date(2026, 12, 6, 20, 0, 0, 123456789, time.UTC).UnixNano()
	a := appliedRevs{armed: map[int]int64{}}
	for p := range n {
		a.armed[p] = 31_000_000 + int64(p)*1_009
	}
	waiting := map[int]waitingRetries{}
	for i := range retries {
		p := i * n / retries
		at := time.Unix(0, w).Add(-time.Duration(i%60) * time.Second).Truncate(time.Second)
		f := pendingFire{ID: fmt.Sprintf("task-%06d", i), At: at, Attempt: 2, Due: time.Unix(0, w+int64(i)*7_919_993)}
		waiting[p] = waitingRetries{Applied: a.armed[p], Fires: []pendingFire{f}, through: w - int64(i)*1_000_003, sizes: make([]int, 1)}
	}
	var marks retryMarks
	marks.publish(waiting)
	lists := carriedLists{retries: marks.carried()}
	if changed < n {
		a.value(w, nil, lists, "s")
		a.wrote(31_000_000+int64(n)*1_009, lists)
		for i := range changed {
			a.armed[i*(n/changed)] += 977
		}
		for i := range fresh {
			f := waiting[i]
			f.Fires = append(slices.Clip(f.Fires), pendingFire{ID: fmt.Sprintf("fresh-%06d", i), At: f.Fires[0].At, Attempt: 2, Due: f.Fires[0].Due})
			f.sizes, f.through = make([]int, len(f.Fires)), w
			marks.publish(map[int]waitingRetries{i: f})
		}
		lists = carriedLists{retries: marks.carried()}
	}
	b.ReportAllocs()
	var size int
	b.ResetTimer()
	for range b.N {
		v, _ := a.value(w, nil, lists, "s")
		size = len(v)
	}
	b.ReportMetric(float64(size), "bytes/value")
}
