package membership_test

import (
	"context"
	"errors"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/membership"
)

// A node joins, checks its fencing deadline before every dispatch batch, and
// rejoins with a new session when the old one ends.
func ExampleJoin() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()

	cfg := membership.DefaultConfig(cli, "node-1")
	cfg.Info.APIAddr = "127.0.0.1:8080"
	for ctx.Err() == nil {
		s, err := membership.Join(ctx, cfg)
		if errors.Is(err, membership.ErrNodeExists) {
			log.Fatal(err) // another live node uses this id
		}
		if err != nil {
			log.Fatal(err)
		}
		dispatch := time.NewTicker(time.Millisecond)
	loop:
		for {
			select {
			case <-s.Done():
				break loop // fenced, lease lost: drop partitions, no checkpoints
			case <-dispatch.C:
				if s.Fenced() {
					break loop
				}
				// dispatch one batch of due fires
			}
		}
		dispatch.Stop()
		log.Printf("session ended: %v", s.Err())
		_ = s.Close() // frees the node key at once if etcd is reachable
	}
}

// The member set arrives sorted, now and after every (debounced) change.
func ExampleWatch() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	for members := range membership.Watch(ctx, cli, membership.DefaultPrefix, 0) {
		ids := make([]string, len(members))
		for i, m := range members {
			ids[i] = m.ID
		}
		log.Printf("members: %v", ids) // rebuild the ring from ids
	}
}
