package engine

import (
	"context"
	"testing"
)

// The partitions prepared from the cache share reads of etcd's revision;
// a cache synced past the last read is checked with a new one, and a
// member whose applied revision lags behind the cache is not taken at its
// word: the cluster's revision decides.
func TestRevisions_SharedReadsAndLaggingMembers(t *testing.T) {
	var applied, current int64
	var reads []string
	readApplied := func(context.Context) (int64, error) { reads = append(reads, "applied"); return applied, nil }
	readCurrent := func(context.Context) (int64, error) { reads = append(reads, "current"); return current, nil }
	r := newRevisions()
	for _, step := range []struct {
		name             string
		applied, current int64
		cached, want     int64
		wantReads        int // reads made by this step
		wantCurrentAsked bool
	}{
		{name: "first read", applied: 10, current: 10, cached: 5, want: 10, wantReads: 1},
		{name: "shared", applied: 99, current: 99, cached: 8, want: 10, wantReads: 0},
		{name: "cache past the last read", applied: 12, current: 12, cached: 12, want: 12, wantReads: 1},
		{name: "lagging member", applied: 13, current: 20, cached: 15, want: 20, wantReads: 2, wantCurrentAsked: true},
		{name: "ahead of etcd", applied: 21, current: 21, cached: 30, want: 21, wantReads: 2, wantCurrentAsked: true},
	} {
		applied, current, reads = step.applied, step.current, nil
		got, err := r.notAhead(context.Background(), step.cached, readApplied, readCurrent)
		if err != nil || got != step.want || len(reads) != step.wantReads {
			t.Errorf("%s: notAhead(%d) = %d, %v after reads %v; want %d after %d reads", step.name, step.cached, got, err, reads, step.want, step.wantReads)
		}
		if asked := len(reads) > 0 && reads[len(reads)-1] == "current"; asked != step.wantCurrentAsked {
			t.Errorf("%s: reads %v, want the cluster's revision asked: %v", step.name, reads, step.wantCurrentAsked)
		}
	}
}
