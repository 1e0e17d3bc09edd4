package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// A node with an in-process handler: it stores a task that calls the
// handler every second, and takes its first fire.
func ExampleEngine_Handle() {
	// A real node gets a client of its etcd cluster; the example runs a
	// single-member etcd of its own.
	cli, stopEtcd, err := exampleEtcd()
	if err != nil {
		log.Fatal(err)
	}
	defer stopEtcd()

	cfg := engine.DefaultConfig("node-1")
	cfg.Partitions = 16 // fixed when the cluster is created
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := engine.New(cfg, cli, nil) // no Badger store: no cache, no history
	if err != nil {
		log.Fatal(err)
	}
	fires := make(chan engine.Fire, 1)
	e.Handle("billing.report", func(ctx context.Context, f engine.Fire) error {
		select {
		case fires <- f: // the example keeps the first fire
		default:
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer e.Close() // releases the partitions with their checkpoints

	tsk, err := task.DecodeTask([]byte(`{
		"id": "billing/report",
		"schedule": "* * * * * *",
		"executor": {"type": "handler", "name": "billing.report", "payload": {"team": "billing"}}
	}`))
	if err != nil {
		log.Fatal(err) // a *task.ValidationError naming the field
	}
	stored, err := e.Registry().Put(ctx, tsk, registry.PutOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored", stored.ID, "in partition", *stored.Partition)

	select {
	case f := <-fires:
		fmt.Println("fired", f.TaskID, "attempt", f.Attempt, "on", f.Node, "with", string(f.Payload))
		fmt.Println("on a whole second:", f.ScheduledAt.Equal(f.ScheduledAt.Truncate(time.Second)))
	case <-ctx.Done():
		log.Fatal("no fire")
	}
	// Output:
	// stored billing/report in partition 4
	// fired billing/report attempt 1 on node-1 with {"team":"billing"}
	// on a whole second: true
}

// exampleEtcd starts an embedded single-member etcd on free loopback ports
// in a temporary directory, and returns a client of it and a function that
// stops both and removes the directory.
func exampleEtcd() (*clientv3.Client, func(), error) {
	dir, err := os.MkdirTemp("", "shardcron-example-")
	if err != nil {
		return nil, nil, err
	}
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "etcd")
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{local}, []url.URL{local}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{local}, []url.URL{local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.EnableGRPCGateway = false
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		srv.Close()
		os.RemoveAll(dir)
		return nil, nil, errors.New("etcd did not start")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"http://" + srv.Clients[0].Addr().String()},
		DialTimeout: 5 * time.Second,
		Logger:      srv.GetLogger(),
	})
	if err != nil {
		srv.Close()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return cli, func() {
		cli.Close()
		srv.Close()
		os.RemoveAll(dir)
	}, nil
}
