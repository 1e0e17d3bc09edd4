package registry

import (
	"reflect"
	"slices"
	"strings"
	"testing"

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
