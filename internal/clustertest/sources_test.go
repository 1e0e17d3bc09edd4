package clustertest

import (
	"testing"

	"github.com/shardcron/shardcron/internal/buildinputs"
)

// TestSourcesOpened tells go test's cache which files the binary TestMain
// builds was built from: without it, a change to the engine left the chaos
// tests replaying a result cached for the code before it.
func TestSourcesOpened(t *testing.T) {
	if _, err := buildinputs.Open(); err != nil {
		t.Fatal(err)
	}
}
