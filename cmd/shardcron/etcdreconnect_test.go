package main

import (
	"context"
	"testing"
	"time"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/etcdtest"
)

// A node cut off from etcd for a while (etcd restarted: in a dev cluster,
// the first node, whose embedded etcd the others use) reconnects within a
// few seconds of etcd's return. gRPC's default connection backoff grows to
// 2 minutes, and a node that had been retrying for 3 minutes rejoined 69 s
// after etcd was back, logging "connection refused" all along.
func TestEtcdClient_ReconnectsSoonAfterAnOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a 30 s etcd outage")
	}
	c := etcdtest.Start(t)
	m := c.Members[0]
	cli, err := newEtcdClient(t.Context(), &serverFlags{}, []string{m.Endpoint()}, nil, &engine.RequestCounter{})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	get := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := cli.Get(ctx, "k")
		return err
	}
	if err := get(); err != nil {
		t.Fatal(err)
	}
	m.Stop()
	// A node keeps asking meanwhile (keep-alives, rejoins).
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		_ = get()
	}
	m.Restart(t)
	back := time.Now()
	for get() != nil {
		if time.Since(back) > 10*time.Second {
			t.Fatalf("no answer from etcd %v after it came back (gRPC's connection backoff)", time.Since(back).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if took := time.Since(back); took > 5*time.Second {
		t.Errorf("the client answered %v after etcd came back, want within 5 s", took.Round(100*time.Millisecond))
	}
}
