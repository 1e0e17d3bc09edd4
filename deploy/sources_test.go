package deploy

import (
	"testing"

	"github.com/shardcron/shardcron/internal/buildinputs"
)

// TestSourcesOpened tells go test's cache which files the binary build
// makes was built from: deploy imports none of them, so a change to the
// server's flags would otherwise leave these tests replaying a result
// cached for the code before it.
func TestSourcesOpened(t *testing.T) {
	if _, err := buildinputs.Open(); err != nil {
		t.Fatal(err)
	}
}
