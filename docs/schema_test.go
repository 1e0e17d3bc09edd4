package docs

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/task"
)

// schemaNode is the part of a JSON Schema the test reads.
type schemaNode struct {
	Properties map[string]*schemaNode `json:"properties"`
	Enum       []string               `json:"enum"`
	Minimum    *int                   `json:"minimum"`
	Maximum    *int                   `json:"maximum"`
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
// JSON fields of task.Task and of its nested objects, and the enums hold
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
		{"task", &root, reflect.TypeFor[task.Task]()},
		{"executor", root.Properties["executor"], reflect.TypeFor[task.Executor]()},
		{"retry", root.Properties["retry"], reflect.TypeFor[task.Retry]()},
		{"history_limit", root.Properties["history_limit"], reflect.TypeFor[task.HistoryLimit]()},
		{"notify", root.Properties["notify"], reflect.TypeFor[task.Notify]()},
		{"capture", root.Properties["capture"], reflect.TypeFor[task.Capture]()},
		{"state", root.Properties["state"], reflect.TypeFor[task.State]()},
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
			string(task.ExecutorHTTP), string(task.ExecutorExec), string(task.ExecutorHandler), string(task.ExecutorNoop)}},
		{"misfire", root.Properties["misfire"].Enum, []string{
			string(task.MisfireFireOnce), string(task.MisfireSkip), string(task.MisfireFireAll)}},
		{"capture.on", root.Properties["capture"].Properties["on"].Enum, []string{
			string(task.CaptureFailure), string(task.CaptureAlways)}},
		{"concurrency", root.Properties["concurrency"].Enum, []string{
			string(task.ConcurrencyAllow), string(task.ConcurrencyForbid), string(task.ConcurrencyBufferOne), string(task.ConcurrencyReplace)}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: the schema allows %v, the engine %v", c.where, c.got, c.want)
		}
	}
}

// TestTaskSchema_StatesTheIntegerBounds: every integer field of a task
// has in docs/task.schema.json the minimum and the maximum that
// task.DecodeTask applies: both are taken, one past either refused (but
// 0 below a minimum of 1, which is the field left out: its default).
// retry.max_attempts had no maximum, and an editor took 101.
func TestTaskSchema_StatesTheIntegerBounds(t *testing.T) {
	var root schemaNode
	if err := json.Unmarshal([]byte(read(t, "task.schema.json")), &root); err != nil {
		t.Fatalf("task.schema.json: %v", err)
	}
	for _, path := range []string{"retry.max_attempts", "history_limit.successes", "history_limit.failures",
		"pause_on_failure", "capture.max_bytes", "max_fires"} {
		n := &root
		for _, name := range strings.Split(path, ".") {
			if n = n.Properties[name]; n == nil {
				t.Fatalf("%s: not in the schema", path)
			}
		}
		if n.Minimum == nil || n.Maximum == nil {
			t.Errorf("%s: the schema lacks its minimum or its maximum", path)
			continue
		}
		// field writes {"a": {"b": v}} for the path a.b.
		field := func(v int) string {
			out := fmt.Sprint(v)
			names := strings.Split(path, ".")
			for i := len(names) - 1; i >= 0; i-- {
				out = fmt.Sprintf("{%q: %s}", names[i], out)
			}
			return out[1 : len(out)-1]
		}
		decode := func(v int) error {
			_, err := task.DecodeTask([]byte(`{"id": "a", "schedule": "@daily", "executor": {"type": "noop"}, ` + field(v) + `}`))
			return err
		}
		for _, v := range []int{*n.Minimum, *n.Maximum} {
			if err := decode(v); err != nil {
				t.Errorf("%s: %d, the schema's bound, refused: %v", path, v, err)
			}
		}
		past := []int{*n.Maximum + 1}
		if *n.Minimum-1 != 0 {
			past = append(past, *n.Minimum-1)
		}
		for _, v := range past {
			if decode(v) == nil {
				t.Errorf("%s: %d, past the schema's bounds %d-%d, taken", path, v, *n.Minimum, *n.Maximum)
			}
		}
	}
}

// TestTaskSchema_PauseAsDecodeTaskReadsIt: the schema's pause record
// requires the fields DecodeTask requires of a paused task's record, and
// is closed as DecodeTask's is. It required none and took any field,
// where a PUT refuses a record without "by" or with a field of its own.
func TestTaskSchema_PauseAsDecodeTaskReadsIt(t *testing.T) {
	var root struct {
		Defs map[string]struct {
			Properties           map[string]any  `json:"properties"`
			Required             []string        `json:"required"`
			AdditionalProperties json.RawMessage `json:"additionalProperties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal([]byte(read(t, "task.schema.json")), &root); err != nil {
		t.Fatalf("task.schema.json: %v", err)
	}
	pause := root.Defs["pause"]
	decode := func(record string) error {
		_, err := task.DecodeTask([]byte(`{"id": "a", "schedule": "@daily", "executor": {"type": "noop"}, "paused": true, "pause": ` + record + `}`))
		return err
	}
	valid := map[string]string{"note": `"why"`, "by": `"me"`, "at": `"2026-01-02T03:04:05Z"`}
	for name := range pause.Properties {
		if _, ok := valid[name]; !ok {
			t.Fatalf("pause.%s: no valid value to try", name)
		}
		var fields []string
		for n, v := range valid {
			if n != name {
				fields = append(fields, fmt.Sprintf("%q: %s", n, v))
			}
		}
		err := decode("{" + strings.Join(fields, ", ") + "}")
		if required := slices.Contains(pause.Required, name); required != (err != nil) {
			t.Errorf("pause.%s left out: required by the schema %t, DecodeTask: %v", name, required, err)
		}
	}
	closed := string(pause.AdditionalProperties) == "false"
	if err := decode(`{"by": "me", "other": 1}`); closed != (err != nil) {
		t.Errorf("pause with a field of its own: closed by the schema %t, DecodeTask: %v", closed, err)
	}
}
