package registry

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// fillRegistry writes n noop tasks job-0000000... with labels g (i % 10000:
// 100 tasks per value at 1 M) and team (i % 10), through PutBatch as an
// import does, and returns how long it took.
func fillRegistry(b *testing.B, reg *Registry, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	batch := make([]*task.Task, 0, MaxBatchItems)
	for i := range n {
		tsk := noopTask(fmt.Sprintf("job-%07d", i), "@yearly")
		tsk.Labels = map[string]string{"g": fmt.Sprint(i % 10000), "team": fmt.Sprint(i % 10)}
		batch = append(batch, tsk)
		if len(batch) == cap(batch) || i == n-1 {
			if res, err := reg.PutBatch(ctx, batch); err != nil || len(res.Errors) > 0 {
				b.Fatalf("fill: %v %v", err, res.Errors)
			}
			batch = batch[:0]
		}
	}
	return time.Since(start)
}

// BenchmarkIndex measures queries and the export at fleet size, on one
// embedded etcd holding n tasks with their index:
//
//	go test -run '^$' -bench 'Index/n=1000000/query' -benchtime 100x ./registry/
//	go test -run '^$' -bench 'Index/n=1000000/export' -benchtime 1x ./registry/
//
// query=prefix100: the first page of the 100 ids with a prefix;
// query=label100: the first page of the 100 tasks with a label;
// query=page1000: a page of 1000 without a filter, from the middle;
// query=labels2: two labels whose intersection is 10 tasks; each query
// with client=one (the registry's one client) and client=index (the
// index read through a client of its own, as nodes do);
// export: every task, reported as tasks/s (one iteration is the fleet).
func BenchmarkIndex(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			c := etcdtest.Start(b)
			reg, err := OpenRegistry(context.Background(), c.Client, "/bench", 1024)
			if err != nil {
				b.Fatal(err)
			}
			took := fillRegistry(b, reg, n)
			b.Logf("filled %d tasks in %s (%.0f tasks/s)", n, took.Round(time.Millisecond), float64(n)/took.Seconds())
			ctx := context.Background()
			// client=index reads the index through a client of its own, as
			// nodes do (IndexDialOptions); client=one through the client
			// that wrote the fleet, whose window gRPC has grown.
			icli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialOptions: IndexDialOptions()})
			if err != nil {
				b.Fatal(err)
			}
			defer icli.Close()
			regs := map[string]*Registry{"one": reg}
			if regs["index"], err = OpenRegistry(ctx, c.Client, "/bench", 1024, WithIndexClient(icli)); err != nil {
				b.Fatal(err)
			}
			queries := []struct {
				name string
				opts ListOptions
				want int
			}{
				{"query=prefix100", ListOptions{Prefix: fmt.Sprintf("job-%05d", n/100/2), Limit: 100}, 100},
				{"query=label100", ListOptions{Labels: map[string]string{"g": "4321"}, Limit: 100}, n / 10000},
				{"query=page1000", ListOptions{Cursor: fmt.Sprintf("job-%07d", n/2), Limit: 1000}, 1000},
				{"query=labels2", ListOptions{Labels: map[string]string{"g": "4321", "team": "1"}, Limit: 100}, n / 10000},
			}
			for _, q := range queries {
				for _, client := range []string{"one", "index"} {
					reg := regs[client]
					b.Run(q.name+"/client="+client, func(b *testing.B) {
						lat := make([]time.Duration, 0, b.N)
						b.ReportAllocs()
						b.ResetTimer()
						for range b.N {
							start := time.Now()
							tasks, _, err := reg.List(ctx, q.opts)
							lat = append(lat, time.Since(start))
							if err != nil || len(tasks) != q.want {
								b.Fatalf("%d tasks, %v; want %d", len(tasks), err, q.want)
							}
						}
						b.StopTimer()
						slices.Sort(lat)
						b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
					})
				}
			}
			b.Run("export", func(b *testing.B) {
				b.ResetTimer()
				start := time.Now()
				total := 0
				for range b.N {
					got, _, err := reg.Export(ctx, task.Selector{}, func([]byte) error { return nil })
					if err != nil || got != n {
						b.Fatalf("exported %d, %v; want %d", got, err, n)
					}
					total += got
				}
				b.ReportMetric(float64(total)/time.Since(start).Seconds(), "tasks/s")
			})
		})
	}
}

// BenchmarkIndexEtcdBytes reports etcd's database in use per task, with
// the index and without it (as clusters before it were written), for
// tasks with two labels:
//
//	go test -run '^$' -bench IndexEtcdBytes -benchtime 1x ./registry/
func BenchmarkIndexEtcdBytes(b *testing.B) {
	const n = 100_000
	for _, index := range []bool{false, true} {
		b.Run(fmt.Sprintf("n=%d/index=%v", n, index), func(b *testing.B) {
			c := etcdtest.Start(b)
			ctx := context.Background()
			reg, err := OpenRegistry(ctx, c.Client, "/bench", 1024)
			if err != nil {
				b.Fatal(err)
			}
			reg.noIndex = !index
			size := func() int64 {
				if _, err := c.Client.Compact(ctx, revision(b, c.Client), clientv3.WithCompactPhysical()); err != nil {
					b.Fatal(err)
				}
				st, err := c.Client.Status(ctx, c.Client.Endpoints()[0])
				if err != nil {
					b.Fatal(err)
				}
				return st.DbSizeInUse
			}
			before := size()
			took := fillRegistry(b, reg, n)
			after := size()
			b.ReportMetric(float64(after-before)/n, "etcd-bytes/task")
			b.ReportMetric(float64(n)/took.Seconds(), "put-tasks/s")
		})
	}
}
