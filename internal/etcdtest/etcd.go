package etcdtest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdembed"
)

// startTimeout bounds how long Start waits for the server to become ready.
// A single member elects itself in well under a second; the bound is generous
// because CI machines are shared.
const startTimeout = 30 * time.Second

// Cluster is a running embedded single-member etcd.
type Cluster struct {
	// Endpoints are the client URLs of the server ("http://127.0.0.1:port").
	Endpoints []string
	// Client is connected to Endpoints; it is closed when the test ends.
	Client *clientv3.Client

	etcd *etcdembed.Server
}

// Start starts an embedded single-member etcd in a temporary directory on
// free loopback ports, waits until it serves requests and returns it with a
// connected Client. Server and client are closed when the test ends
// (t.Cleanup). Start fails the test if the server cannot start.
//
// The server logs at error level to a file that is printed when the test
// fails.
func Start(t testing.TB) *Cluster {
	t.Helper()

	// Port 0: the kernel picks a free port when etcd binds, so no port is
	// ever reserved and released (which races with parallel test packages).
	// Tests need no durability: Fast skips fsync, and its 10 ms raft tick
	// halves the start-up time; it also lowers the server's minimum lease
	// TTL from 2 s to 1 s.
	logPath := filepath.Join(t.TempDir(), "etcd.log")
	e, err := etcdembed.Start(etcdembed.Config{
		Name: "etcdtest", Dir: t.TempDir(), LogFile: logPath,
		Fast: true, StartTimeout: startTimeout,
	})
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	c := &Cluster{etcd: e}
	t.Cleanup(func() {
		e.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil && len(b) > 0 {
				t.Logf("etcdtest: server log:\n%s", b)
			}
		}
	})

	c.Endpoints = []string{e.Endpoint}
	c.Client = c.NewClient(t)
	return c
}

// NewClient returns a new client connected to endpoints, or to the cluster's
// Endpoints when none are given (pass a Proxy's Endpoint to reach the server
// through it). The client logs like the server and is closed when the test
// ends; closing it earlier is fine.
func (c *Cluster) NewClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = c.Endpoints
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      c.etcd.Logger(),
	})
	if err != nil {
		t.Fatalf("etcdtest: new client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Addr is the server's client address ("127.0.0.1:port"), e.g. the target of
// a Proxy.
func (c *Cluster) Addr() string {
	return c.etcd.Addr()
}
