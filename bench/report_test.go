package bench

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The report's charts are written as SVG files of their own, each well
// formed and styled without the HTML page, for a README to link.
func TestWriteReport_ChartsAsFiles(t *testing.T) {
	dir := t.TempDir()
	results := []*Result{
		{Scenario: Throughput, Tasks: 100, LagSeries: []SeriesPoint{{T: 1, P50Ms: 1, P99Ms: 2, MaxMs: 3, HasLag: true}, {T: 2, P50Ms: 1, P99Ms: 4, MaxMs: 5, HasLag: true}},
			LagDist: []Bucket{{UpperMs: 1, Count: 10}, {UpperMs: 2, Count: 3}}},
		{Scenario: LockPerFire, Tasks: 100, LagDist: []Bucket{{UpperMs: 5, Count: 1}}},
	}
	ratios := []Ratio{
		{Figure: "fires_per_sec", Shardcron: Throughput, Baseline: LockPerFire, Times: 433},
		{Figure: "lag_p99_ms", Shardcron: Throughput, Baseline: LockPerFire, Times: 2.5},
		{Figure: "cpu_us_per_fire", Shardcron: Throughput, Baseline: LockPerFire, Times: 0.8},
	}
	if _, err := WriteReport(dir, results, ratios); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*.svg"))
	for i := range names {
		names[i] = filepath.Base(names[i])
	}
	want := []string{"01-throughput-dist.svg", "01-throughput-lag.svg", "02-lock-per-fire-dist.svg", "ratios.svg"}
	if !slices.Equal(names, want) {
		t.Fatalf("chart files %v, want %v", names, want)
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		var root struct {
			XMLName xml.Name
			Style   string `xml:"style"`
		}
		if err := xml.Unmarshal(b, &root); err != nil || root.XMLName.Local != "svg" || !strings.Contains(root.Style, ".bar") {
			t.Errorf("%s: not a styled SVG document (root %q, style %q): %v", n, root.XMLName.Local, root.Style, err)
		}
	}
	// The ratio bars grow with the ratio; one below 1× has no length.
	b, _ := os.ReadFile(filepath.Join(dir, "ratios.svg"))
	var widths []float64
	for _, m := range regexp.MustCompile(`class="bar"[^>]* width="([0-9.]+)"`).FindAllStringSubmatch(string(b), -1) {
		w, _ := strconv.ParseFloat(m[1], 64)
		widths = append(widths, w)
	}
	if len(widths) != 3 || !(widths[0] > widths[1] && widths[1] > 0 && widths[2] == 0) {
		t.Errorf("ratio bar widths %v, want 433× longest, 2.5× shorter, 0.8× none", widths)
	}
	if !strings.Contains(string(b), "433×") || !strings.Contains(string(b), "fires_per_sec vs lock-per-fire") {
		t.Errorf("ratios.svg does not label its bars: %s", b)
	}
}

// A report that cannot be written says so once, as "report: ...": the
// command puts its own name in front.
func TestWriteReport_ErrorSaysReport(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := WriteReport(filepath.Join(file, "dir"), []*Result{{Scenario: Throughput, Tasks: 1}}, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "report: ") {
		t.Errorf("WriteReport under a file: %v, want an error starting \"report: \"", err)
	}
}
