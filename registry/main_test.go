package registry

import (
	"context"
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
