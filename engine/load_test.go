package engine

import (
	"context"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
)

// The partitions prepared from the cache share reads of etcd's revision,
// but a cache synced past the last read is checked with a new one: it is
// not taken for a cache ahead of etcd.
func TestRevisions_ReadsAgainForACachePastTheLastRead(t *testing.T) {
	c := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := registry.OpenRegistry(ctx, c.Client, "/"+t.Name(), 4)
	if err != nil {
		t.Fatal(err)
	}
	r := newRevisions()
	first, err := r.notAhead(ctx, reg, 1)
	if err != nil || first < 1 {
		t.Fatalf("notAhead: %d, %v", first, err)
	}
	resp, err := c.Client.Put(ctx, "/"+t.Name()+"/other", "x")
	if err != nil {
		t.Fatal(err)
	}
	written := resp.Header.Revision // a cache synced to it since the first read
	if now, err := r.notAhead(ctx, reg, written); err != nil || now < written {
		t.Errorf("notAhead(%d) = %d, %v: the cache would be taken for one ahead of etcd", written, now, err)
	}
	if now, err := r.notAhead(ctx, reg, first); err != nil || now < first {
		t.Errorf("notAhead(%d) = %d, %v", first, now, err)
	}
}
