package registry

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
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
