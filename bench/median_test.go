package bench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	rs := []*Result{
		{Scenario: Throughput, FiresPerSec: 300, LagP99Ms: 9, Missed: 0, Note: "first"},
		{Scenario: Throughput, FiresPerSec: 100, LagP99Ms: 7, Missed: 4},
		{Scenario: Throughput, FiresPerSec: 200, LagP99Ms: 8, Missed: 0, LagSeries: []SeriesPoint{{T: 1}}},
	}
	m := median(rs)
	if m.FiresPerSec != 200 || m.LagP99Ms != 8 || m.Missed != 0 || m.Runs != 3 {
		t.Errorf("median: fires/s %v, p99 %v, missed %v, runs %d; want 200, 8, 0, 3", m.FiresPerSec, m.LagP99Ms, m.Missed, m.Runs)
	}
	if len(m.LagSeries) != 1 {
		t.Errorf("charts: want those of the run with the median p99")
	}
	if !strings.Contains(m.Note, "missed by run 0, 4, 0") || !strings.Contains(m.Note, "first") {
		t.Errorf("note %q: want the missed fires run by run and the first run's note", m.Note)
	}
	if rs[1].FiresPerSec != 100 {
		t.Errorf("median changed its input")
	}
	// Even counts take the lower middle: a figure some run measured.
	if m := median(rs[:2]); m.FiresPerSec != 100 {
		t.Errorf("median of 300 and 100 = %v, want 100", m.FiresPerSec)
	}
}

// TestMedian_Events: the figures of rebalance's later events are medians
// too, not the run with the median lag's.
func TestMedian_Events(t *testing.T) {
	rs := []*Result{
		{Scenario: Rebalance, LagP99Ms: 9, Rejoin: Event{HandoffP99Ms: 100, Duplicates: 2}},
		{Scenario: Rebalance, LagP99Ms: 7, Rejoin: Event{HandoffP99Ms: 200}},
		{Scenario: Rebalance, LagP99Ms: 8, Rejoin: Event{HandoffP99Ms: 300}, Leave: Event{ReadyMs: 5}},
	}
	m := median(rs)
	if m.Rejoin.HandoffP99Ms != 200 || m.Leave.ReadyMs != 0 {
		t.Errorf("rejoin hand-over p99 %v, leave ready %v; want the medians 200 and 0", m.Rejoin.HandoffP99Ms, m.Leave.ReadyMs)
	}
	if !strings.Contains(m.Note, "rejoin duplicates by run 2, 0, 0") {
		t.Errorf("note %q: want the rejoin's duplicates run by run", m.Note)
	}
}

func TestRatios(t *testing.T) {
	rs := []*Result{
		{Scenario: Throughput, Fires: 1000, FiresPerSec: 100_000, LagP99Ms: 10, CPUCores: 0.1, EtcdRequests: 10},
		{Scenario: Memory, BytesPerTask: 150},
		{Scenario: LockPerFire, Fires: 50, FiresPerSec: 50, LagP99Ms: 2000, CPUCores: 1, EtcdRequests: 5000},
		{Scenario: Robfig, FiresPerSec: 100_000, LagP99Ms: 5, CPUCores: 0.2, BytesPerTask: 300},
	}
	got := map[string]float64{}
	for _, r := range Ratios(rs) {
		got[r.Baseline+" "+r.Figure] = r.Times
	}
	for k, want := range map[string]float64{
		"lock-per-fire fires_per_sec":          2000,
		"lock-per-fire lag_p99_ms":             200,
		"lock-per-fire cpu_us_per_fire":        20000,
		"lock-per-fire etcd_requests_per_fire": 10_000,
		"robfig fires_per_sec":                 1,
		"robfig lag_p99_ms":                    0.5,
		"robfig bytes_per_task":                2,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	if _, ok := got["afterfunc fires_per_sec"]; ok {
		t.Errorf("a ratio against afterfunc, which did not run")
	}
	for _, r := range Ratios(rs) {
		if r.Figure == "etcd_requests_per_fire" && r.ShardcronValue != 0.01 {
			t.Errorf("shardcron's etcd requests per fire %v, want 0.01 (small figures keep their digits)", r.ShardcronValue)
		}
	}
	if len(Ratios(rs[2:])) != 0 {
		t.Errorf("ratios without shardcron's throughput")
	}
}

// TestRun_ListInTurns runs two scenarios twice each in one call: one
// median Result each, in the order given, and ratios between them.
func TestRun_ListInTurns(t *testing.T) {
	cfg := small(Throughput)
	cfg.Scenario, cfg.Runs = Throughput+","+Robfig, 2
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Scenario != Throughput || rs[1].Scenario != Robfig {
		t.Fatalf("got %d results, want throughput then robfig", len(rs))
	}
	for _, r := range rs {
		if r.Runs != 2 {
			t.Errorf("%s: runs %d, want 2", r.Scenario, r.Runs)
		}
		checkConsistent(t, scenarioConfig(cfg, r.Scenario, true), r)
	}
	var figures []string
	for _, r := range Ratios(rs) {
		if r.Shardcron != Throughput || r.Baseline != Robfig || r.Times <= 0 {
			t.Errorf("ratio %+v: want throughput against robfig, > 0", r)
		}
		figures = append(figures, r.Figure)
	}
	if !slices.Contains(figures, "fires_per_sec") {
		t.Errorf("ratios %v: want fires_per_sec", figures)
	}
}
