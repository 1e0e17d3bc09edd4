package executor

import (
	"context"
	"testing"
)

func TestNoop_ZeroAllocs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := testFire()
	allocs := testing.AllocsPerRun(1000, func() {
		if err := Noop.Execute(ctx, f); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Noop.Execute allocates %v times per call, want 0", allocs)
	}
	cancel()
	if err := Noop.Execute(ctx, f); err != nil {
		t.Errorf("Noop.Execute with an ended ctx = %v, want nil", err)
	}
}

func BenchmarkNoop(b *testing.B) {
	ctx := context.Background()
	f := testFire()
	b.ReportAllocs()
	for b.Loop() {
		_ = Noop.Execute(ctx, f)
	}
}
