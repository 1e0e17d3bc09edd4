package registry

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/ring"
	"github.com/shardcron/shardcron/task"
)

// revision returns etcd's current revision: a request that writes nothing
// leaves it where it was.
func revision(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/revision-probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func openRegistry(t *testing.T, cli *clientv3.Client, prefix string) *Registry {
	t.Helper()
	r, err := OpenRegistry(context.Background(), cli, prefix, 16)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func noopTask(id, spec string) *task.Task {
	return &task.Task{ID: id, Schedule: spec, Executor: task.Executor{Type: task.ExecutorNoop}}
}

// TestRegistry_RefusesBadInput is docs/design.md invariant 8: every kind of bad
// input is refused with a *ValidationError naming the field, through each
// way in (DecodeTask for JSON, Put and PutBatch for Go values), and etcd's
// revision does not move.
func TestRegistry_RefusesBadInput(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/bad")
	ctx := context.Background()
	putTask(t, reg, noopTask("existing", "* * * * *")) // a task that bad input must not change

	big := strings.Repeat("b", 80<<10)
	with := func(f func(*task.Task)) *task.Task {
		tsk := &task.Task{ID: "existing", Schedule: "* * * * *", Executor: task.Executor{Type: task.ExecutorNoop}}
		f(tsk)
		return tsk
	}
	tests := []struct {
		name  string
		doc   string     // the input as JSON
		task  *task.Task // the same as a Go value; nil when only JSON can be malformed
		field string
	}{
		{"invalid schedule", `{"id": "existing", "schedule": "61 * * * * *", "executor": {"type": "noop"}}`,
			with(func(t *task.Task) { t.Schedule = "61 * * * * *" }), "schedule"},
		{"never fires", `{"id": "existing", "schedule": "0 0 30 2 *", "executor": {"type": "noop"}}`,
			with(func(t *task.Task) { t.Schedule = "0 0 30 2 *" }), "schedule"},
		{"TZ= prefix", `{"id": "existing", "schedule": "TZ=Europe/Berlin * * * * *", "executor": {"type": "noop"}}`,
			with(func(t *task.Task) { t.Schedule = "TZ=Europe/Berlin * * * * *" }), "schedule"},
		{"unknown time zone", `{"id": "existing", "schedule": "* * * * *", "timezone": "Mars/Olympus", "executor": {"type": "noop"}}`,
			with(func(t *task.Task) { t.Timezone = "Mars/Olympus" }), "timezone"},
		{"oversized", `{"id": "existing", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "body": "` + big + `"}}`,
			with(func(t *task.Task) { t.Executor = task.Executor{Type: task.ExecutorHTTP, URL: "http://x/", Body: big} }), ""},
		{"malformed JSON", `{"id": "existing", "schedule": "* * * * *",`, nil, ""},
		{"unknown executor", `{"id": "existing", "schedule": "* * * * *", "executor": {"type": "ftp"}}`,
			with(func(t *task.Task) { t.Executor.Type = "ftp" }), "executor.type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				var ve *task.ValidationError
				if !errors.As(err, &ve) {
					t.Fatalf("%s: error %v (%T) is not a *ValidationError", how, err, err)
				}
				if ve.Field != tt.field {
					t.Errorf("%s: field %q, want %q (%v)", how, ve.Field, tt.field, err)
				}
			}
			before := revision(t, c.Client)

			_, err := task.DecodeTask([]byte(tt.doc))
			check("DecodeTask", err)
			if tt.task != nil {
				_, err = reg.Put(ctx, tt.task, PutOptions{})
				check("Put", err)
				_, err = reg.Put(ctx, tt.task, PutOptions{IfVersion: 1})
				check("Put with IfVersion", err)
				res, err := reg.PutBatch(ctx, []*task.Task{tt.task})
				if err != nil || res.Written != 0 || len(res.Errors) != 1 || res.Errors[0].Index != 0 {
					t.Errorf("PutBatch: %+v, err %v; want 0 written and the item's error", res, err)
				} else if tt.field != "" && !strings.HasPrefix(res.Errors[0].Error, tt.field+": ") {
					t.Errorf("PutBatch: error %q does not name %s", res.Errors[0].Error, tt.field)
				}
			}

			if after := revision(t, c.Client); after != before {
				t.Errorf("etcd revision moved from %d to %d", before, after)
			}
			got, err := reg.Get(ctx, "existing")
			if err != nil || got.Schedule != "* * * * *" || got.Executor.Type != task.ExecutorNoop {
				t.Errorf("the stored task changed: %+v, %v", got, err)
			}
		})
	}
}

// TestRegistry is the registry's contract on a real etcd: optimistic
// concurrency, puts that change nothing, pagination and filters, batches,
// missing tasks, and the fixed partition count.
func TestRegistry(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()

	t.Run("backfill running", func(t *testing.T) {
		reg := openRegistry(t, c.Client, "/backfill")
		putTask(t, reg, noopTask("b", "0 * * * *"))
		to := time.Now().UTC().Truncate(time.Hour)
		if _, err := reg.Backfill(ctx, "b", to.Add(-3*time.Hour), to, 1); err != nil {
			t.Fatal(err)
		}
		// No node runs it: it stays running, with no fire done yet.
		_, err := reg.Backfill(ctx, "b", to.Add(-3*time.Hour), to, 1)
		if !errors.Is(err, ErrBackfillRunning) || !strings.Contains(err.Error(), "0 of its 4 fires done") ||
			strings.Contains(err.Error(), "through") {
			t.Errorf("a second backfill: %v, want ErrBackfillRunning with its progress and no time through", err)
		}
	})

	t.Run("if-match", func(t *testing.T) {
		reg := openRegistry(t, c.Client, "/ifmatch")
		v1 := putTask(t, reg, noopTask("a", "* * * * *")).Version
		before := revision(t, c.Client)
		for _, v := range []int64{v1 + 1000, v1 - 1} {
			if _, err := reg.Put(ctx, noopTask("a", "0 * * * *"), PutOptions{IfVersion: v}); !errors.Is(err, ErrVersionMismatch) {
				t.Errorf("put with version %d (stored %d): %v, want ErrVersionMismatch", v, v1, err)
			}
		}
		if _, err := reg.Put(ctx, noopTask("new", "0 * * * *"), PutOptions{IfVersion: v1}); !errors.Is(err, ErrVersionMismatch) {
			t.Errorf("put of a missing task with a version: %v, want ErrVersionMismatch", err)
		}
		if after := revision(t, c.Client); after != before {
			t.Errorf("refused puts moved the revision from %d to %d", before, after)
		}
		if got, err := reg.Get(ctx, "a"); err != nil || got.Schedule != "* * * * *" || got.Version != v1 {
			t.Errorf("after refused puts: %+v, %v", got, err)
		}
		if _, err := reg.Get(ctx, "new"); !errors.Is(err, ErrNotFound) {
			t.Errorf("a refused create was stored: %v", err)
		}

		v2, err := reg.Put(ctx, noopTask("a", "0 * * * *"), PutOptions{IfVersion: v1})
		if err != nil || v2.Version <= v1 || v2.Schedule != "0 * * * *" {
			t.Fatalf("put with the stored version: %+v, %v", v2, err)
		}
		if _, err := reg.Put(ctx, noopTask("a", "1 * * * *"), PutOptions{IfVersion: v1}); !errors.Is(err, ErrVersionMismatch) {
			t.Errorf("put with a stale version: %v, want ErrVersionMismatch", err)
		}
	})

	t.Run("delete if version", func(t *testing.T) {
		reg := openRegistry(t, c.Client, "/delif")
		v1 := putTask(t, reg, noopTask("a", "* * * * *")).Version
		v2 := putTask(t, reg, noopTask("a", "0 * * * *")).Version // a concurrent edit
		before := revision(t, c.Client)
		if err := reg.DeleteIfVersion(ctx, "a", v1); !errors.Is(err, ErrVersionMismatch) {
			t.Errorf("delete of an edited task: %v, want ErrVersionMismatch", err)
		}
		if after := revision(t, c.Client); after != before {
			t.Errorf("a refused delete moved the revision from %d to %d", before, after)
		}
		if err := reg.DeleteIfVersion(ctx, "a", v2); err != nil {
			t.Fatalf("delete at the stored version: %v", err)
		}
		if _, err := reg.Get(ctx, "a"); !errors.Is(err, ErrNotFound) {
			t.Errorf("after the delete: %v, want ErrNotFound", err)
		}
		if err := reg.DeleteIfVersion(ctx, "a", v2); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete of a deleted task: %v, want ErrNotFound", err)
		}
	})

	t.Run("idempotent put", func(t *testing.T) {
		reg := openRegistry(t, c.Client, "/idem")
		first := putTask(t, reg, noopTask("a", "* * * * *"))
		before := revision(t, c.Client)
		again, err := reg.Put(ctx, noopTask("a", "* * * * *"), PutOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if again.Version != first.Version || !again.UpdatedAt.Equal(first.UpdatedAt) || !again.CreatedAt.Equal(first.CreatedAt) {
			t.Errorf("second put: version %d updated %v, first: version %d updated %v",
				again.Version, again.UpdatedAt, first.Version, first.UpdatedAt)
		}
		// With the version it has: still nothing to write.
		if again, err = reg.Put(ctx, noopTask("a", "* * * * *"), PutOptions{IfVersion: first.Version}); err != nil || again.Version != first.Version {
			t.Errorf("second put with If-Match: %+v, %v", again, err)
		}
		if after := revision(t, c.Client); after != before {
			t.Errorf("an unchanged put moved the revision from %d to %d", before, after)
		}
		// A real change keeps created_at and moves updated_at.
		changed := putTask(t, reg, noopTask("a", "0 * * * *"))
		if !changed.CreatedAt.Equal(first.CreatedAt) || changed.Version <= first.Version {
			t.Errorf("after a change: created %v version %d, before: created %v version %d",
				changed.CreatedAt, changed.Version, first.CreatedAt, first.Version)
		}
	})

	// An import of an export creates its tasks with their created_at, which
	// max_fires counts from; a later write keeps the first, and one yet
	// to come is now.
	t.Run("created_at given", func(t *testing.T) {
		reg := openRegistry(t, c.Client, "/created")
		then := time.Now().Add(-time.Hour).UTC().Truncate(time.Millisecond)
		given := noopTask("a", "* * * * *")
		given.CreatedAt = then
		if got := putTask(t, reg, given); !got.CreatedAt.Equal(then) {
			t.Errorf("created %v, want the %v given", got.CreatedAt, then)
		}
		again := noopTask("a", "0 * * * *")
		again.CreatedAt = then.Add(time.Minute)
		if got := putTask(t, reg, again); !got.CreatedAt.Equal(then) {
			t.Errorf("after an update: created %v, want the first %v", got.CreatedAt, then)
		}
		future := noopTask("b", "* * * * *")
		future.CreatedAt = time.Now().Add(time.Hour)
		if got := putTask(t, reg, future); !got.CreatedAt.Before(future.CreatedAt) || got.CreatedAt.Before(then) {
			t.Errorf("a created_at yet to come: stored %v, want now", got.CreatedAt)
		}
	})

	t.Run("list", func(t *testing.T) {
		reg := openRegistry(t, c.Client, "/list")
		var all []*task.Task
		for _, team := range []string{"a", "b"} {
			for i := range 15 {
				tsk := noopTask(fmt.Sprintf("%s/%02d", team, i), "* * * * *")
				tsk.Labels = map[string]string{"team": team, "env": []string{"prod", "dev"}[i%2]}
				all = append(all, tsk)
			}
		}
		if res, err := reg.PutBatch(ctx, all); err != nil || res.Written != len(all) || len(res.Errors) > 0 {
			t.Fatalf("batch: written %d, errors %v, err %v", res.Written, res.Errors, err)
		}
		// list pages through with opts and returns the ids in order.
		list := func(t *testing.T, opts ListOptions) []string {
			t.Helper()
			var ids []string
			for page := 0; ; page++ {
				if page > 100 {
					t.Fatal("the cursor never ends")
				}
				tasks, next, err := reg.List(ctx, opts)
				if err != nil {
					t.Fatal(err)
				}
				if limit := cmp.Or(opts.Limit, DefaultListLimit); len(tasks) > limit || (next != "" && len(tasks) != limit) {
					t.Errorf("page of %d tasks, limit %d, next cursor %q: want full pages", len(tasks), limit, next)
				}
				for _, tsk := range tasks {
					if tsk.Partition == nil || *tsk.Partition != reg.Partition(tsk.ID) || tsk.Version == 0 {
						t.Errorf("listed %s without its partition and version: %+v", tsk.ID, tsk)
					}
					ids = append(ids, tsk.ID)
				}
				if next == "" {
					return ids
				}
				opts.Cursor = next
			}
		}
		// want returns the ids of all that match, in id order.
		want := func(match func(*task.Task) bool) []string {
			var ids []string
			for _, tsk := range all {
				if match(tsk) {
					ids = append(ids, tsk.ID)
				}
			}
			slices.Sort(ids)
			return ids
		}
		tests := []struct {
			name  string
			opts  ListOptions
			match func(*task.Task) bool
		}{
			{"everything in one page", ListOptions{}, func(*task.Task) bool { return true }},
			{"pages of 7", ListOptions{Limit: 7}, func(*task.Task) bool { return true }},
			{"pages of 10", ListOptions{Limit: 10}, func(*task.Task) bool { return true }},
			{"prefix", ListOptions{Prefix: "a/", Limit: 4}, func(t *task.Task) bool { return strings.HasPrefix(t.ID, "a/") }},
			{"label", ListOptions{Labels: map[string]string{"env": "dev"}, Limit: 3},
				func(t *task.Task) bool { return t.Labels["env"] == "dev" }},
			{"labels and prefix", ListOptions{Prefix: "b/", Labels: map[string]string{"team": "b", "env": "prod"}, Limit: 2},
				func(t *task.Task) bool { return t.Labels["team"] == "b" && t.Labels["env"] == "prod" }},
			{"no match", ListOptions{Labels: map[string]string{"team": "c"}}, func(*task.Task) bool { return false }},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if got, want := list(t, tt.opts), want(tt.match); !slices.Equal(got, want) {
					t.Errorf("listed %v,\nwant   %v", got, want)
				}
			})
		}
		t.Run("limit bounds", func(t *testing.T) {
			for _, limit := range []int{-1, MaxListLimit + 1} {
				var ve *task.ValidationError
				if _, _, err := reg.List(ctx, ListOptions{Limit: limit}); !errors.As(err, &ve) || ve.Field != "limit" {
					t.Errorf("List with limit %d: %v, want a *ValidationError on limit", limit, err)
				}
			}
			if tasks, _, err := reg.List(ctx, ListOptions{Limit: MaxListLimit}); err != nil || len(tasks) != len(all) {
				t.Errorf("List with limit %d: %d tasks, %v; want all %d", MaxListLimit, len(tasks), err, len(all))
			}
		})
		t.Run("bad cursor", func(t *testing.T) {
			var ve *task.ValidationError
			if _, _, err := reg.List(ctx, ListOptions{Cursor: "not\x01an id"}); !errors.As(err, &ve) || ve.Field != "cursor" {
				t.Errorf("List with a bad cursor: %v, want a *ValidationError on cursor", err)
			}
		})
	})

	t.Run("batch", func(t *testing.T) {
		reg := openRegistry(t, c.Client, "/batch")
		bad := noopTask("bad-zone", "* * * * *")
		bad.Timezone = "Nowhere/Else"
		batch := []*task.Task{
			noopTask("ok/1", "* * * * *"),
			noopTask("bad-schedule", "61 * * * * *"),
			noopTask("ok/2", "0 * * * *"),
			{ID: "bad-executor", Schedule: "* * * * *", Executor: task.Executor{Type: "ftp"}},
			bad,
			noopTask("ok/1", "30 * * * *"), // the same id again: the later one wins
		}
		res, err := reg.PutBatch(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		if res.Written != 3 {
			t.Errorf("written %d, want 3 (ok/1 twice, ok/2)", res.Written)
		}
		if !slices.Equal(res.Replaced, []int{0}) {
			t.Errorf("replaced %v, want [0] (ok/1's first item)", res.Replaced)
		}
		var idx []int
		for _, e := range res.Errors {
			idx = append(idx, e.Index)
		}
		if !slices.Equal(idx, []int{1, 3, 4}) {
			t.Errorf("errors at %v, want [1 3 4] in that order: %+v", idx, res.Errors)
		}
		for _, e := range res.Errors {
			if field := map[int]string{1: "schedule", 3: "executor.type", 4: "timezone"}[e.Index]; !strings.HasPrefix(e.Error, field+": ") {
				t.Errorf("item %d: error %q does not name %s", e.Index, e.Error, field)
			}
		}
		for id, spec := range map[string]string{"ok/1": "30 * * * *", "ok/2": "0 * * * *"} {
			if got, err := reg.Get(ctx, id); err != nil || got.Schedule != spec {
				t.Errorf("%s: %+v, %v; want schedule %q", id, got, err, spec)
			}
		}
		for _, id := range []string{"bad-schedule", "bad-executor", "bad-zone"} {
			if _, err := reg.Get(ctx, id); !errors.Is(err, ErrNotFound) {
				t.Errorf("%s was stored: %v", id, err)
			}
		}
		// The same batch again writes nothing.
		before := revision(t, c.Client)
		if res, err := reg.PutBatch(ctx, batch); err != nil || res.Written != 3 {
			t.Errorf("batch again: written %d, %v", res.Written, err)
		}
		if after := revision(t, c.Client); after != before {
			t.Errorf("an unchanged batch moved the revision from %d to %d", before, after)
		}

		// An id given twice whose later item is refused as it is written
		// (its chain closes a cycle): neither is written, and each says why.
		y, x := noopTask("dup/y", "@daily"), noopTask("dup/x", "@daily")
		y.OnSuccess, x.OnSuccess = []string{"dup/x"}, []string{"dup/y"}
		res, err = reg.PutBatch(ctx, []*task.Task{y, noopTask("dup/x", "@hourly"), x})
		if err != nil || res.Written != 1 || len(res.Errors) != 2 || res.Errors[0].Index != 1 || res.Errors[1].Index != 2 ||
			!strings.Contains(res.Errors[0].Error, "that item was refused") || !strings.Contains(res.Errors[1].Error, "cycle") || len(res.Replaced) != 0 {
			t.Fatalf("an id twice, the later refused: %+v, %v", res, err)
		}
		if _, err := reg.Get(ctx, "dup/x"); !errors.Is(err, ErrNotFound) {
			t.Errorf("dup/x was stored: %v", err)
		}

		// The same when the later item is refused before any write (its
		// schedule here), and when the caller refused it (PutItems); a
		// valid item after the refused one is the last word.
		res, err = reg.PutItems(ctx, []BatchItem{
			{Task: noopTask("dup/v", "@daily")},
			{Task: noopTask("dup/v", "61 * * * * *")},
			{Task: noopTask("dup/w", "@daily")},
			{ID: "dup/w", Refused: "line 4: malformed JSON"},
			{Task: noopTask("dup/u", "@daily")},
			{Task: noopTask("dup/u", "61 * * * * *")},
			{Task: noopTask("dup/u", "@hourly")},
		})
		var got []string
		for _, e := range res.Errors {
			got = append(got, fmt.Sprintf("%d: %s", e.Index, e.Error))
		}
		want := []string{
			"0: " + RefusedLaterMessage("dup/v"),
			`1: schedule: "61 * * * * *": second 61 out of range 0-59`,
			"2: " + RefusedLaterMessage("dup/w"),
			"3: line 4: malformed JSON",
			`5: schedule: "61 * * * * *": second 61 out of range 0-59`,
		}
		if err != nil || res.Written != 2 || !slices.Equal(got, want) || !slices.Equal(res.Replaced, []int{4}) {
			t.Fatalf("later items refused before the write: written %d, replaced %v, %v; errors:\n%s\nwant:\n%s",
				res.Written, res.Replaced, err, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		for id, found := range map[string]bool{"dup/v": false, "dup/w": false, "dup/u": true} {
			if _, err := reg.Get(ctx, id); errors.Is(err, ErrNotFound) == found {
				t.Errorf("%s stored: %v, want %v", id, !found, found)
			}
		}
	})

	t.Run("not found", func(t *testing.T) {
		reg := openRegistry(t, c.Client, "/missing")
		before := revision(t, c.Client)
		if _, err := reg.Get(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get: %v", err)
		}
		if err := reg.Delete(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Delete: %v", err)
		}
		if _, err := reg.SetPaused(ctx, "nope", true); !errors.Is(err, ErrNotFound) {
			t.Errorf("SetPaused: %v", err)
		}
		if _, err := reg.Trigger(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Trigger: %v", err)
		}
		if after := revision(t, c.Client); after != before {
			t.Errorf("requests on a missing task moved the revision from %d to %d", before, after)
		}
	})

	t.Run("partitions mismatch", func(t *testing.T) {
		openRegistry(t, c.Client, "/fixed") // creates the cluster with 16
		if _, err := OpenRegistry(ctx, c.Client, "/fixed", 32); !errors.Is(err, ErrPartitionsMismatch) {
			t.Errorf("OpenRegistry with 32 partitions: %v, want ErrPartitionsMismatch", err)
		}
		openRegistry(t, c.Client, "/fixed") // 16 still opens
	})

	// A record that does not decode whole is refused, even when the
	// partition count in it decodes: the rest may say anything.
	t.Run("unreadable cluster record", func(t *testing.T) {
		for i, rec := range []string{`not json`, `{"partitions":0}`, `{"partitions":16,"created":"yesterday"}`} {
			prefix := fmt.Sprintf("/unreadable-%d", i)
			if _, err := c.Client.Put(ctx, prefix+"/cluster", rec); err != nil {
				t.Fatal(err)
			}
			if _, err := OpenRegistry(ctx, c.Client, prefix, 16); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("is unreadable: %q", rec)) {
				t.Errorf("OpenRegistry over the record %s: %v, want it unreadable, quoted", rec, err)
			}
		}
	})

	t.Run("partition count bounds", func(t *testing.T) {
		for _, n := range []int{0, ring.MaxPartitions + 1} {
			if _, err := OpenRegistry(ctx, c.Client, fmt.Sprintf("/bounds-%d", n), n); err == nil {
				t.Errorf("OpenRegistry with %d partitions: no error, want one (1 to %d)", n, ring.MaxPartitions)
			}
		}
		for _, n := range []int{1, ring.MaxPartitions} {
			reg, err := OpenRegistry(ctx, c.Client, fmt.Sprintf("/bounds-%d", n), n)
			if err != nil {
				t.Errorf("OpenRegistry with %d partitions: %v", n, err)
				continue
			}
			if got := putTask(t, reg, noopTask("a", "@daily")); *got.Partition != reg.Partition("a") {
				t.Errorf("%d partitions: task stored in partition %d, want %d", n, *got.Partition, reg.Partition("a"))
			}
			// The record written, read back: the cluster opens again.
			if _, err := OpenRegistry(ctx, c.Client, fmt.Sprintf("/bounds-%d", n), n); err != nil {
				t.Errorf("OpenRegistry again with %d partitions: %v", n, err)
			}
		}
	})

	t.Run("ring mismatch", func(t *testing.T) {
		// A cluster whose record predates the ring's settings: the first
		// node that opens it WithRing records its own, and the origin
		// stays (a node's cache is not dropped for it).
		old := openRegistry(t, c.Client, "/ring")
		if _, err := OpenRegistry(ctx, c.Client, "/ring", 16); err != nil {
			t.Fatalf("OpenRegistry without a ring: %v", err)
		}
		first, err := OpenRegistry(ctx, c.Client, "/ring", 16, WithRing(20, 1.25))
		if err != nil {
			t.Fatalf("OpenRegistry with the first ring: %v", err)
		}
		if !bytes.Equal(first.Origin(), old.Origin()) {
			t.Errorf("recording the ring changed the origin from %q to %q", old.Origin(), first.Origin())
		}
		for _, other := range []struct {
			replication int
			load        float64
		}{{200, 1.25}, {20, 3}} {
			if _, err := OpenRegistry(ctx, c.Client, "/ring", 16, WithRing(other.replication, other.load)); !errors.Is(err, ErrRingMismatch) {
				t.Errorf("OpenRegistry with --replication %d --load %g: %v, want ErrRingMismatch", other.replication, other.load, err)
			}
		}
		if _, err := OpenRegistry(ctx, c.Client, "/ring", 16, WithRing(20, 1.25)); err != nil {
			t.Errorf("OpenRegistry with the cluster's ring: %v", err)
		}
		// A new cluster records its ring at once.
		if _, err := OpenRegistry(ctx, c.Client, "/ring-new", 16, WithRing(30, 2)); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenRegistry(ctx, c.Client, "/ring-new", 16, WithRing(20, 1.25)); !errors.Is(err, ErrRingMismatch) {
			t.Errorf("OpenRegistry of a new cluster with another ring: %v, want ErrRingMismatch", err)
		}
	})
}

// A task stored close to the size limit must come back in a form that can
// be PUT back: what responses add (partition, version, state) and what the
// registry adds (defaults, times) must not push it over DecodeTask's limit,
// nor may a pause with the longest note, every byte of it escaped (a task
// 600 bytes short of the limit was taken, and its pause refused).
func TestRegistry_LargeTaskRoundTrips(t *testing.T) {
	c := etcdtest.Start(t)
	r, err := OpenRegistry(context.Background(), c.Client, "", 16)
	if err != nil {
		t.Fatal(err)
	}
	taken := 0
	for i, body := range []string{
		strings.Repeat("x", task.MaxTaskSize-6400), strings.Repeat("x", task.MaxTaskSize-4096), strings.Repeat("x", task.MaxTaskSize-1500), strings.Repeat("x", task.MaxTaskSize-600),
		strings.Repeat("<", task.MaxTaskSize-1500), // HTML-escaped, it would be six times longer
	} {
		size := len(body)
		tsk := &task.Task{ID: fmt.Sprintf("large-%d", i), Schedule: "@hourly",
			Executor: task.Executor{Type: task.ExecutorHTTP, URL: "http://x/", Body: body}}
		got, err := r.Put(context.Background(), tsk, PutOptions{})
		if err != nil {
			var ve *task.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("size %d: %v", size, err)
			}
			continue // refused as a whole: fine, nothing to round-trip
		}
		taken++
		paused, err := r.Pause(context.Background(), tsk.ID, task.Pause{By: strings.Repeat("b", 64), Note: strings.Repeat(`"`, task.MaxPauseNote)})
		if err != nil {
			t.Errorf("size %d: taken, but its pause is refused: %v", size, err)
			continue
		}
		for _, got := range []*task.Task{got, paused} {
			got.State = &task.State{Owner: strings.Repeat("n", 256), LastStatus: "ok", Fires: 1 << 40, Pause: got.Pause}
			b, err := marshalStored(got) // as the API answers: no HTML escaping
			if err != nil {
				t.Fatal(err)
			}
			if _, err := task.DecodeTask(b); err != nil {
				t.Errorf("size %d, paused %v: a stored task's response (%d bytes) cannot be PUT back: %v", size, got.Paused, len(b), err)
			}
		}
	}
	if taken == 0 {
		t.Error("every task was refused: nothing was round-tripped")
	}
}

// The size limit is the task as stored plus responseRoom: a task that
// reaches it exactly is taken, one byte more is refused.
func TestRegistry_PutTakesATaskUpToTheSizeLimit(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/limit")
	stopClocks(reg) // times of one length
	sized := func(n int) *task.Task {
		return &task.Task{ID: "large", Schedule: "@hourly",
			Executor: task.Executor{Type: task.ExecutorHTTP, URL: "http://127.0.0.1/", Body: strings.Repeat("x", n)}}
	}
	tsk := sized(1)
	if err := tsk.Validate(); err != nil { // with its defaults, as Put stores it
		t.Fatal(err)
	}
	small, _, err := reg.encode(tsk, nil)
	if err != nil {
		t.Fatal(err)
	}
	fits := 1 + task.MaxTaskSize - responseRoom - len(small)
	if _, err := reg.Put(context.Background(), sized(fits), PutOptions{}); err != nil {
		t.Errorf("a task at the limit: %v", err)
	}
	var ve *task.ValidationError
	if _, err := reg.Put(context.Background(), sized(fits+1), PutOptions{}); !errors.As(err, &ve) {
		t.Errorf("a task a byte over the limit: %v, want a *ValidationError", err)
	}
}

// A batch of tasks etcd does not hold yet is written without a read first:
// one transaction per 64 tasks (a task and its id index key are 2 of a
// transaction's 128 operations), in chunks of 128 tasks. A batch that finds some of its tasks
// stored reads them in the same transaction, then writes over them: changed
// tasks keep their creation time, identical ones are left alone, new ones
// are written.
func TestRegistry_PutBatchWritesNewTasksWithoutReading(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	var txns atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Txn") {
			txns.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli := interceptedClient(t, c, count)
	reg := openRegistry(t, cli, "/fresh")
	ctx := context.Background()
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	reg.now = func() time.Time { return created }

	var batch []*task.Task
	for i := range 200 {
		batch = append(batch, noopTask(fmt.Sprintf("t/%03d", i), "* * * * *"))
	}
	txns.Store(0)
	if res, err := reg.PutBatch(ctx, batch); err != nil || len(res.Errors) > 0 || res.Written != len(batch) {
		t.Fatalf("new tasks: written %d, errors %v, err %v", res.Written, res.Errors, err)
	}
	if n := txns.Load(); n != 4 {
		t.Errorf("a batch of 200 new tasks took %d transactions, want 4 (64, 64, 64 and 8 tasks, no read)", n)
	}

	updated := created.Add(time.Hour)
	reg.now = func() time.Time { return updated }
	before, err := reg.Get(ctx, "t/010")
	if err != nil {
		t.Fatal(err)
	}
	mixed := []*task.Task{}
	for i := range 10 {
		mixed = append(mixed,
			noopTask(fmt.Sprintf("t/%03d", i), "0 * * * *"),    // changed
			noopTask(fmt.Sprintf("t/%03d", 10+i), "* * * * *"), // identical
			noopTask(fmt.Sprintf("u/%03d", i), "* * * * *"))    // new
	}
	if res, err := reg.PutBatch(ctx, mixed); err != nil || len(res.Errors) > 0 || res.Written != len(mixed) {
		t.Fatalf("mixed batch: written %d, errors %v, err %v", res.Written, res.Errors, err)
	}
	for id, want := range map[string][3]any{
		"t/000": {"0 * * * *", created, updated},
		"t/010": {"* * * * *", created, created},
		"u/000": {"* * * * *", updated, updated},
	} {
		got, err := reg.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Schedule != want[0] || !got.CreatedAt.Equal(want[1].(time.Time)) || !got.UpdatedAt.Equal(want[2].(time.Time)) {
			t.Errorf("%s: schedule %q, created %v, updated %v; want %v", id, got.Schedule, got.CreatedAt, got.UpdatedAt, want)
		}
	}
	if after, err := reg.Get(ctx, "t/010"); err != nil || after.Version != before.Version {
		t.Errorf("an identical task was rewritten: version %d, then %+v, %v", before.Version, after, err)
	}
	checkIndex(t, cli, reg)
}

// A batch that etcd stops (here its NOSPACE alarm, at a chained task,
// which is written alone after the others) still reports its errors in
// index order, as BatchResult says.
func TestRegistry_PutItemsStoppedReportsErrorsInOrder(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.NewClient(t), "/stopped")
	ctx := context.Background()
	b := noopTask("b", "@daily")
	b.OnSuccess = []string{"a"}
	if _, err := reg.Put(ctx, b, PutOptions{AllowMissingTargets: true}); err != nil {
		t.Fatal(err)
	}
	a, later := noopTask("a", "@daily"), noopTask("later", "@daily")
	a.OnSuccess, later.OnSuccess = []string{"b"}, []string{"missing"} // a closes a cycle
	c.RaiseNoSpace(t)
	defer c.ClearNoSpace(t)
	res, err := reg.PutItems(ctx, []BatchItem{{Task: a}, {ID: "z", Refused: "malformed"}, {Task: later}})
	var idx []int
	for _, e := range res.Errors {
		idx = append(idx, e.Index)
	}
	if !errors.Is(err, ErrNoSpace) || !slices.Equal(idx, []int{0, 1}) {
		t.Errorf("errors at %v, %v; want [0 1] and etcd's NOSPACE", idx, err)
	}
}

// A batch that etcd refuses (its NOSPACE alarm) returns etcd's error, not
// a result that reads as if nothing needed writing.
func TestRegistry_PutBatchStoppedByEtcdReturnsItsError(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.NewClient(t), "/nospace")
	c.RaiseNoSpace(t)
	defer c.ClearNoSpace(t)
	res, err := reg.PutBatch(context.Background(), []*task.Task{noopTask("a", "@daily"), noopTask("b", "@daily")})
	if !errors.Is(err, ErrNoSpace) || res.Written != 0 {
		t.Errorf("a batch etcd refuses: written %d, %v; want 0 and etcd's NOSPACE", res.Written, err)
	}
}

// PauseUnlessPaused pauses a running task with its record, and leaves a
// paused one as it is, its record included: etcd's revision does not move.
func TestRegistry_PauseUnlessPausedKeepsAPause(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/pause")
	ctx := context.Background()
	putTask(t, reg, noopTask("p", "* * * * *"))
	policy := task.Pause{By: "pause_on_failure", Note: "failed in a row"}
	if paused, err := reg.PauseUnlessPaused(ctx, "p", policy); err != nil || !paused {
		t.Fatalf("pausing a running task: paused %v, %v", paused, err)
	}
	if got, err := reg.Get(ctx, "p"); err != nil || !got.Paused || got.Pause == nil || got.Pause.By != policy.By {
		t.Fatalf("after the pause: %+v, %v", got, err)
	}
	if _, err := reg.Pause(ctx, "p", task.Pause{By: "alice", Note: "maintenance"}); err != nil {
		t.Fatal(err)
	}
	rev := revision(t, c.Client)
	if paused, err := reg.PauseUnlessPaused(ctx, "p", policy); err != nil || paused {
		t.Fatalf("pausing a paused task: paused %v, %v; want false, nil", paused, err)
	}
	got, err := reg.Get(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if got.Pause == nil || got.Pause.By != "alice" || got.Pause.Note != "maintenance" || revision(t, c.Client) != rev {
		t.Errorf("a paused task's record became %+v (revision %d, was %d); want alice's kept, nothing written", got.Pause, revision(t, c.Client), rev)
	}
}

// Check answers what Put would (the task as stored, or Put's error) and
// writes nothing: etcd's revision does not move.
func TestRegistry_CheckIsAPutThatWritesNothing(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/check")
	ctx := context.Background()
	stored := putTask(t, reg, noopTask("a", "* * * * *"))
	before := revision(t, c.Client)

	got, err := reg.Check(ctx, noopTask("a", "0 * * * *"), PutOptions{IfVersion: stored.Version})
	if err != nil || got.Schedule != "0 * * * *" || got.Version != stored.Version || !got.CreatedAt.Equal(stored.CreatedAt) {
		t.Errorf("check of a change: %+v, %v; want the new schedule at the stored version %d", got, err, stored.Version)
	}
	if got, err := reg.Check(ctx, noopTask("new", "@daily"), PutOptions{}); err != nil || got.Version != 0 || got.ID != "new" {
		t.Errorf("check of a new task: %+v, %v; want it at version 0", got, err)
	}
	var ve *task.ValidationError
	if _, err := reg.Check(ctx, noopTask("a", "61 * * * * *"), PutOptions{}); !errors.As(err, &ve) || ve.Field != "schedule" {
		t.Errorf("check of a bad schedule: %v, want a *ValidationError on schedule", err)
	}
	if _, err := reg.Check(ctx, noopTask("a", "0 * * * *"), PutOptions{IfVersion: stored.Version + 1}); !errors.Is(err, ErrVersionMismatch) {
		t.Errorf("check with a version not stored: %v, want ErrVersionMismatch", err)
	}
	if _, err := reg.Check(ctx, noopTask("new", "@daily"), PutOptions{IfVersion: stored.Version}); !errors.Is(err, ErrVersionMismatch) {
		t.Errorf("check of a missing task with a version: %v, want ErrVersionMismatch", err)
	}
	// Chains are checked, on a new task and on a changed chain.
	for _, id := range []string{"new", "a"} {
		chained := noopTask(id, "@daily")
		chained.OnSuccess = []string{"missing"}
		if _, err := reg.Check(ctx, chained, PutOptions{}); !errors.As(err, &ve) || ve.Field != "on_success[0]" {
			t.Errorf("check of %s chained to a missing task: %v, want a *ValidationError on on_success[0]", id, err)
		}
		if got, err := reg.Check(ctx, chained, PutOptions{AllowMissingTargets: true}); err != nil || !slices.Equal(got.OnSuccess, chained.OnSuccess) {
			t.Errorf("check of %s chained to a missing task, allowed: %+v, %v", id, got, err)
		}
	}
	if after := revision(t, c.Client); after != before {
		t.Errorf("checks moved the revision from %d to %d", before, after)
	}
}

// A backfill's record through its life: none, running (with the default
// concurrency when none is asked for), canceled (which makes room for
// the next), and what GetBackfill and CancelBackfill say at each step.
func TestRegistry_BackfillCancelAndGet(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/backfills")
	ctx := context.Background()
	putTask(t, reg, noopTask("b", "0 * * * *"))
	to := time.Now().UTC().Truncate(time.Hour)
	from := to.Add(-3 * time.Hour)
	var ve *task.ValidationError
	for _, err := range []error{
		func() error { _, err := reg.GetBackfill(ctx, "bad\x01id"); return err }(),
		func() error { _, err := reg.CancelBackfill(ctx, "bad\x01id"); return err }(),
	} {
		if !errors.As(err, &ve) {
			t.Errorf("a bad id: %v, want a *ValidationError", err)
		}
	}
	if b, err := reg.GetBackfill(ctx, "b"); err != nil || b != nil {
		t.Errorf("before any backfill: %+v, %v; want none", b, err)
	}
	var none *NoBackfillRunningError
	if _, err := reg.CancelBackfill(ctx, "b"); !errors.As(err, &none) || none.Latest != nil || !strings.HasSuffix(err.Error(), "it has had none") {
		t.Errorf("cancel before any backfill: %v, want ErrNoBackfillRunning with no latest", err)
	}

	if b, err := reg.Backfill(ctx, "b", from, to, 0); err != nil || b.Concurrency != task.DefaultBackfillConcurrency || b.Fires != 4 {
		t.Fatalf("backfill with no concurrency: %+v, %v; want 4 fires at the default concurrency %d", b, err, task.DefaultBackfillConcurrency)
	}
	if b, err := reg.GetBackfill(ctx, "b"); err != nil || b == nil || b.State != task.BackfillRunning {
		t.Errorf("a backfill started: %+v, %v; want it running", b, err)
	}
	if b, err := reg.CancelBackfill(ctx, "b"); err != nil || b == nil || b.State != task.BackfillCanceled || b.Fires != 4 {
		t.Errorf("cancel of the running backfill: %+v, %v; want its record, canceled", b, err)
	}
	if b, err := reg.GetBackfill(ctx, "b"); err != nil || b == nil || b.State != task.BackfillCanceled {
		t.Errorf("a backfill canceled: %+v, %v; want it canceled", b, err)
	}
	if _, err := reg.CancelBackfill(ctx, "b"); !errors.As(err, &none) || none.Latest == nil || !strings.HasSuffix(err.Error(), "its latest is "+task.BackfillCanceled) {
		t.Errorf("a second cancel: %v, want ErrNoBackfillRunning with the canceled one", err)
	}
	if b, err := reg.Backfill(ctx, "b", from, to, 3); err != nil || b.Concurrency != 3 {
		t.Errorf("a backfill after a canceled one: %+v, %v; want it running at concurrency 3", b, err)
	}
}

// A backfill record that does not decode is an error where it is read;
// RecordBackfill over a record that is gone reports no current one; and
// WatchBackfills from revision 0 follows from now.
func TestRegistry_BackfillRecordsCorruptGoneAndWatched(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/bfrecords")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Client.Put(ctx, reg.keys.backfill(reg.Partition("corrupt"), "corrupt"), "not json"); err != nil {
		t.Fatal(err)
	}
	if b, err := reg.GetBackfill(ctx, "corrupt"); err == nil {
		t.Errorf("GetBackfill of a corrupt record: %+v, no error", b)
	}
	b := &task.Backfill{State: task.BackfillRunning, Fires: 1}
	if _, ok, cur, err := reg.RecordBackfill(ctx, "gone", b, 5); err != nil || ok || cur != nil {
		t.Errorf("RecordBackfill over no record: ok %v, current %v, %v; want not written, no current record", ok, cur, err)
	}

	to := time.Now().UTC().Truncate(time.Hour)
	for _, id := range []string{"before", "after"} {
		putTask(t, reg, noopTask(id, "0 * * * *"))
	}
	if _, err := reg.Backfill(ctx, "before", to.Add(-time.Hour), to, 0); err != nil {
		t.Fatal(err)
	}
	wch := reg.WatchBackfills(ctx, 0)
	if resp := <-wch; !resp.Created {
		t.Fatalf("first response %+v, want the watch's creation", resp)
	}
	if _, err := reg.Backfill(ctx, "after", to.Add(-time.Hour), to, 0); err != nil {
		t.Fatal(err)
	}
	resp := <-wch
	if err := resp.Err(); err != nil || len(resp.Events) == 0 {
		t.Fatalf("watch: %+v, %v", resp, err)
	}
	if _, id, _ := reg.ParseBackfill(string(resp.Events[0].Kv.Key)); id != "after" {
		t.Errorf("first event of the watch: a backfill of %q, want one of %q", id, "after")
	}
}

// Put checks on_failure as it checks on_success: a missing target is
// refused, unless allowed, and so is a cycle; only a task's own targets
// must exist, not theirs; and a change of one list, the other kept, is
// checked.
func TestRegistry_PutChecksEveryChain(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/chains")
	ctx := context.Background()
	var ve *task.ValidationError
	failing := noopTask("f", "@daily")
	failing.OnFailure = []string{"missing"}
	if _, err := reg.Put(ctx, failing, PutOptions{}); !errors.As(err, &ve) || ve.Field != "on_failure[0]" {
		t.Errorf("on_failure to a missing task: %v, want a *ValidationError on on_failure[0]", err)
	}
	if _, err := reg.Put(ctx, failing, PutOptions{AllowMissingTargets: true}); err != nil {
		t.Fatalf("on_failure to a missing task, allowed: %v", err)
	}
	// g's target f exists; f's own target need not.
	g := noopTask("g", "@daily")
	g.OnFailure = []string{"f"}
	putTask(t, reg, g)
	closing := noopTask("missing", "@daily")
	closing.OnFailure = []string{"g"}
	if _, err := reg.Put(ctx, closing, PutOptions{}); !errors.As(err, &ve) || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("on_failure closing a cycle: %v, want it refused", err)
	}
	// on_success changed, on_failure kept.
	g.OnSuccess = []string{"nowhere"}
	if _, err := reg.Put(ctx, g, PutOptions{}); !errors.As(err, &ve) || ve.Field != "on_success[0]" {
		t.Errorf("on_success changed to a missing task: %v, want a *ValidationError on on_success[0]", err)
	}
}

// The cycle check reads at most maxChainWalk tasks for one put: a chain
// reaching that many is taken, one reaching one more is refused, naming
// the bound (each task read is a compare of the put's transaction).
func TestRegistry_ChainCheckReadsAtMostItsBound(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/walk")
	id := func(i int) string { return fmt.Sprintf("c%02d", i) }
	put := func(i int) error {
		tsk := noopTask(id(i), "@daily")
		tsk.OnSuccess = []string{id(i + 1)}
		_, err := reg.Put(context.Background(), tsk, PutOptions{})
		return err
	}
	putTask(t, reg, noopTask(id(maxChainWalk+1), "@daily"))
	for i := maxChainWalk; i >= 1; i-- { // c01's chain reaches maxChainWalk tasks
		if err := put(i); err != nil {
			t.Fatalf("put %s, its chain reaching %d tasks: %v", id(i), maxChainWalk+1-i, err)
		}
	}
	var ve *task.ValidationError
	if err := put(0); !errors.As(err, &ve) || !strings.Contains(err.Error(), fmt.Sprintf("more than %d tasks", maxChainWalk)) {
		t.Errorf("put %s, its chain reaching %d tasks: %v, want a *ValidationError naming the bound", id(0), maxChainWalk+1, err)
	}
}
