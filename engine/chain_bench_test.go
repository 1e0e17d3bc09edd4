package engine

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
)

// BenchmarkChainWriter measures the chain writer's rate: the triggers of
// a burst of ended fires, each chaining to one of 1 000 targets, written
// to an embedded etcd. A burst past the queue's bound (65 536 fires)
// between two of the writer's takes drops triggers.
func BenchmarkChainWriter(b *testing.B) {
	c := etcdtest.Start(b)
	reg, err := registry.OpenRegistry(context.Background(), c.Client, DefaultPrefix, 64)
	if err != nil {
		b.Fatal(err)
	}
	const targets = 1000
	for i := range targets {
		if _, err := reg.Put(context.Background(), handlerTask(fmt.Sprintf("target-%d", i), "0 0 0 1 1 *"), registry.PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	e := &Engine{reg: reg, log: slog.New(slog.DiscardHandler)}
	const burst = 2000
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	b.ResetTimer()
	for n := range b.N {
		fs := make([]chainFire, burst)
		for i := range fs {
			fs[i] = chainFire{from: "source", sched: at.Add(time.Duration(n*burst+i) * time.Millisecond).UnixNano(),
				targets: []string{fmt.Sprintf("target-%d", i%targets)}}
		}
		e.triggerChains(context.Background(), fs, &missingTargets{log: e.log, max: missingMax})
	}
	b.ReportMetric(float64(b.N*burst)/b.Elapsed().Seconds(), "triggers/s")
}
