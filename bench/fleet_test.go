package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStartFleet_FailureCleansUp makes a fleet fail once its etcd runs and
// its tasks are written (a node refuses a 1 s lease): startFleet returns
// the error, and stops and removes everything it started.
func TestStartFleet_FailureCleansUp(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cfg := small(Throughput).Defaults()
	cfg.LeaseTTL = time.Second // past Validate, as only a caller of startFleet can
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := startFleet(ctx, cfg, cfg.Schedule, cfg.Nodes)
	if err == nil {
		f.close()
		t.Fatal("startFleet with a 1 s lease: no error")
	}
	if f != nil {
		t.Errorf("startFleet returned a fleet with its error %v", err)
	}
	t.Logf("error: %v", err)
	left, _ := filepath.Glob(filepath.Join(tmp, "shardcron-bench-*"))
	if len(left) > 0 {
		t.Errorf("work directories left behind: %v", left)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatal(err)
	}
}
