package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// TestEngine_RefusesOtherPartitionCount: a node started with another
// partition count than its cluster's refuses to start (invariant 10).
func TestEngine_RefusesOtherPartitionCount(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := context.Background()
	if _, err := registry.OpenRegistry(ctx, c.Client, "/fixed", 16); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("node-x")
	cfg.Prefix = "/fixed"
	cfg.Partitions = 32
	cfg.Logger = quietLogger()
	e, err := New(cfg, c.Client, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); !errors.Is(err, registry.ErrPartitionsMismatch) {
		t.Errorf("Start with 32 partitions: %v, want ErrPartitionsMismatch", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("Close after a failed Start: %v", err)
	}
}

// A node started with other ring settings than its cluster's would
// compute a ring of its own and leave partitions without an owner: it
// refuses to start.
func TestEngine_RefusesOtherRing(t *testing.T) {
	c := etcdtest.Start(t)
	startNode(t, c, "", nil, nil)
	cfg := DefaultConfig("node-x")
	cfg.Partitions = 16
	cfg.ReplicationFactor = 200
	cfg.Logger = quietLogger()
	e, err := New(cfg, c.Client, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); !errors.Is(err, registry.ErrRingMismatch) {
		t.Errorf("Start with --replication 200: %v, want ErrRingMismatch", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("Close after a failed Start: %v", err)
	}
}

// TestList_DuringHandOver: a second node joins, taking half of the
// partitions, while a client pages through the tasks: every task is listed
// once, in order.
func TestList_DuringHandOver(t *testing.T) {
	c := etcdtest.Start(t)
	n1 := startNode(t, c, "", nil, nil)
	reg := n1.e.Registry()
	ctx := context.Background()
	var all []*task.Task
	for i := range 600 {
		all = append(all, handlerTask(fmt.Sprintf("h/%04d", i), "@every 1h"))
	}
	if _, err := reg.PutBatch(ctx, all); err != nil {
		t.Fatal(err)
	}
	joined := false
	var got []string
	opts := registry.ListOptions{Prefix: "h/", Limit: 50}
	for page := 0; ; page++ {
		if page == 3 {
			startNode(t, c, "", nil, func(cfg *Config) { cfg.NodeID = "node-2" })
			etcdtest.WaitFor(t, 20*time.Second, func() bool {
				owned := 0
				for p := range 16 {
					if n1.e.Owns(p) {
						owned++
					}
				}
				return owned < 16
			})
			joined = true
		}
		tasks, next, err := reg.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, tsk := range tasks {
			got = append(got, tsk.ID)
		}
		if next == "" {
			break
		}
		opts.Cursor = next
	}
	if !joined {
		t.Fatal("the second node never joined")
	}
	want := make([]string, len(all))
	for i, tsk := range all {
		want[i] = tsk.ID
	}
	if !slices.Equal(got, want) {
		t.Errorf("listed %d tasks, want %d: %v", len(got), len(want), got)
	}
}
