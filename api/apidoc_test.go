package api

import (
	"os"
	"strings"
	"testing"
)

// TestAPIDoc_NamesEveryQueryParameter: docs/api.md's table of routes names,
// in the rows of each route, every query parameter the server takes for it
// (queryParams), so that a parameter added to a route is documented where
// a reader of that route looks.
func TestAPIDoc_NamesEveryQueryParameter(t *testing.T) {
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| `") {
			rows = append(rows, line)
		}
	}
	if len(rows) < 20 {
		t.Fatalf("found only %d table rows in docs/api.md: the pattern is broken", len(rows))
	}
	for pattern, params := range queryParams {
		var text string
		for _, row := range rows {
			first, _, _ := strings.Cut(strings.TrimPrefix(row, "| "), " | ")
			for _, end := range []string{"`", "?", " "} {
				if strings.Contains(first, "`"+pattern+end) {
					text += row
					break
				}
			}
		}
		if text == "" {
			t.Errorf("docs/api.md has no table row of %s", pattern)
			continue
		}
		for _, p := range params {
			if !strings.Contains(text, p+"=") {
				t.Errorf("docs/api.md's rows of %s do not name its query parameter %q (as %s=)", pattern, p, p)
			}
		}
	}
}
