package ring

import (
	"fmt"
	"testing"

	"github.com/buraksezer/consistent"
)

// BenchmarkRebuild measures building an assignment: what every node pays on
// each membership change.
func BenchmarkRebuild(b *testing.B) {
	for _, c := range []struct{ p, n int }{{1024, 3}, {1024, 10}, {4096, 100}} {
		b.Run(fmt.Sprintf("p=%d/members=%d", c.p, c.n), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Partitions = c.p
			members := names(c.n)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewAssignment(cfg, members); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOwner compares a lookup on the published snapshot (Ring.Owner:
// an atomic load and two slice indexes) with consistent's own
// GetPartitionOwner (a read lock per call), both from all Ps at once.
func BenchmarkOwner(b *testing.B) {
	cfg := DefaultConfig()
	members := names(10)

	b.Run("impl=snapshot", func(b *testing.B) {
		r, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.Update(members); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			p := 0
			for pb.Next() {
				if _, ok := r.Owner(p); !ok {
					b.Error("no owner")
					return
				}
				p = (p + 1) & (DefaultPartitions - 1)
			}
		})
	})

	b.Run("impl=consistent", func(b *testing.B) {
		ms := make([]consistent.Member, len(members))
		for i, m := range members {
			ms[i] = member{key: m + memberKeySep, idx: uint16(i)}
		}
		c := consistent.New(ms, consistent.Config{
			Hasher: hasher{}, PartitionCount: cfg.Partitions,
			ReplicationFactor: cfg.ReplicationFactor, Load: cfg.Load,
		})
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			p := 0
			for pb.Next() {
				if c.GetPartitionOwner(p) == nil {
					b.Error("no owner")
					return
				}
				p = (p + 1) & (DefaultPartitions - 1)
			}
		})
	})
}

// BenchmarkPartition hashes a 16-byte task id.
func BenchmarkPartition(b *testing.B) {
	id := "0123456789abcdef"
	b.ReportAllocs()
	var sink int
	for b.Loop() {
		sink += Partition(id, DefaultPartitions)
	}
	_ = sink
}
