package api

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"
)

// TestMetrics_Documented: the README's metrics table has every metric,
// and the Grafana dashboard uses only metrics that exist.
func TestMetrics_Documented(t *testing.T) {
	labels := metricLabels(t)
	table := readmeMetricsTable(t)
	for _, n := range slices.Sorted(maps.Keys(labels)) {
		if !strings.Contains(table, "| `"+n+"` |") {
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
		if _, ok := exported(labels, u); !ok {
			t.Errorf("the Grafana dashboard uses %s, which no node exports", u)
		}
	}
}

// readmeMetricsTable returns the rows of README.md's metrics table
// (| metric | type | labels | meaning |).
func readmeMetricsTable(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const head = "| metric | type | labels | meaning |\n"
	_, table, ok := strings.Cut(string(readme), head)
	if !ok {
		t.Fatalf("README.md has no table %s", strings.TrimSpace(head))
	}
	table, _, _ = strings.Cut(table, "\n\n")
	return table
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
		"../deploy/kubernetes/shardcron.yaml", "../deploy/docker-compose.yml", "../deploy/systemd/shardcron.service",
		"../deploy/prometheus/alerts.yml", "../deploy/prometheus/alerts_test.yml"} {
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
	// The table of the Metrics section, whose third column is the labels.
	rows := regexp.MustCompile("(?m)^\\| `(shardcron_[a-z_]+)` \\| [a-z]+ \\|([^|]*)\\|").FindAllStringSubmatch(readmeMetricsTable(t), -1)
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

// labelValues returns, by metric and label, the values README.md's
// metrics table gives a label that takes a fixed set: those listed in
// parentheses after it (`status` (ok, failed, ...)), or, for a metric
// whose one label has none listed, the names in backquotes in its
// meaning (`phase`: `prepare`, `lock_wait`, ...). A list that is open
// (..., e.g.) gives none.
func labelValues(t *testing.T) map[string]map[string][]string {
	t.Helper()
	table := readmeMetricsTable(t)
	row := regexp.MustCompile("(?m)^\\| `(shardcron_[a-z_]+)` \\| [a-z]+ \\|([^|]*)\\|(.*)\\|$")
	label := regexp.MustCompile("`([a-z_]+)`(?: \\(([^)]*)\\))?")
	word := regexp.MustCompile("^[a-z_]+$")
	values := map[string]map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		labels := label.FindAllStringSubmatch(m[2], -1)
		for _, l := range labels {
			var vs []string
			switch {
			case l[2] != "":
				for _, v := range strings.Split(l[2], ",") {
					if v = strings.TrimSpace(v); !word.MatchString(v) {
						vs = nil // an open list
						break
					}
					vs = append(vs, v)
				}
			case len(labels) == 1:
				for _, v := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(m[3], -1) {
					vs = append(vs, v[1])
				}
			}
			if len(vs) > 0 {
				if values[m[1]] == nil {
					values[m[1]] = map[string][]string{}
				}
				values[m[1]][l[1]] = vs
			}
		}
	}
	return values
}

// promqlWords are the PromQL functions, aggregations and keywords the
// alerting rules may use: any other name in an expression must be a
// series a node exports.
var promqlWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "group": true, "topk": true, "bottomk": true,
	"quantile": true, "stddev": true, "stdvar": true, "count_values": true,
	"rate": true, "irate": true, "increase": true, "delta": true, "idelta": true, "deriv": true, "changes": true,
	"resets": true, "predict_linear": true, "histogram_quantile": true, "absent": true, "absent_over_time": true,
	"timestamp": true, "time": true, "vector": true, "scalar": true, "abs": true, "ceil": true, "floor": true,
	"round": true, "clamp": true, "clamp_min": true, "clamp_max": true, "label_replace": true, "label_join": true,
	"avg_over_time": true, "min_over_time": true, "max_over_time": true, "sum_over_time": true,
	"count_over_time": true, "quantile_over_time": true, "last_over_time": true, "present_over_time": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "offset": true, "bool": true, "inf": true, "nan": true,
}

// TestMetrics_AlertRules: deploy/prometheus/alerts.yml is a Prometheus rule
// file (groups of alerting rules, each with an expression, a severity, a
// summary and a description, and a comment that says why its threshold),
// whose expressions use only series a node exports, only labels those
// series have (or a scrape target's job and instance, a bucket's le),
// only values of those labels that a node gives them, and PromQL's own
// functions; whose annotations name only such labels; and which covers
// what an operator is paged for. Without a PromQL parser in go.mod, the
// expressions are checked by their parts; promtool, where installed,
// parses and runs them (deploy's TestPrometheusRules).
func TestMetrics_AlertRules(t *testing.T) {
	const file = "../deploy/prometheus/alerts.yml"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name     string `json:"name"`
			Interval string `json:"interval,omitempty"`
			Rules    []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &rules); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(rules.Groups) == 0 {
		t.Fatalf("%s has no groups", file)
	}
	// Each rule says why: a comment right above it.
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "- alert:") && (i == 0 || !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#")) {
			t.Errorf("%s:%d: %s has no comment above it saying why its threshold", file, i+1, strings.TrimSpace(l))
		}
	}

	labels := metricLabels(t)
	values := labelValues(t)
	if len(values["shardcron_executions_total"]["status"]) < 6 || len(values["shardcron_handover_duration_seconds"]["phase"]) != 4 {
		t.Fatalf("README.md's metrics table gives the values %v", values)
	}
	duration := regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)
	selector := regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}`)
	matcher := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	grouping := regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	name := regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(\s*\()?`)
	templateLabel := regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	seen := map[string]bool{}
	used := map[string]bool{} // series, and series{label="value"} for each value matched
	for _, g := range rules.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: no name or no rules", g.Name)
		}
		if g.Interval != "" && !duration.MatchString(g.Interval) {
			t.Errorf("group %q: interval %q", g.Name, g.Interval)
		}
		for _, r := range g.Rules {
			where := "rule " + r.Alert
			switch {
			case r.Alert == "" || seen[r.Alert]:
				t.Errorf("%s: an alert without a name, or a second of that name", where)
			case strings.TrimSpace(r.Expr) == "":
				t.Errorf("%s: no expr", where)
			case r.For != "" && !duration.MatchString(r.For):
				t.Errorf("%s: for %q is not a duration", where, r.For)
			case r.Labels["severity"] != "critical" && r.Labels["severity"] != "warning":
				t.Errorf("%s: severity %q, want critical (paged) or warning", where, r.Labels["severity"])
			case r.Annotations["summary"] == "" || r.Annotations["description"] == "":
				t.Errorf("%s: no summary or description", where)
			}
			seen[r.Alert] = true
			expr := r.Expr
			if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") ||
				strings.Count(expr, "[") != strings.Count(expr, "]") || strings.Count(expr, `"`)%2 != 0 {
				t.Errorf("%s: unbalanced brackets or quotes in %s", where, expr)
				continue
			}
			allowed := map[string]bool{"job": true, "instance": true}
			var series []string
			for _, m := range name.FindAllStringSubmatch(selector.ReplaceAllString(grouping.ReplaceAllString(
				regexp.MustCompile(`\[[^]]*\]|"[^"]*"`).ReplaceAllString(expr, ""), ""), "$1"), -1) {
				switch n := m[0]; {
				case promqlWords[strings.TrimRight(n, " \t\n(")]:
				case m[1] != "":
					t.Errorf("%s: %s is not a PromQL function", where, strings.TrimRight(n, " \t\n("))
				default:
					metric, ok := exported(labels, n)
					if !ok {
						t.Errorf("%s uses %s, which no node exports", where, n)
						continue
					}
					series = append(series, n)
					used[n] = true
					for _, l := range labels[metric] {
						allowed[l] = true
					}
					if strings.HasSuffix(n, "_bucket") {
						allowed["le"] = true
					}
				}
			}
			if len(series) == 0 {
				t.Errorf("%s reads no shardcron series: %s", where, expr)
			}
			var names []string
			for _, m := range grouping.FindAllStringSubmatch(expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); l != "" {
						names = append(names, l)
					}
				}
			}
			for _, m := range templateLabel.FindAllStringSubmatch(r.Annotations["summary"]+r.Annotations["description"], -1) {
				names = append(names, m[1])
			}
			for _, sel := range selector.FindAllStringSubmatch(expr, -1) {
				metric, _ := exported(labels, sel[1])
				for _, m := range matcher.FindAllStringSubmatch(sel[2], -1) {
					l, op, v := m[1], m[2], m[3]
					names = append(names, l)
					var known func(string) bool
					if vs := values[metric][l]; vs != nil {
						known = func(v string) bool { return slices.Contains(vs, v) }
					} else if l == "method" {
						known = func(v string) bool { return knownMethods[v] }
					} else if l == "code" {
						known = regexp.MustCompile(`^[1-5][0-9][0-9]$`).MatchString
					} else {
						continue
					}
					parts := []string{v}
					if op == "=~" || op == "!~" {
						parts = strings.Split(v, "|")
					}
					for _, p := range parts {
						if !known(p) {
							t.Errorf("%s matches %s{%s%s%q}: a node never gives %s the value %q", where, sel[1], l, op, v, l, p)
						}
						used[sel[1]+"{"+l+"="+p+"}"] = true
					}
				}
			}
			for _, l := range names {
				if !allowed[l] {
					t.Errorf("%s uses the label %q, which none of its series %v has", where, l, series)
				}
			}
		}
	}

	// What an operator of a production scheduler is paged for.
	for _, want := range []string{
		"shardcron_build_info",                             // no node at all
		"shardcron_fenced", "shardcron_fence_events_total", // fenced, or fenced again and again
		"shardcron_ready", "shardcron_partitions_owned", "shardcron_partitions", // a hand-over stuck, partitions nobody fires
		"shardcron_handover_duration_seconds_bucket", // hand-overs that cost fires
		"shardcron_fire_lag_seconds_bucket",          // fires late
		"shardcron_misfires_total",                   // fires missed
		"shardcron_executions_total{status=skipped}", // fires skipped
		"shardcron_executions_total{status=failed}",  // executions failing
		"shardcron_history_write_failed_total",       // a full disk
		"shardcron_history_dropped_total",            // history lost
		"shardcron_watermark_timestamp_seconds",      // etcd not recording the node's writes
		"shardcron_etcd_no_space",                    // etcd's NOSPACE
		"shardcron_api_requests_total{code=503}",     // writes refused
		"shardcron_chain_triggers_dropped_total",     // chained fires lost
		"shardcron_notify_total{result=dropped}",     // alerts dropped
	} {
		if !used[want] {
			t.Errorf("%s has no rule on %s", file, want)
		}
	}

	// The rule on owned partitions counts the cluster's partitions as its
	// nodes export them: a number would page a cluster created with fewer
	// for partitions it does not have, and miss those unowned in one
	// created with more.
	if !strings.Contains(string(b), "expr: max by (job) (shardcron_partitions) - sum by (job) (shardcron_partitions_owned) > 0") {
		t.Errorf("%s: the rule on owned partitions does not compare them with shardcron_partitions", file)
	}
}
