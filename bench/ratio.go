package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
)

// Ratio compares one figure of shardcron with a baseline's, both measured
// in the same invocation.
type Ratio struct {
	// Figure names what is compared: fires_per_sec, lag_p99_ms,
	// cpu_us_per_fire, etcd_requests_per_fire or bytes_per_task.
	Figure string `json:"figure"`
	// Shardcron and Baseline are the scenarios the figures come from.
	Shardcron string `json:"shardcron"`
	Baseline  string `json:"baseline"`
	// ShardcronValue and BaselineValue are the figures themselves.
	ShardcronValue float64 `json:"shardcron_value"`
	BaselineValue  float64 `json:"baseline_value"`
	// Times is how many times better shardcron does: more than 1 is
	// better, whichever way the figure improves (more fires/s, less lag).
	Times float64 `json:"times"`
}

// Baselines are the scenarios shardcron is compared with.
var Baselines = []string{LockPerFire, Robfig, AfterFunc}

// Ratios compares shardcron's figures with each baseline's among results:
// fires/s, lag p99 and CPU per fire of throughput, etcd requests per fire
// against lock-per-fire, and bytes per task of memory against robfig's
// and afterfunc's. A ratio needs both results, with a figure above 0.
func Ratios(results []*Result) []Ratio {
	find := func(s string) *Result {
		for _, r := range results {
			if r.Scenario == s {
				return r
			}
		}
		return nil
	}
	var out []Ratio
	add := func(figure string, sc, b *Result, get func(*Result) float64, higherBetter bool) {
		if sc == nil || b == nil {
			return
		}
		x, y := get(sc), get(b)
		if x <= 0 || y <= 0 {
			return
		}
		times := y / x
		if higherBetter {
			times = x / y
		}
		out = append(out, Ratio{Figure: figure, Shardcron: sc.Scenario, Baseline: b.Scenario,
			ShardcronValue: sig(x, 4), BaselineValue: sig(y, 4), Times: sig(times, 4)})
	}
	tp, mem := find(Throughput), find(Memory)
	for _, name := range Baselines {
		b := find(name)
		add("fires_per_sec", tp, b, func(r *Result) float64 { return r.FiresPerSec }, true)
		add("lag_p99_ms", tp, b, func(r *Result) float64 { return r.LagP99Ms }, false)
		add("cpu_us_per_fire", tp, b, func(r *Result) float64 {
			if r.FiresPerSec <= 0 {
				return 0
			}
			return r.CPUCores * 1e6 / r.FiresPerSec
		}, false)
		if name == LockPerFire {
			add("etcd_requests_per_fire", tp, b, func(r *Result) float64 {
				if r.Fires == 0 {
					return 0
				}
				return float64(r.EtcdRequests) / float64(r.Fires)
			}, false)
		} else {
			add("bytes_per_task", mem, b, func(r *Result) float64 { return r.BytesPerTask }, false)
		}
	}
	return out
}

// WriteRatios prints the ratios as an aligned table.
func WriteRatios(w io.Writer, ratios []Ratio) {
	if len(ratios) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tshardcron\t\tbaseline\t\tshardcron better by\t")
	for _, r := range ratiosCells(ratios) {
		for _, c := range r {
			fmt.Fprint(tw, c, "\t")
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}

func ratiosCells(ratios []Ratio) [][]string {
	var rows [][]string
	for _, r := range ratios {
		rows = append(rows, []string{r.Figure, r.Shardcron, figure(r.ShardcronValue),
			r.Baseline, figure(r.BaselineValue), figure(r.Times) + "×"})
	}
	return rows
}

// sig keeps n significant digits of v: a ratio's figures span from
// thousandths (etcd requests per fire) to millions.
func sig(v float64, n int) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	p := math.Pow(10, float64(n)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}

// figure prints v without exponent: whole from 1000 up, else with up to
// four significant digits.
func figure(v float64) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.0f", v)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
