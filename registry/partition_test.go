package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/task"
)

// notFired are the Task fields a fire does not use, by JSON name: the id
// is the key's, the rest are not kept by the engine. (created_at is:
// max_fires counts from it.)
var notFired = []string{"id", "labels", "partition", "version", "updated_at", "state", "pause"}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// DecodeFiring refuses a stored value that does not decode.
func TestDecodeFiring_RefusesACorruptValue(t *testing.T) {
	if f, err := DecodeFiring("x", []byte("not json")); err == nil {
		t.Errorf("DecodeFiring of a corrupt value: %+v, no error", f)
	}
}

// TestFiring_HasFireFields fails when a Task field that a fire uses is not
// decoded by firing, which loading a partition reads stored tasks with.
func TestFiring_HasFireFields(t *testing.T) {
	have := map[string]reflect.Type{}
	for f := range reflect.TypeFor[firing]().Fields() {
		have[jsonName(f)] = f.Type
	}
	for f := range reflect.TypeFor[task.Task]().Fields() {
		name := jsonName(f)
		if slices.Contains(notFired, name) {
			continue
		}
		typ, ok := have[name]
		if !ok {
			t.Errorf("Task field %s (%q) is missing from firing", f.Name, name)
		} else if typ != f.Type {
			t.Errorf("firing's %q is a %s, Task's a %s", name, typ, f.Type)
		}
	}
}

// WrittenBy goes back through a task's versions to the one last written at
// or before a time, from its version at a revision: nil for a task created
// after that time (a delete and a put again included), and ErrVersionGone
// once etcd compacted the way back.
func TestRegistry_WrittenByGoesBackToTheVersionWrittenBefore(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/written")
	ctx := context.Background()
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	putAt(t, reg, t0, noopTask("x", "* * * * *"))
	labeled := noopTask("x", "* * * * *")
	labeled.Labels = map[string]string{"seen": "yes"}
	putAt(t, reg, t0.Add(time.Second), labeled)
	paused := noopTask("x", "* * * * *")
	paused.Paused = true
	rev := putAt(t, reg, t0.Add(2*time.Second), paused)
	putAt(t, reg, t0.Add(2*time.Second), noopTask("y", "* * * * *"))
	if err := reg.Delete(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	yRev := putAt(t, reg, t0.Add(3*time.Second), noopTask("y", "* * * * *"))
	for _, tc := range []struct {
		id   string
		rev  int64
		at   time.Time
		want string // "": none
	}{
		{"x", rev, t0.Add(time.Second / 2), `"updated_at":"2026-12-06T12:00:00Z"`},
		{"x", rev, t0.Add(time.Second), `"seen":"yes"`},
		{"x", rev, t0.Add(5 * time.Second), `"paused":true`},
		{"x", rev, t0.Add(-time.Second), ""},
		{"y", yRev, t0.Add(2 * time.Second), ""}, // deleted and put again after it
		{"never", rev, t0.Add(5 * time.Second), ""},
	} {
		got, err := reg.WrittenBy(ctx, tc.id, tc.rev, tc.at)
		if err != nil {
			t.Fatalf("%s by %v: %v", tc.id, tc.at, err)
		}
		if tc.want == "" && got != nil || tc.want != "" && !strings.Contains(string(got), tc.want) {
			t.Errorf("%s by %v: %s, want one with %s", tc.id, tc.at.Format(time.TimeOnly), got, tc.want)
		}
	}
	if _, err := c.Client.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.WrittenBy(ctx, "x", rev, t0); !errors.Is(err, ErrVersionGone) {
		t.Errorf("x by %v once compacted: %v, want %v", t0.Format(time.TimeOnly), err, ErrVersionGone)
	}
}

// HeldAt goes back through a task's versions to the one a node that
// applied its partition's changes up to a revision had, from its version
// at a later revision, whatever clocks stamped their updated_at (here one
// behind wrote the second): nil for a task created after that revision (a
// delete and a put again included), and ErrVersionGone once etcd
// compacted the way back.
func TestRegistry_HeldAtGoesBackToTheVersionAtARevision(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/held")
	ctx := context.Background()
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	first := putAt(t, reg, t0.Add(time.Minute), noopTask("x", "* * * * *"))
	labeled := noopTask("x", "* * * * *")
	labeled.Labels = map[string]string{"seen": "yes"}
	second := putAt(t, reg, t0, labeled)
	paused := noopTask("x", "* * * * *")
	paused.Paused = true
	rev := putAt(t, reg, t0.Add(time.Second), paused)
	yFirst := putAt(t, reg, t0, noopTask("y", "* * * * *"))
	if err := reg.Delete(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	yRev := putAt(t, reg, t0, noopTask("y", "* * * * *"))
	for _, tc := range []struct {
		id        string
		rev, held int64
		want      string // "": none
	}{
		{"x", rev, first, `"updated_at":"2026-12-06T12:01:00Z"`},
		{"x", rev, second, `"seen":"yes"`},
		{"x", rev, rev, `"paused":true`},
		{"x", rev, first - 1, ""},
		{"y", yRev, yFirst, ""}, // deleted and put again after it
		{"never", rev, rev, ""},
	} {
		got, err := reg.HeldAt(ctx, tc.id, tc.rev, tc.held)
		if err != nil {
			t.Fatalf("%s at %d: %v", tc.id, tc.held, err)
		}
		if tc.want == "" && got != nil || tc.want != "" && !strings.Contains(string(got), tc.want) {
			t.Errorf("%s at %d: %s, want one with %s", tc.id, tc.held, got, tc.want)
		}
	}
	if _, err := c.Client.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.HeldAt(ctx, "x", rev, first); !errors.Is(err, ErrVersionGone) {
		t.Errorf("x at %d once compacted: %v, want %v", first, err, ErrVersionGone)
	}
}

// putAt puts tsk as a registry whose clock reads at, and returns its
// revision.
func putAt(t *testing.T, reg *Registry, at time.Time, tsk *task.Task) int64 {
	t.Helper()
	reg.now = func() time.Time { return at }
	return putTask(t, reg, tsk).Version
}

// ReadPartition gives a partition's tasks in id order, over more than one
// range page, all at the revision of its first page: a task written while
// it reads is not among them. Revision reads that same revision when
// nothing was written in between.
func TestRegistry_ReadPartitionReadsOneRevision(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg, err := OpenRegistry(ctx, c.Client, "/readpart", 2)
	if err != nil {
		t.Fatal(err)
	}
	var batch []*task.Task
	for i := range 2500 {
		batch = append(batch, noopTask(fmt.Sprintf("r/%04d", i), "@daily"))
	}
	if res, err := reg.PutBatch(ctx, batch); err != nil || res.Written != len(batch) {
		t.Fatalf("batch: written %d, %v", res.Written, err)
	}
	p := reg.Partition("r/0000")
	var want []string
	for _, tsk := range batch {
		if reg.Partition(tsk.ID) == p {
			want = append(want, tsk.ID)
		}
	}
	if len(want) <= readPage {
		t.Fatalf("%d tasks in partition %d, want more than a page (%d)", len(want), p, readPage)
	}
	late := "z/0" // after every id read: in a later page
	for i := 1; reg.Partition(late) != p; i++ {
		late = fmt.Sprintf("z/%d", i)
	}
	before, err := reg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	rev, err := reg.ReadPartition(ctx, p, func(id string, value []byte, modRev, createRev int64) {
		if len(got) == 0 {
			putTask(t, reg, noopTask(late, "@daily")) // between the first page and the next
		}
		if _, err := DecodeFiring(id, value); err != nil || modRev == 0 || createRev == 0 || modRev > before {
			t.Errorf("%s: %v, modified at %d, created at %d; want both, before %d", id, err, modRev, createRev, before)
		}
		got = append(got, id)
	})
	if err != nil || rev != before {
		t.Fatalf("ReadPartition: revision %d, %v; want %d", rev, err, before)
	}
	if !slices.Equal(got, want) {
		t.Errorf("ReadPartition gave %d tasks (%v ... %v), want the %d written before it", len(got), got[:3], got[len(got)-3:], len(want))
	}
}

// ChangesAt gives a partition's tasks created or changed after a read,
// with their creation revisions, and nil for those deleted, as of a
// revision: whether or not a delete is among them (the count that tells
// it differs or not).
func TestRegistry_ChangesAtGivesWhatChangedSinceARead(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	reg, err := OpenRegistry(ctx, c.Client, "/changes", 2)
	if err != nil {
		t.Fatal(err)
	}
	// ids of partition 0, in order
	var ids []string
	for i := 0; len(ids) < 5; i++ {
		if id := fmt.Sprintf("c/%d", i); reg.Partition(id) == 0 {
			ids = append(ids, id)
		}
	}
	first := putTask(t, reg, noopTask(ids[0], "@daily")).Version // its creation
	for _, id := range ids[1:3] {
		putTask(t, reg, noopTask(id, "@daily"))
	}
	had := map[string]bool{}
	since, err := reg.ReadPartition(ctx, 0, func(id string, _ []byte, _, _ int64) { had[id] = true })
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, noopTask(ids[0], "@hourly"))
	created := putTask(t, reg, noopTask(ids[3], "@daily"))
	noDelete, err := reg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Delete(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	putTask(t, reg, noopTask(ids[4], "@daily")) // created and deleted since: nothing to say
	if err := reg.Delete(ctx, ids[4]); err != nil {
		t.Fatal(err)
	}
	withDelete, err := reg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}

	describe := func(touched map[string][]byte, createdAt map[string]int64) []string {
		var out []string
		for _, id := range slices.Sorted(maps.Keys(touched)) {
			if touched[id] == nil {
				out = append(out, id+" deleted")
				continue
			}
			f, err := DecodeFiring(id, touched[id])
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s %s created at %d", id, f.Schedule, createdAt[id]))
		}
		return out
	}
	for _, tc := range []struct {
		at   int64
		want []string
	}{
		{noDelete, []string{
			fmt.Sprintf("%s @hourly created at %d", ids[0], first),
			fmt.Sprintf("%s @daily created at %d", ids[3], created.Version)}},
		{withDelete, []string{
			fmt.Sprintf("%s @hourly created at %d", ids[0], first),
			ids[1] + " deleted",
			fmt.Sprintf("%s @daily created at %d", ids[3], created.Version)}},
	} {
		slices.Sort(tc.want) // by id, as describe gives them
		touched, createdAt, err := reg.ChangesAt(ctx, 0, had, since, tc.at)
		if got := describe(touched, createdAt); err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("changes as of %d: %v, %v;\nwant %v", tc.at, got, err, tc.want)
		}
	}
}

// The partition reads a node relies on return etcd's errors rather than
// what they read before it: ChangesAt whose read of the ids fails (a task
// deleted since, so that the count differs), Created whose transaction
// fails.
func TestRegistry_PartitionReadsReturnEtcdsErrors(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	ctx := context.Background()
	var failing atomic.Pointer[string] // the method to fail
	reg, err := OpenRegistry(ctx, failingClient(t, c, &failing), "/errors", 2)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; len(ids) < 2; i++ {
		if id := fmt.Sprintf("e/%d", i); reg.Partition(id) == 0 {
			ids = append(ids, id)
			putTask(t, reg, noopTask(id, "@daily"))
		}
	}
	since, err := reg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Delete(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	at, err := reg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}

	failing.Store(new("/Range"))
	if touched, _, err := reg.ChangesAt(ctx, 0, map[string]bool{ids[0]: true, ids[1]: true}, since, at); err == nil {
		t.Errorf("ChangesAt with its read of the ids failed: %v, no error", touched)
	}
	failing.Store(new("/Txn"))
	if created, _, err := reg.Created(ctx, ids); err == nil {
		t.Errorf("Created with its read failed: %v, no error", created)
	}
}

// Created gives each task's creation revision, and 0 for one that does not
// exist.
func TestRegistry_CreatedReadsCreationRevisions(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/created")
	first := putTask(t, reg, noopTask("a", "@daily")).Version
	putTask(t, reg, noopTask("a", "@hourly"))
	created, _, err := reg.Created(context.Background(), []string{"a", "never"})
	if want := map[string]int64{"a": first, "never": 0}; err != nil || !maps.Equal(created, want) {
		t.Errorf("Created: %v, %v; want %v", created, err, want)
	}
}

// WatchTriggers from revision 0 follows from now: a trigger put before it
// is not among its events, one put after it is.
func TestRegistry_WatchTriggersFromNowSkipsEarlierTriggers(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	reg := openRegistry(t, c.Client, "/watchnow")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	putTask(t, reg, noopTask("before", "@daily"))
	putTask(t, reg, noopTask("after", "@daily"))
	if _, err := reg.Trigger(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	wch := reg.WatchTriggers(ctx, 0)
	if resp := <-wch; !resp.Created {
		t.Fatalf("first response %+v, want the watch's creation", resp)
	}
	if _, err := reg.Trigger(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	resp := <-wch
	if err := resp.Err(); err != nil || len(resp.Events) == 0 {
		t.Fatalf("watch: %+v, %v", resp, err)
	}
	if _, _, id, _ := reg.ParseTrigger(string(resp.Events[0].Kv.Key)); id != "after" {
		t.Errorf("first event of the watch: a trigger of %q, want one of %q", id, "after")
	}
}
