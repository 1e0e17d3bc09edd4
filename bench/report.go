package bench

// WriteReport writes dir/report.html, with the ratios (nil: none) after
// the comparison table, and returns its path.
func WriteReport(dir string, results []*Result, ratios []Ratio) (string, error) {
	return writeReport(dir, results, ratios)
}
