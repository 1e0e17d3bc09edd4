package registry

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func putTask(t *testing.T, r *Registry, tsk *task.Task) *task.Task {
	t.Helper()
	got, err := r.Put(context.Background(), tsk, PutOptions{})
	if err != nil {
		t.Fatalf("put %s: %v", tsk.ID, err)
	}
	return got
}

// failingClient returns a client of c whose unary calls to the etcd
// method named by the value the caller sets in failing (a suffix such as
// "/Txn"; "" or nil for none) fail.
func failingClient(t *testing.T, c *etcdtest.Cluster, failing *atomic.Pointer[string]) *clientv3.Client {
	return interceptedClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if m := failing.Load(); m != nil && *m != "" && strings.HasSuffix(method, *m) {
			return errors.New("injected failure")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}

// interceptedClient returns a client of c whose unary calls go through
// intercept, closed when the test ends.
func interceptedClient(t *testing.T, c *etcdtest.Cluster, intercept grpc.UnaryClientInterceptor) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
