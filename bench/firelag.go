package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/shardcron/shardcron/engine"
)

// lagMetric is the nodes' fire-lag histogram in /metrics.
const lagMetric = "shardcron_fire_lag_seconds"

// fireLag returns the node's fire-lag histogram: from each fire's due time
// to a worker taking it, every fire since the node started.
func (n *node) fireLag(ctx context.Context) (engine.Histogram, error) {
	if n.proc == nil {
		return n.eng.Stats().FireLag, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.proc.url+"/metrics", nil)
	if err != nil {
		return engine.Histogram{}, err
	}
	resp, err := n.proc.http.Do(req)
	if err != nil {
		return engine.Histogram{}, fmt.Errorf("bench: scrape %s: %w", n.proc.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return engine.Histogram{}, fmt.Errorf("bench: scrape %s: %s", n.proc.url, resp.Status)
	}
	return parseLag(resp.Body)
}

// parseLag reads the fire-lag histogram out of Prometheus' text format:
// its cumulative buckets by upper bound, and its count.
func parseLag(r io.Reader) (engine.Histogram, error) {
	var h engine.Histogram
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 || !strings.HasPrefix(line, lagMetric+"_") {
			continue
		}
		// Counts are written as floats: a million is 1e+06.
		f, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil || f < 0 {
			continue
		}
		v := uint64(f)
		name := line[:sp]
		if name == lagMetric+"_count" {
			h.Count = v
			continue
		}
		le, ok := strings.CutPrefix(name, lagMetric+`_bucket{le="`)
		le, ok2 := strings.CutSuffix(le, `"}`)
		if !ok || !ok2 || le == "+Inf" {
			continue
		}
		b, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		h.Bounds, h.Counts = append(h.Bounds, b), append(h.Counts, v)
	}
	if err := sc.Err(); err != nil {
		return engine.Histogram{}, fmt.Errorf("bench: read %s: %w", lagMetric, err)
	}
	if len(h.Bounds) == 0 || !slices.IsSorted(h.Bounds) {
		return engine.Histogram{}, fmt.Errorf("bench: no %s histogram in the node's metrics", lagMetric)
	}
	return h, nil
}

// lagSince returns the fires of b not yet in a, two readings of the same
// histograms (one per node, in the same order), merged: the fires between
// the two readings.
func lagSince(a, b []engine.Histogram) (engine.Histogram, error) {
	if len(a) != len(b) || len(b) == 0 {
		return engine.Histogram{}, fmt.Errorf("bench: %d fire-lag histograms before, %d after", len(a), len(b))
	}
	d := engine.Histogram{Bounds: b[0].Bounds, Counts: make([]uint64, len(b[0].Bounds))}
	for k := range b {
		if !slices.Equal(a[k].Bounds, d.Bounds) || !slices.Equal(b[k].Bounds, d.Bounds) ||
			b[k].Count < a[k].Count {
			return engine.Histogram{}, fmt.Errorf("bench: the fire-lag histograms changed shape or went back")
		}
		d.Count += b[k].Count - a[k].Count
		for i := range d.Counts {
			d.Counts[i] += b[k].Counts[i] - a[k].Counts[i]
		}
	}
	return d, nil
}

// maxMs returns the upper bound of h's last non-empty bucket, in ms: the
// most h can tell of its largest value (+Inf: its last bound), or 0 when h
// holds nothing.
func maxMs(h engine.Histogram) float64 {
	if h.Count == 0 {
		return 0
	}
	for i := range h.Counts {
		if h.Counts[i] == h.Count {
			return h.Bounds[i] * 1000
		}
	}
	return h.Bounds[len(h.Bounds)-1] * 1000
}

// fireLags reads every live node's fire-lag histogram, in node order.
func (f *fleet) fireLags(ctx context.Context) ([]engine.Histogram, error) {
	var hs []engine.Histogram
	for _, n := range f.live() {
		h, err := n.fireLag(ctx)
		if err != nil {
			return nil, err
		}
		hs = append(hs, h)
	}
	return hs, nil
}

// histBuckets returns h's non-empty span as the distribution of a Result.
func histBuckets(h engine.Histogram) []Bucket {
	var out []Bucket
	var below uint64
	for i, c := range h.Counts {
		if c > below || len(out) > 0 && below < h.Count {
			out = append(out, Bucket{UpperMs: h.Bounds[i] * 1000, Count: c - below})
		}
		below = c
	}
	return out
}
