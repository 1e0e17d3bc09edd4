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
	put := func(at time.Time, tsk *task.Task) int64 {
		t.Helper()
		reg.now = func() time.Time { return at }
		return putTask(t, reg, tsk).Version
	}
	put(t0, noopTask("x", "* * * * *"))
	labeled := noopTask("x", "* * * * *")
	labeled.Labels = map[string]string{"seen": "yes"}
	put(t0.Add(time.Second), labeled)
	paused := noopTask("x", "* * * * *")
	paused.Paused = true
	rev := put(t0.Add(2*time.Second), paused)
	put(t0.Add(2*time.Second), noopTask("y", "* * * * *"))
	if err := reg.Delete(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	yRev := put(t0.Add(3*time.Second), noopTask("y", "* * * * *"))
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
