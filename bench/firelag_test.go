package bench

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/ring"
)

// The burst's lag with node processes is read off their fire-lag
// histograms, before and after: only the fires in between count.
func TestLagSince_NodeHistograms(t *testing.T) {
	scrape := func(counts ...uint64) engine.Histogram {
		t.Helper()
		var b strings.Builder
		b.WriteString("# TYPE shardcron_fire_lag_seconds histogram\n")
		for i, le := range []string{"0.001", "0.002", "0.004", "0.008"} {
			b.WriteString(`shardcron_fire_lag_seconds_bucket{le="` + le + `"} ` + itoa(counts[i]) + "\n")
		}
		b.WriteString(`shardcron_fire_lag_seconds_bucket{le="+Inf"} ` + itoa(counts[4]) + "\n")
		b.WriteString("shardcron_fire_lag_seconds_sum 0.5\nshardcron_fire_lag_seconds_count " + itoa(counts[4]) + "\n")
		b.WriteString("shardcron_fires_total 77\n")
		h, err := parseLag(strings.NewReader(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	// Two nodes: 10 old fires each, then 100 new ones between them, 99
	// taken within 2 ms and one within 8 ms.
	// The second node had fired 1 234 567 times before.
	const m = 1_234_567
	before := []engine.Histogram{scrape(10, 10, 10, 10, 10), scrape(m-5, m, m, m, m)}
	after := []engine.Histogram{scrape(40, 69, 69, 69, 69), scrape(m+15, m+40, m+40, m+41, m+41)}
	h, err := lagSince(before, after)
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != 100 || !slices.Equal(h.Counts, []uint64{50, 99, 99, 100}) {
		t.Fatalf("burst histogram %v of %d, want [50 99 99 100] of 100", h.Counts, h.Count)
	}
	if p50 := h.Quantile(0.5) * 1000; math.Abs(p50-1) > 1e-9 {
		t.Errorf("p50 %v ms, want 1", p50)
	}
	if p99 := h.Quantile(0.99) * 1000; math.Abs(p99-2) > 1e-9 {
		t.Errorf("p99 %v ms, want 2", p99)
	}
	if m := maxMs(h); m != 8 {
		t.Errorf("max %v ms, want the last non-empty bucket's bound, 8", m)
	}
	want := []Bucket{{1, 50}, {2, 49}, {4, 0}, {8, 1}}
	if got := histBuckets(h); !slices.Equal(got, want) {
		t.Errorf("distribution %v, want %v", got, want)
	}
	if _, err := lagSince(after, before); err == nil {
		t.Error("histograms that went back were taken")
	}
	if _, err := parseLag(strings.NewReader("shardcron_fires_total 77\n")); err == nil {
		t.Error("metrics without the histogram were taken")
	}
}

// itoa writes a count as Prometheus' text format does: as a float, so
// that a million is 1e+06.
func itoa(v uint64) string { return strconv.FormatFloat(float64(v), 'g', -1, 64) }

// A burst, and a throughput run through node processes, probe 64
// partitions, not all: each probe fire costs far more than the noop fires
// around it (an HTTP request through a process, a handler call
// in-process), and 1 024 within each second outweighed them. Elsewhere
// every partition keeps its probe: a hand-over times each partition.
func TestProbeSlots_BurstThroughProcesses(t *testing.T) {
	for _, c := range []Config{{Scenario: Burst, Procs: true}, {Scenario: Burst}, {Scenario: Throughput, Procs: true}} {
		c.Partitions = 1024
		if p := probedPartitions(c); p != 64 {
			t.Fatalf("%s (procs %v) probes %d partitions, want 64", c.Scenario, c.Procs, p)
		}
	}
	for _, c := range []Config{{Scenario: Throughput, Partitions: 1024}, {Scenario: Rebalance, Procs: true, Partitions: 1024}} {
		if p := probedPartitions(c); p != 1024 {
			t.Errorf("%s (procs %v) probes %d partitions, want all 1024", c.Scenario, c.Procs, p)
		}
	}
	slot := probeSlots(20_000, 1024, 64)
	per := map[int]int{}
	for i, s := range slot {
		if s >= 0 {
			per[ring.Partition(taskID(i), 1024)]++
		}
	}
	if len(per) != 64 {
		t.Errorf("probes in %d partitions, want 64", len(per))
	}
	for p, n := range per {
		if p >= 64 || n != 1 {
			t.Errorf("partition %d has %d probes, want one in each partition below 64", p, n)
		}
	}
}
