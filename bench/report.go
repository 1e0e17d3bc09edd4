package bench

// WriteReport writes dir/report.html and returns its path.
func WriteReport(dir string, results []*Result) (string, error) {
	return writeReport(dir, results)
}
