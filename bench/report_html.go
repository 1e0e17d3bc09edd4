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
// from disk or a CI artifact with no network. Each chart is also written
// as an SVG file of its own beside it, to link from a README: a chart
// carries its own style, so it reads the same inline and alone.

const chartW, chartH, padL, padB, padT, padR = 640.0, 236.0, 56.0, 28.0, 28.0, 12.0

// svgOpen starts a chart of width w and height h, with its style and its
// title.
func svgOpen(b *strings.Builder, w, h float64, title string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f">`, w, h)
	b.WriteString(`<style>.axis{stroke:#999}.p50{stroke:#2a7;fill:none}.p99{stroke:#d73;fill:none}` +
		`.max{stroke:#aaa;fill:none;stroke-dasharray:3 3}.bar{fill:#48c}text{font:11px system-ui,sans-serif;fill:#555}</style>`)
	fmt.Fprintf(b, `<rect width="%.0f" height="%.0f" fill="#fafafa" stroke="#ddd"/>`, w, h)
	fmt.Fprintf(b, `<text x="%.0f" y="16" text-anchor="middle" font-weight="bold">%s</text>`, w/2, template.HTMLEscapeString(title))
}

var reportTmpl = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>shardcron bench report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
svg{margin:4px 8px 12px 0}
</style></head><body>
<h1>shardcron bench</h1>
<p>{{.When}} · Go {{.Go}} · {{.CPUs}} CPUs. Lag is when the executor ran minus the scheduled time.</p>
<h2>Comparison</h2>
<table><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}</table>
{{if .Ratios}}<h2>Ratios</h2>
<p>Measured in the same invocation: how many times better shardcron does than each baseline.</p>
<table><tr><th>figure</th><th>shardcron</th><th></th><th>baseline</th><th></th><th>shardcron better by</th></tr>
{{range .Ratios}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>{{end}}</table>
{{.RatioChart}}{{end}}
{{range .Charts}}<h2>{{.Title}}</h2>
{{.Series}}
{{.Dist}}
{{end}}
</body></html>
`))

type reportChart struct {
	Title        string
	Series, Dist template.HTML
}

// chartFile is one chart's SVG file in the report's directory.
type chartFile struct {
	name string
	svg  template.HTML
}

func writeReport(dir string, results []*Result, ratios []Ratio) (string, error) {
	head, rows := tableCells(results)
	data := struct {
		When, Go   string
		CPUs       int
		Head       []string
		Rows       [][]string
		Ratios     [][]string
		RatioChart template.HTML
		Charts     []reportChart
	}{When: time.Now().UTC().Format(time.RFC3339), Go: runtime.Version(), CPUs: runtime.NumCPU(), Head: head, Rows: rows,
		Ratios: ratiosCells(ratios)}
	var files []chartFile
	if len(ratios) > 0 {
		data.RatioChart = ratioSVG(ratios)
		files = append(files, chartFile{"ratios.svg", data.RatioChart})
	}
	for i, r := range results {
		c := reportChart{Title: fmt.Sprintf("%s: %d tasks", r.Scenario, r.Tasks)}
		// Numbered: --runs and scenario lists repeat a scenario.
		stem := fmt.Sprintf("%02d-%s", i+1, r.Scenario)
		if len(r.LagSeries) > 1 {
			c.Series = seriesSVG(c.Title+": lag by second (green p50, red p99, grey max)", r.LagSeries)
			files = append(files, chartFile{stem + "-lag.svg", c.Series})
		}
		if len(r.LagDist) > 0 {
			c.Dist = distSVG(c.Title+": fires by lag (log scale of lag)", r.LagDist)
			files = append(files, chartFile{stem + "-dist.svg", c.Dist})
		}
		if c.Series != "" || c.Dist != "" {
			data.Charts = append(data.Charts, c)
		}
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.svg), 0o644); err != nil {
			return "", fmt.Errorf("report: %w", err)
		}
	}
	path := filepath.Join(dir, "report.html")
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	if err := reportTmpl.Execute(f, data); err != nil {
		f.Close()
		return "", fmt.Errorf("report: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	return path, nil
}

// seriesSVG draws p50, p99 and max lag against time, lag on a linear axis.
func seriesSVG(title string, pts []SeriesPoint) template.HTML {
	var ymax float64
	for _, p := range pts {
		ymax = max(ymax, p.MaxMs)
	}
	ymax = niceCeil(ymax)
	tmax := max(pts[len(pts)-1].T, 1)
	x := func(t float64) float64 { return padL + (chartW-padL-padR)*t/tmax }
	y := func(v float64) float64 { return chartH - padB - (chartH-padB-padT)*v/ymax }
	var b strings.Builder
	svgOpen(&b, chartW, chartH, title)
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
func distSVG(title string, bs []Bucket) template.HTML {
	var cmax uint64
	for _, bk := range bs {
		cmax = max(cmax, bk.Count)
	}
	w := (chartW - padL - padR) / float64(len(bs))
	var b strings.Builder
	svgOpen(&b, chartW, chartH, title)
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

// ratioSVG draws how many times better shardcron does than each baseline,
// one bar per ratio, on a log scale from 1× (no better) up: the ratios
// span from a few times to several hundred.
func ratioSVG(ratios []Ratio) template.HTML {
	const rowH, labelW = 22.0, 300.0 // rows start below the title (padT)
	h := padT + padB + rowH*float64(len(ratios))
	top := 1.0
	for _, r := range ratios {
		top = max(top, r.Times)
	}
	top = niceCeil(top)
	x := func(v float64) float64 {
		if v <= 1 || top <= 1 {
			return labelW
		}
		return labelW + (chartW-labelW-padR-48)*math.Log10(v)/math.Log10(top)
	}
	var b strings.Builder
	svgOpen(&b, chartW, h, "shardcron better by, in the same invocation")
	fmt.Fprintf(&b, `<line class="axis" x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/>`, labelW, padT, labelW, h-padB)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">1× (log scale to %s×)</text>`, labelW, h-8, figure(top))
	for i, r := range ratios {
		y := padT + rowH*float64(i)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s vs %s</text>`, labelW-6, y+rowH/2+4,
			template.HTMLEscapeString(r.Figure), template.HTMLEscapeString(r.Baseline))
		fmt.Fprintf(&b, `<rect class="bar" x="%.0f" y="%.1f" width="%.1f" height="%.1f"/>`, labelW, y+3, x(r.Times)-labelW, rowH-6)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s×</text>`, x(r.Times)+4, y+rowH/2+4, figure(sig(r.Times, 3)))
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
