package etcdtest

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Members of a multi-member cluster talk over HTTP; etcd leaves their
	// keep-alive connections to the peers' servers to die with the process.
	// The proxy uses no net/http, so its leaks are still caught.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"))
}

func TestStart_ServesRequests(t *testing.T) {
	c := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Client.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("put: %v", err)
	}
	other := c.NewClient(t)
	resp, err := other.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get /k = %v, want v", resp.Kvs)
	}
}

func TestStart_ParallelClustersAreIndependent(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Endpoints[0] == b.Endpoints[0] {
		t.Fatalf("two clusters share endpoint %s", a.Endpoints[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Client.Put(ctx, "/only-a", "1"); err != nil {
		t.Fatal(err)
	}
	resp, err := b.Client.Get(ctx, "/only-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("cluster b sees a's key")
	}
}

func TestProxy_CutAndRestore(t *testing.T) {
	c := Start(t)
	p := c.NewProxy(t)
	cli := c.NewClient(t, p.Endpoint())

	get := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := cli.Get(ctx, "/k")
		return err
	}
	if err := get(5 * time.Second); err != nil {
		t.Fatalf("get through proxy: %v", err)
	}

	p.Cut()
	p.Cut() // idempotent
	if err := get(300 * time.Millisecond); err == nil {
		t.Fatal("get through a cut proxy succeeded")
	}
	// The server itself is still reachable directly.
	if err := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.Client.Get(ctx, "/k")
		return err
	}(); err != nil {
		t.Fatalf("direct get during cut: %v", err)
	}

	p.Restore()
	p.Restore() // idempotent
	WaitFor(t, 20*time.Second, func() bool { return get(time.Second) == nil })
}

func TestProxy_CloseIsIdempotent(t *testing.T) {
	c := Start(t)
	p := c.NewProxy(t)
	cli := c.NewClient(t, p.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "/k"); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close()
}

func TestWaitFor_ReturnsOnceTrue(t *testing.T) {
	n := 0
	WaitFor(t, time.Second, func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond evaluated %d times, want 3", n)
	}
}

func TestMember_RestartKeepsDataAndAddress(t *testing.T) {
	c := Start(t)
	p := c.NewProxy(t) // targets the member's address, which a restart keeps
	cli := c.NewClient(t, p.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	m := c.Members[0]
	addr := m.Addr()
	m.Stop()
	m.Stop() // idempotent
	m.Restart(t)
	if m.Addr() != addr {
		t.Fatalf("restart moved the member from %s to %s", addr, m.Addr())
	}
	var got string
	WaitFor(t, 20*time.Second, func() bool {
		gctx, gcancel := context.WithTimeout(ctx, time.Second)
		defer gcancel()
		resp, err := cli.Get(gctx, "/k")
		if err != nil || len(resp.Kvs) != 1 {
			return false
		}
		got = string(resp.Kvs[0].Value)
		return true
	})
	if got != "v" {
		t.Fatalf("after restart /k = %q, want v", got)
	}
}

func TestStartCluster_ThreeMembersMoveLeader(t *testing.T) {
	c := StartCluster(t, Options{Members: 3})
	if len(c.Endpoints) != 3 {
		t.Fatalf("%d endpoints, want 3", len(c.Endpoints))
	}
	from := c.Leader(t)
	to := (from + 1) % 3
	c.MoveLeader(t, to)
	if got := c.Leader(t); got != to {
		t.Fatalf("leader is m%d after moving it to m%d", got, to)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Client.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("put after the move: %v", err)
	}
}

func TestCluster_NoSpaceRefusesWritesKeepsReads(t *testing.T) {
	c := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lease, err := c.Client.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	c.RaiseNoSpace(t)
	if _, err := c.Client.Put(ctx, "/k", "v"); err == nil || !strings.Contains(err.Error(), "space exceeded") {
		t.Fatalf("put under NOSPACE: %v, want a space-exceeded error", err)
	}
	if _, err := c.Client.Get(ctx, "/k"); err != nil {
		t.Fatalf("get under NOSPACE: %v", err)
	}
	if _, err := c.Client.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatalf("keep-alive under NOSPACE: %v", err)
	}
	c.ClearNoSpace(t)
	if _, err := c.Client.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("put after clearing NOSPACE: %v", err)
	}
}

func TestRefusedAddr_Refuses(t *testing.T) {
	addr := RefusedAddr(t)
	for range 3 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("a connection to %s was accepted", addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial %s: %v, want connection refused", addr, err)
		}
	}
}

// TestFreeAddrs_Distinct guards the members' addresses: reserved one after
// another and closed at once, two of a cluster's ports came out equal and
// the cluster refused to start ("has duplicate url").
func TestFreeAddrs_Distinct(t *testing.T) {
	seen := make(map[string]bool)
	for _, a := range freeAddrs(t, 200) {
		if seen[a] {
			t.Fatalf("freeAddrs returned %s twice", a)
		}
		seen[a] = true
	}
}

// TestFreeAddrs_BelowTheEphemeralRange guards a member's restart: with
// ports the kernel also gives connections, a stopped member's port was
// now and then some connection's ("bind: address already in use").
func TestFreeAddrs_BelowTheEphemeralRange(t *testing.T) {
	lo, hi := quietPorts()
	if hi == 0 {
		t.Skip("the kernel's ephemeral range is not readable here")
	}
	for _, a := range freeAddrs(t, 20) {
		_, port, _ := net.SplitHostPort(a)
		if p, _ := strconv.Atoi(port); p < lo || p >= hi {
			t.Errorf("port %d, want one of [%d, %d), below the ephemeral range", p, lo, hi)
		}
		if p, _ := strconv.Atoi(port); p >= NodePorts {
			t.Errorf("port %d, want one below %d, where nodes' ports begin", p, NodePorts)
		}
	}
}
