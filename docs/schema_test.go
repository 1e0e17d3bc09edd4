package docs

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/engine"
)

// schemaNode is the part of a JSON Schema the test reads.
type schemaNode struct {
	Properties map[string]*schemaNode `json:"properties"`
	Enum       []string               `json:"enum"`
}

// fieldNames returns the JSON names of a struct type's fields.
func fieldNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func schemaKeys(m map[string]*schemaNode) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestTaskSchema_MatchesEngineTask: docs/task.schema.json names exactly the
// JSON fields of engine.Task and of its nested objects, and the enums hold
// the engine's values.
func TestTaskSchema_MatchesEngineTask(t *testing.T) {
	var root schemaNode
	if err := json.Unmarshal([]byte(read(t, "task.schema.json")), &root); err != nil {
		t.Fatalf("task.schema.json: %v", err)
	}
	for _, c := range []struct {
		where string
		node  *schemaNode
		typ   reflect.Type
	}{
		{"task", &root, reflect.TypeFor[engine.Task]()},
		{"executor", root.Properties["executor"], reflect.TypeFor[engine.Executor]()},
		{"retry", root.Properties["retry"], reflect.TypeFor[engine.Retry]()},
		{"history_limit", root.Properties["history_limit"], reflect.TypeFor[engine.HistoryLimit]()},
		{"state", root.Properties["state"], reflect.TypeFor[engine.TaskState]()},
	} {
		if c.node == nil {
			t.Errorf("%s: not in the schema", c.where)
			continue
		}
		if got, want := schemaKeys(c.node.Properties), fieldNames(c.typ); !slices.Equal(got, want) {
			t.Errorf("%s: the schema has %v, %v has %v", c.where, got, c.typ, want)
		}
	}
	for _, c := range []struct {
		where string
		got   []string
		want  []string
	}{
		{"executor.type", root.Properties["executor"].Properties["type"].Enum, []string{
			string(engine.ExecutorHTTP), string(engine.ExecutorExec), string(engine.ExecutorHandler), string(engine.ExecutorNoop)}},
		{"misfire", root.Properties["misfire"].Enum, []string{
			string(engine.MisfireFireOnce), string(engine.MisfireSkip), string(engine.MisfireFireAll)}},
		{"concurrency", root.Properties["concurrency"].Enum, []string{
			string(engine.ConcurrencyAllow), string(engine.ConcurrencyForbid), string(engine.ConcurrencyBufferOne), string(engine.ConcurrencyReplace)}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: the schema allows %v, the engine %v", c.where, c.got, c.want)
		}
	}
}
