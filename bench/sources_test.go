package bench

import (
	"testing"

	"github.com/shardcron/shardcron/internal/buildinputs"
)

// TestSourcesOpened tells go test's cache which files the binary of the
// process tests (shardcronBinary) was built from: bench does not import
// package main, so a change to cmd/shardcron alone would otherwise leave
// those tests replaying a result cached for the code before it.
func TestSourcesOpened(t *testing.T) {
	if _, err := buildinputs.Open(); err != nil {
		t.Fatal(err)
	}
}
