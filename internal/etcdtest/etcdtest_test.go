package etcdtest

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
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
