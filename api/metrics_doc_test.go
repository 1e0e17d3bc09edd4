package api

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// shardcronMetrics returns the names of the metrics this package exports.
func shardcronMetrics(t *testing.T) []string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 100)
	newCollector(nil, "").Describe(ch)
	for _, c := range newRequestMetrics().collectors() {
		c.Describe(ch)
	}
	close(ch)
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	var names []string
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %s", d)
		}
		names = append(names, m[1])
	}
	slices.Sort(names)
	return names
}

// TestMetrics_Documented: the README's metrics table has every metric,
// and the Grafana dashboard uses only metrics that exist.
func TestMetrics_Documented(t *testing.T) {
	names := shardcronMetrics(t)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !strings.Contains(string(readme), "| `"+n+"` |") {
			t.Errorf("README.md's metrics table lacks %s", n)
		}
	}
	dash, err := os.ReadFile("../deploy/grafana/shardcron.json")
	if err != nil {
		t.Fatal(err)
	}
	used := regexp.MustCompile(`shardcron_[a-z_]+`).FindAllString(string(dash), -1)
	if len(used) == 0 {
		t.Fatal("the Grafana dashboard uses no shardcron metric")
	}
	for _, u := range used {
		base := u
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if b, ok := strings.CutSuffix(u, suffix); ok && slices.Contains(names, b) {
				base = b
			}
		}
		if !slices.Contains(names, base) {
			t.Errorf("the Grafana dashboard uses %s, which no node exports", u)
		}
	}
}
