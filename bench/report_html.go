package bench

import (
	"fmt"
	"html/template"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The report is one HTML file with inline CSS and inline SVG: it opens
// from disk or a CI artifact with no network.

const chartW, chartH, padL, padB, padT, padR = 640.0, 220.0, 56.0, 28.0, 12.0, 12.0

var reportTmpl = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>shardcron bench report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
svg{background:#fafafa;border:1px solid #ddd;margin:4px 8px 12px 0}
.axis{stroke:#999}.grid{stroke:#eee}.p50{stroke:#2a7;fill:none}.p99{stroke:#d73;fill:none}.max{stroke:#aaa;fill:none;stroke-dasharray:3 3}
.bar{fill:#48c}text{font-size:11px;fill:#555}
</style></head><body>
<h1>shardcron bench</h1>
<p>{{.When}} · Go {{.Go}} · {{.CPUs}} CPUs. Lag is when the executor ran minus the scheduled time.</p>
<h2>Comparison</h2>
<table><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}</table>
{{if .Ratios}}<h2>Ratios</h2>
<p>Measured in the same invocation: how many times better shardcron does than each baseline.</p>
<table><tr><th>figure</th><th>shardcron</th><th></th><th>baseline</th><th></th><th>shardcron better by</th></tr>
{{range .Ratios}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}</table>{{end}}
{{range .Charts}}<h2>{{.Title}}</h2>
{{if .Series}}<div><b>Lag over time</b> (by scheduled second; green p50, red p99, grey max)</div>{{.Series}}{{end}}
{{if .Dist}}<div><b>Lag distribution</b> (fires per lag bucket, log scale of lag)</div>{{.Dist}}{{end}}
{{end}}
</body></html>
`))

type reportChart struct {
	Title        string
	Series, Dist template.HTML
}

func writeReport(dir string, results []*Result, ratios []Ratio) (string, error) {
	head, rows := tableCells(results)
	data := struct {
		When, Go string
		CPUs     int
		Head     []string
		Rows     [][]string
		Ratios   [][]string
		Charts   []reportChart
	}{When: time.Now().UTC().Format(time.RFC3339), Go: runtime.Version(), CPUs: runtime.NumCPU(), Head: head, Rows: rows,
		Ratios: ratiosCells(ratios)}
	for _, r := range results {
		c := reportChart{Title: fmt.Sprintf("%s: %d tasks", r.Scenario, r.Tasks)}
		if len(r.LagSeries) > 1 {
			c.Series = seriesSVG(r.LagSeries)
		}
		if len(r.LagDist) > 0 {
			c.Dist = distSVG(r.LagDist)
		}
		if c.Series != "" || c.Dist != "" {
			data.Charts = append(data.Charts, c)
		}
	}
	path := filepath.Join(dir, "report.html")
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("bench: report: %w", err)
	}
	if err := reportTmpl.Execute(f, data); err != nil {
		f.Close()
		return "", fmt.Errorf("bench: report: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("bench: report: %w", err)
	}
	return path, nil
}

// seriesSVG draws p50, p99 and max lag against time, lag on a linear axis.
func seriesSVG(pts []SeriesPoint) template.HTML {
	var ymax float64
	for _, p := range pts {
		ymax = max(ymax, p.MaxMs)
	}
	ymax = niceCeil(ymax)
	tmax := max(pts[len(pts)-1].T, 1)
	x := func(t float64) float64 { return padL + (chartW-padL-padR)*t/tmax }
	y := func(v float64) float64 { return chartH - padB - (chartH-padB-padT)*v/ymax }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f">`, chartW, chartH)
	axes(&b, msCell(ymax), fmt.Sprintf("%.0f s", tmax))
	for _, s := range []struct {
		class string
		get   func(p SeriesPoint) float64
	}{{"max", func(p SeriesPoint) float64 { return p.MaxMs }}, {"p99", func(p SeriesPoint) float64 { return p.P99Ms }}, {"p50", func(p SeriesPoint) float64 { return p.P50Ms }}} {
		var pl []string
		for _, p := range pts {
			if p.HasLag {
				pl = append(pl, fmt.Sprintf("%.1f,%.1f", x(p.T), y(s.get(p))))
			}
		}
		fmt.Fprintf(&b, `<polyline class="%s" points="%s"/>`, s.class, strings.Join(pl, " "))
	}
	b.WriteString("</svg>")
	return template.HTML(b.String())
}

// distSVG draws the lag distribution as bars, one per bucket.
func distSVG(bs []Bucket) template.HTML {
	var cmax uint64
	for _, bk := range bs {
		cmax = max(cmax, bk.Count)
	}
	w := (chartW - padL - padR) / float64(len(bs))
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f">`, chartW, chartH)
	axes(&b, fmt.Sprint(cmax), msCell(bs[len(bs)-1].UpperMs))
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text>`, padL, chartH-4, msCell(bs[0].UpperMs))
	for i, bk := range bs {
		h := (chartH - padB - padT) * float64(bk.Count) / float64(max(cmax, 1))
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>≤ %s: %d</title></rect>`,
			padL+float64(i)*w, chartH-padB-h, math.Max(w-1, 1), h, msCell(bk.UpperMs), bk.Count)
	}
	b.WriteString("</svg>")
	return template.HTML(b.String())
}

func axes(b *strings.Builder, ylabel, xlabel string) {
	fmt.Fprintf(b, `<line class="axis" x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/>`, padL, padT, padL, chartH-padB)
	fmt.Fprintf(b, `<line class="axis" x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/>`, padL, chartH-padB, chartW-padR, chartH-padB)
	fmt.Fprintf(b, `<text x="4" y="%.0f">%s</text>`, padT+10, template.HTMLEscapeString(ylabel))
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="end">%s</text>`, chartW-padR, chartH-4, template.HTMLEscapeString(xlabel))
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
