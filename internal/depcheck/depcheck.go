// Package depcheck lets a package's tests refuse dependencies: the leaf
// packages that clients link (task, api/client) must not pull in the
// server.
package depcheck

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Refuse fails t for every package that the package in the current
// directory links (go list -deps) and that is one of banned or below it,
// unless it is listed in allowed. It is skipped in -short mode, as it runs
// the go command.
func Refuse(t *testing.T, banned, allowed []string) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		for _, b := range banned {
			if (dep == b || strings.HasPrefix(dep, b+"/")) && !slices.Contains(allowed, dep) {
				t.Errorf("links %s", dep)
			}
		}
	}
}
