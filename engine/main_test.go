package engine

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// engineParallel is how many parallel tests run at once unless -parallel
// says otherwise. The engine's tests wait on the clock (leases, fencing
// deadlines, hand-over waits) far more than they use the CPU: at go
// test's default, GOMAXPROCS (2 on CI), the suite took 8 to 9 minutes at
// a load average under 1. Under the race detector they do use it: six at
// once beside the plain pass on two cores starved the keep-alives of the
// 2 s leases most tests run with (a node fenced, and fires were missed),
// and three made a test whose fires came after its lease TTL miss its
// misfire threshold; it keeps go test's default there (2 on CI).
func engineParallel() int {
	if raceEnabled {
		return runtime.GOMAXPROCS(0)
	}
	return 4
}

func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", strconv.Itoa(engineParallel())); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m,
		// The HTTP executor's shared transport keeps idle connections; the
		// engine closes them, but their reader goroutines end asynchronously.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// etcd's peer transport of a cluster of several members leaves
		// connections that end after the members stopped (etcdtest's own
		// tests ignore them too).
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	)
}

// fireLog records the fires a handler saw, by idempotency key.
type fireLog struct {
	mu    sync.Mutex
	seen  map[string]int // key -> times fired
	fires []Fire
}

func newFireLog() *fireLog { return &fireLog{seen: map[string]int{}} }

func (l *fireLog) handler(ctx context.Context, f Fire) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen[f.IdempotencyKey()]++
	l.fires = append(l.fires, f)
	return nil
}

// forTask returns the scheduled times a task fired at, in order of firing.
func (l *fireLog) forTask(id string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Time
	for _, f := range l.fires {
		if f.TaskID == id {
			out = append(out, f.ScheduledAt)
		}
	}
	return out
}

func (l *fireLog) duplicates() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var d []string
	for k, n := range l.seen {
		if n > 1 {
			d = append(d, fmt.Sprintf("%s x%d", k, n))
		}
	}
	return d
}

type testNode struct {
	e     *Engine
	store *store.Store
	dir   string
}

// startNode starts an engine against c with a Badger store in dir (a new
// temp dir when empty), registers h as handler "h", and waits until ready.
func startNode(t *testing.T, c *etcdtest.Cluster, dir string, h HandlerFunc, tweak func(*Config)) *testNode {
	t.Helper()
	return startNodeOn(t, c.Client, dir, h, tweak)
}

func (n *testNode) stop(t *testing.T) {
	if n.e == nil {
		return
	}
	if err := n.e.Close(); err != nil {
		t.Errorf("close engine: %v", err)
	}
	if err := n.store.Close(); err != nil {
		t.Errorf("close store: %v", err)
	}
	n.e = nil
}

func handlerTask(id, spec string) *task.Task {
	return &task.Task{ID: id, Schedule: spec, Executor: task.Executor{Type: task.ExecutorHandler, Name: "h"}}
}

func putTask(t *testing.T, r *registry.Registry, tsk *task.Task) *task.Task {
	t.Helper()
	got, err := r.Put(context.Background(), tsk, registry.PutOptions{})
	if err != nil {
		t.Fatalf("put %s: %v", tsk.ID, err)
	}
	return got
}
