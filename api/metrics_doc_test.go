package api

import (
	"encoding/json"
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

// metricLabels returns the label names of every metric this package
// exports, by metric name.
func metricLabels(t *testing.T) map[string][]string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 100)
	newCollector(nil, "").Describe(ch)
	for _, c := range newRequestMetrics().collectors() {
		c.Describe(ch)
	}
	close(ch)
	re := regexp.MustCompile(`^Desc\{fqName: "([a-z_]+)".*variableLabels: \{([a-z_,]*)\}\}$`)
	labels := map[string][]string{}
	for d := range ch {
		m := re.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name or labels in %s", d)
		}
		labels[m[1]] = []string{}
		if m[2] != "" {
			labels[m[1]] = strings.Split(m[2], ",")
		}
	}
	return labels
}

// exported returns the metric a series name belongs to (a histogram's
// _bucket, _sum and _count are its own), and whether a node exports it.
func exported(labels map[string][]string, series string) (string, bool) {
	if _, ok := labels[series]; ok {
		return series, true
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if b, ok := strings.CutSuffix(series, suffix); ok {
			if _, ok := labels[b]; ok {
				return b, true
			}
		}
	}
	return series, false
}

// TestMetrics_DocsAndDashboardMatchTheCode: every metric the docs and
// deploy/ name is one a node exports, with the labels the docs give it
// (README.md's table, docs/api.md's name{labels}), and every label the
// Grafana dashboard's queries group, filter or name series by is one of
// the metrics they read, or a scrape target's (job, instance), or a
// histogram bucket's le.
func TestMetrics_DocsAndDashboardMatchTheCode(t *testing.T) {
	labels := metricLabels(t)
	series := regexp.MustCompile(`shardcron_[a-z_]*[a-z]`)
	for _, file := range []string{"../README.md", "../docs/api.md", "../docs/design.md", "../deploy/grafana/shardcron.json",
		"../deploy/kubernetes/shardcron.yaml", "../deploy/docker-compose.yml", "../deploy/systemd/shardcron.service"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range series.FindAllString(string(b), -1) {
			if _, ok := exported(labels, s); !ok {
				t.Errorf("%s names %s, which no node exports", file, s)
			}
		}
	}

	same := func(where, metric string, doc []string) {
		t.Helper()
		code := slices.Clone(labels[metric])
		slices.Sort(code)
		slices.Sort(doc)
		if !slices.Equal(code, doc) {
			t.Errorf("%s gives %s the labels %v; a node exports %v", where, metric, doc, code)
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The table of the Metrics section, whose third column is the labels.
	_, table, ok := strings.Cut(string(readme), "| metric | type | labels | meaning |\n")
	table, _, _ = strings.Cut(table, "\n\n")
	rows := regexp.MustCompile("(?m)^\\| `(shardcron_[a-z_]+)` \\| [a-z]+ \\|([^|]*)\\|").FindAllStringSubmatch(table, -1)
	if !ok {
		t.Error("README.md has no table | metric | type | labels | meaning |")
	}
	if len(rows) < len(labels) {
		t.Errorf("README.md's metrics table has %d rows with labels, for %d metrics", len(rows), len(labels))
	}
	for _, m := range rows {
		var doc []string
		// The names in backquotes, not the values in parentheses.
		for _, l := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(m[2], ""), -1) {
			doc = append(doc, l[1])
		}
		same("README.md's metrics table", m[1], doc)
	}
	apiDoc, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(shardcron_[a-z_]+)\{([a-z_,]+)\}`).FindAllStringSubmatch(string(apiDoc), -1) {
		same("docs/api.md", m[1], strings.Split(m[2], ","))
	}

	var dash struct {
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr   string `json:"expr"`
				Legend string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile("../deploy/grafana/shardcron.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	type query struct{ where, expr, legend string }
	var queries []query
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			queries = append(queries, query{"variable " + v.Definition, v.Definition, ""})
		}
	}
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			queries = append(queries, query{"panel " + p.Title, q.Expr, q.Legend})
		}
	}
	grouped := regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	matcher := regexp.MustCompile(`([a-zA-Z_]+)\s*(?:=~|!~|!=|=)\s*"`)
	legend := regexp.MustCompile(`\{\{\s*([a-zA-Z_]+)\s*\}\}`)
	valuesOf := regexp.MustCompile(`label_values\([^,]*,\s*([a-zA-Z_]+)\s*\)`)
	for _, q := range queries {
		allowed := map[string]bool{"job": true, "instance": true}
		for _, s := range series.FindAllString(q.expr, -1) {
			m, _ := exported(labels, s)
			for _, l := range labels[m] {
				allowed[l] = true
			}
			if strings.HasSuffix(s, "_bucket") {
				allowed["le"] = true
			}
		}
		var used []string
		for _, m := range grouped.FindAllStringSubmatch(q.expr, -1) {
			for _, l := range strings.Split(m[1], ",") {
				used = append(used, strings.TrimSpace(l))
			}
		}
		for _, re := range []*regexp.Regexp{matcher, valuesOf} {
			for _, m := range re.FindAllStringSubmatch(q.expr, -1) {
				used = append(used, m[1])
			}
		}
		for _, m := range legend.FindAllStringSubmatch(q.legend, -1) {
			used = append(used, m[1])
		}
		if strings.Count(q.expr, "(") != strings.Count(q.expr, ")") || strings.Count(q.expr, "{") != strings.Count(q.expr, "}") {
			t.Errorf("the dashboard's %s: unbalanced brackets in %s", q.where, q.expr)
		}
		for _, l := range used {
			if !allowed[l] {
				t.Errorf("the dashboard's %s uses the label %q, which none of its metrics has: %s", q.where, l, q.expr)
			}
		}
	}
}
