package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// bulkFleet writes n tasks "fleet/<i>", every other one labelled
// team=billing, the others team=ads.
func bulkFleet(t *testing.T, reg *Registry, n int) {
	t.Helper()
	tasks := make([]*task.Task, n)
	for i := range tasks {
		team := "ads"
		if i%2 == 0 {
			team = "billing"
		}
		tasks[i] = noopTask(fmt.Sprintf("fleet/%04d", i), "@every 1h")
		tasks[i].Labels = map[string]string{"team": team}
	}
	if res, err := reg.PutBatch(context.Background(), tasks); err != nil || len(res.Errors) > 0 {
		t.Fatalf("put fleet: %v %v", err, res.Errors)
	}
}

func pausedCount(t *testing.T, reg *Registry, labels map[string]string) (paused, total int) {
	t.Helper()
	opts := ListOptions{Prefix: "fleet/", Labels: labels}
	for {
		page, next, err := reg.List(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, tsk := range page {
			total++
			if tsk.Paused {
				paused++
			}
		}
		if next == "" {
			return paused, total
		}
		opts.Cursor = next
	}
}

// TestRegistry_Bulk pauses, resumes, triggers and deletes by selector over
// more tasks than one transaction and one read page hold: dry runs write
// nothing, counts add up, and the writes go in transactions of at most
// 128 tasks (each successful transaction moves etcd's revision by one).
func TestRegistry_Bulk(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/bulk")
	ctx := context.Background()
	const n = 1100 // 550 billing: five transactions; more than two read pages
	bulkFleet(t, reg, n)
	billing := map[string]string{"team": "billing"}

	rev := revision(t, c.Client)
	res, err := reg.BulkPause(ctx, task.Selector{Labels: billing, DryRun: true}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != n/2 || res.Changed != n/2 || !res.DryRun || len(res.Sample) != task.BulkSampleSize {
		t.Fatalf("dry run: %+v", res)
	}
	if got := revision(t, c.Client); got != rev {
		t.Fatalf("a dry run moved the revision from %d to %d", rev, got)
	}
	if p, _ := pausedCount(t, reg, nil); p != 0 {
		t.Fatalf("a dry run paused %d tasks", p)
	}

	res, err = reg.BulkPause(ctx, task.Selector{Labels: billing}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != n/2 || res.Changed != n/2 || res.Unchanged != 0 || res.Skipped != 0 {
		t.Fatalf("pause: %+v", res)
	}
	wantTxns := int64((n/2 + MaxTxnOps - 1) / MaxTxnOps)
	if got := revision(t, c.Client) - rev; got != wantTxns {
		t.Fatalf("pause of %d tasks took %d transactions, want %d of at most %d", n/2, got, wantTxns, MaxTxnOps)
	}
	if p, total := pausedCount(t, reg, billing); p != total || total != n/2 {
		t.Fatalf("billing: %d of %d paused, want all %d", p, total, n/2)
	}
	if p, _ := pausedCount(t, reg, map[string]string{"team": "ads"}); p != 0 {
		t.Fatalf("ads: %d paused, want none", p)
	}

	res, err = reg.BulkPause(ctx, task.Selector{Prefix: "fleet/00"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 100 || res.Changed != 50 || res.Unchanged != 50 {
		t.Fatalf("pause by prefix fleet/00: %+v, want 100 matched, 50 changed, 50 already paused", res)
	}

	res, err = reg.Bulk(ctx, task.BulkResume, task.Selector{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != n || res.Changed != n/2+50 {
		t.Fatalf("resume all: %+v", res)
	}
	if p, _ := pausedCount(t, reg, nil); p != 0 {
		t.Fatalf("%d tasks still paused after resume all", p)
	}

	res, err = reg.Bulk(ctx, task.BulkTrigger, task.Selector{Prefix: "fleet/001"})
	if err != nil {
		t.Fatal(err)
	}
	trig, err := c.Client.Get(ctx, reg.keys.triggers(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if res.Changed != 10 || trig.Count != 10 {
		t.Fatalf("trigger fleet/001*: %+v, %d trigger requests written, want 10", res, trig.Count)
	}

	res, err = reg.Bulk(ctx, task.BulkDelete, task.Selector{Prefix: "fleet/0", Labels: map[string]string{"team": "ads"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Changed != 500 {
		t.Fatalf("delete ads under fleet/0: %+v, want 500", res)
	}
	if _, total := pausedCount(t, reg, nil); total != n-500 {
		t.Fatalf("%d tasks left, want %d", total, n-500)
	}
}

// TestRegistry_BulkRefusesEmptySelector: a selector without prefix, labels
// or all is refused and writes nothing, as are contradictory ones and
// unknown actions.
func TestRegistry_BulkRefusesEmptySelector(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/bulkbad")
	bulkFleet(t, reg, 4)
	rev := revision(t, c.Client)
	for _, tc := range []struct {
		action task.BulkAction
		sel    task.Selector
	}{
		{task.BulkDelete, task.Selector{}},
		{task.BulkPause, task.Selector{DryRun: true}},
		{task.BulkDelete, task.Selector{All: true, Prefix: "fleet/"}},
		{task.BulkPause, task.Selector{Labels: map[string]string{"": "x"}}},
		{"explode", task.Selector{All: true}},
		{task.BulkResume, task.Selector{All: true, Note: "a pause's"}},
		{task.BulkPause, task.Selector{All: true, Note: strings.Repeat("x", task.MaxPauseNote+1)}},
	} {
		res, err := reg.Bulk(context.Background(), tc.action, tc.sel)
		if tc.action == task.BulkPause {
			res, err = reg.BulkPause(context.Background(), tc.sel, "test")
		}
		var ve *task.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("%s %+v: err %v, want a *ValidationError", tc.action, tc.sel, err)
		}
		if res.Matched != 0 || res.Changed != 0 {
			t.Errorf("%s %+v: %+v, want nothing done", tc.action, tc.sel, res)
		}
	}
	if got := revision(t, c.Client); got != rev {
		t.Fatalf("refused bulk actions moved the revision from %d to %d", rev, got)
	}
}

// TestRegistry_BulkRereadsChangedTasks: when another writer changes a task
// between the bulk read and its write, the transaction writes nothing and
// each task is read again: one that no longer matches is skipped, one
// that still does is changed.
func TestRegistry_BulkRereadsChangedTasks(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/bulkrace")
	ctx := context.Background()
	bulkFleet(t, reg, 4) // fleet/0000 and fleet/0002 are billing
	sel := task.Selector{Labels: map[string]string{"team": "billing"}}

	var items []bulkItem
	rec := &task.Pause{Note: "INC-9", By: "test", At: time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)}
	for _, id := range []string{"fleet/0000", "fleet/0002"} {
		resp, err := c.Client.Get(ctx, reg.key(id))
		if err != nil {
			t.Fatal(err)
		}
		it, change, ok, err := reg.bulkMatch(task.BulkPause, sel, rec, resp.Kvs[0])
		if err != nil || !ok || !change {
			t.Fatalf("match %s: %v %v %v", id, ok, change, err)
		}
		items = append(items, it)
	}
	// Another writer moves fleet/0000 to another team and reschedules
	// fleet/0002, after the bulk read.
	moved, err := reg.Get(ctx, "fleet/0000")
	if err != nil {
		t.Fatal(err)
	}
	moved.Labels = map[string]string{"team": "ads"}
	putTask(t, reg, moved)
	resched, err := reg.Get(ctx, "fleet/0002")
	if err != nil {
		t.Fatal(err)
	}
	resched.Schedule = "@every 2h"
	putTask(t, reg, resched)

	var res task.BulkResult
	if err := reg.bulkCommit(ctx, task.BulkPause, sel, rec, items, &res); err != nil {
		t.Fatal(err)
	}
	if res.Changed != 1 || res.Skipped != 1 {
		t.Fatalf("%+v, want 1 changed and 1 skipped", res)
	}
	if got, _ := reg.Get(ctx, "fleet/0000"); got.Paused {
		t.Fatal("fleet/0000 left team billing before the write and was paused anyway")
	}
	got, _ := reg.Get(ctx, "fleet/0002")
	if !got.Paused || got.Schedule != "@every 2h" || got.Pause == nil || got.Pause.Note != rec.Note || got.Pause.By != rec.By || !got.Pause.At.Equal(rec.At) {
		t.Fatalf("fleet/0002: paused %v schedule %q, record %+v; want paused with the other writer's schedule, and the record %+v", got.Paused, got.Schedule, got.Pause, rec)
	}
}

// TestRegistry_BulkReadsTheIndex selects by prefix and by label through the
// index: the matches come in id order (the task keys are in partition
// order), at one revision, and only the selected tasks change.
func TestRegistry_BulkReadsTheIndex(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/bulkindex")
	ctx := context.Background()
	bulkFleet(t, reg, 300)
	other := noopTask("fleetx", "@every 1h") // shares the prefix "fleet" only
	if _, err := reg.Put(ctx, other, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := reg.BulkPause(ctx, task.Selector{Prefix: "fleet/01", DryRun: true}, "test")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"fleet/0100", "fleet/0101", "fleet/0102", "fleet/0103", "fleet/0104",
		"fleet/0105", "fleet/0106", "fleet/0107", "fleet/0108", "fleet/0109"}
	if res.Matched != 100 || res.Changed != 100 || !slices.Equal(res.Sample, want) {
		t.Errorf("dry run by prefix: %+v; want 100 matched, sample %v", res, want)
	}
	res, err = reg.BulkPause(ctx, task.Selector{Prefix: "fleet/", Labels: map[string]string{"team": "ads"}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 150 || res.Changed != 150 || res.Sample[0] != "fleet/0001" || res.Sample[1] != "fleet/0003" {
		t.Errorf("pause by label: %+v; want 150 changed, sample fleet/0001, fleet/0003, ...", res)
	}
	if paused, total := pausedCount(t, reg, map[string]string{"team": "ads"}); paused != 150 || total != 150 {
		t.Errorf("team=ads: %d of %d paused, want 150 of 150", paused, total)
	}
	if paused, _ := pausedCount(t, reg, map[string]string{"team": "billing"}); paused != 0 {
		t.Errorf("team=billing: %d paused, want 0", paused)
	}
}

// BenchmarkBulkTrigger measures a bulk trigger of a whole fleet of n
// tasks (its triggers deleted between rounds, as owners do once fired):
//
//	go test -run '^$' -bench 'BulkTrigger' -benchtime 3x ./registry/
func BenchmarkBulkTrigger(b *testing.B) {
	const n = 100_000
	c, reg := bulkBenchFleet(b, n)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		res, err := reg.Bulk(ctx, task.BulkTrigger, task.Selector{All: true})
		if err != nil || res.Changed != n {
			b.Fatalf("Bulk = %+v, %v; want %d changed", res, err, n)
		}
		b.StopTimer()
		if _, err := c.Client.Delete(ctx, reg.keys.triggers(), clientv3.WithPrefix()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkBulkPause measures a bulk pause of a whole fleet of n tasks
// (resumed between rounds), each task written with its pause record, and
// with a note of note bytes:
//
//	go test -run '^$' -bench 'BulkPause' -benchtime 3x ./registry/
func BenchmarkBulkPause(b *testing.B) {
	const n = 100_000
	_, reg := bulkBenchFleet(b, n)
	ctx := context.Background()
	for _, note := range []int{0, task.MaxPauseNote} {
		b.Run(fmt.Sprintf("note=%d", note), func(b *testing.B) {
			sel := task.Selector{All: true, Note: strings.Repeat("x", note)}
			for range b.N {
				res, err := reg.BulkPause(ctx, sel, "bench")
				if err != nil || res.Changed != n {
					b.Fatalf("BulkPause = %+v, %v; want %d changed", res, err, n)
				}
				b.StopTimer()
				if res, err := reg.Bulk(ctx, task.BulkResume, task.Selector{All: true}); err != nil || res.Changed != n {
					b.Fatalf("resume: %+v, %v", res, err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}

// bulkBenchFleet is a registry of 1024 partitions on an etcd of its own,
// holding a fleet of n tasks (fillRegistry).
func bulkBenchFleet(b *testing.B, n int) (*etcdtest.Cluster, *Registry) {
	b.Helper()
	c := etcdtest.Start(b)
	reg, err := OpenRegistry(context.Background(), c.Client, "/bench", 1024)
	if err != nil {
		b.Fatal(err)
	}
	fillRegistry(b, reg, n)
	return c, reg
}

// A bulk pause of large tasks writes them in transactions of at most
// MaxTxnBytes, inside etcd's request limit (1.5 MiB): 40 tasks of 50 KB
// are not one transaction, which etcd would refuse.
func TestRegistry_BulkPauseOfLargeTasksStaysWithinEtcdsRequestLimit(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/bulklarge")
	ctx := context.Background()
	var tasks []*task.Task
	for i := range 40 {
		tasks = append(tasks, &task.Task{ID: fmt.Sprintf("large/%02d", i), Schedule: "@hourly",
			Executor: task.Executor{Type: task.ExecutorHTTP, URL: "http://127.0.0.1/", Body: strings.Repeat("x", 50000)}})
	}
	if res, err := reg.PutBatch(ctx, tasks); err != nil || res.Written != len(tasks) {
		t.Fatalf("put: written %d, %v %v", res.Written, res.Errors, err)
	}
	res, err := reg.BulkPause(ctx, task.Selector{Prefix: "large/"}, "test")
	if err != nil || res.Changed != len(tasks) {
		t.Errorf("bulk pause of %d large tasks: %+v, %v; want all changed", len(tasks), res, err)
	}
}

// A bulk action etcd refuses (its NOSPACE alarm) returns etcd's error,
// with nothing changed.
func TestRegistry_BulkStoppedByEtcdReturnsItsError(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.NewClient(t), "/bulknospace")
	bulkFleet(t, reg, 3)
	c.RaiseNoSpace(t)
	defer c.ClearNoSpace(t)
	res, err := reg.BulkPause(context.Background(), task.Selector{Prefix: "fleet/"}, "test")
	if !errors.Is(err, ErrNoSpace) || res.Changed != 0 {
		t.Errorf("a bulk pause etcd refuses: %+v, %v; want nothing changed and etcd's NOSPACE", res, err)
	}
}
