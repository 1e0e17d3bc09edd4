package bench

// WriteReport writes dir/report.html, with the ratios (nil: none) after
// the comparison table, and each of its charts as an SVG file beside it
// (ratios.svg, NN-scenario-lag.svg, NN-scenario-dist.svg), and returns the
// report's path.
func WriteReport(dir string, results []*Result, ratios []Ratio) (string, error) {
	return writeReport(dir, results, ratios)
}
