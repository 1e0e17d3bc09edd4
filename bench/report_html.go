package bench

import (
	"errors"
)

func writeReport(dir string, results []*Result) (string, error) {
	return "", errors.New("bench: report not built yet")
}
