package engine

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

// notFired are the Task fields a fire does not use, by JSON name
// (registry's TestFiring_HasFireFields has the same list).
var notFired = []string{"id", "labels", "partition", "version", "created_at", "updated_at", "state", "pause"}

// notInProfile are the fired fields kept beside the profile rather than in it.
var notInProfile = []string{"schedule", "timezone", "paused"}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// TestProfileKey_CoversFireFields fails when a field that a fire uses is
// left out of appendProfileKey: two tasks differing only in it would share a
// profile, and one of them would fire with the other's setting. It walks
// Task by reflection, so a field added to Task, Executor, Retry or
// HistoryLimit is covered without touching the test.
func TestProfileKey_CoversFireFields(t *testing.T) {
	base := task.Task{ID: "t", Schedule: "@every 1m", Executor: task.Executor{Type: task.ExecutorNoop}}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for f := range reflect.TypeFor[task.Task]().Fields() {
		name := jsonName(f)
		if slices.Contains(notFired, name) || slices.Contains(notInProfile, name) {
			continue
		}
		eachLeaf(t, reflect.ValueOf(&base).Elem().FieldByIndex(f.Index), name, func(path string, change func(*task.Task)) {
			n++
			// The mutated task need not be valid: appendProfileKey does not
			// validate, and a key that ignores an invalid value ignores
			// a valid one too.
			mut := clone(t, &base)
			change(mut)
			if string(appendProfileKey(nil, mut)) == string(appendProfileKey(nil, &base)) {
				t.Errorf("appendProfileKey ignores %s", path)
			}
		})
	}
	if n < 15 {
		t.Fatalf("walked %d fields; the walk is broken", n)
	}
}

// eachLeaf calls fn with a change of each leaf field under v (a field of
// Task, whose path is path); the change applies to another Task at the
// same place.
func eachLeaf(t *testing.T, v reflect.Value, path string, fn func(path string, change func(*task.Task))) {
	at := func(tk *task.Task) reflect.Value { return fieldAt(reflect.ValueOf(tk).Elem(), path) }
	switch {
	case v.Type() == reflect.TypeFor[time.Time]():
		fn(path, func(tk *task.Task) { setOther(at(tk)) })
	case v.Kind() == reflect.Struct:
		for f := range v.Type().Fields() {
			eachLeaf(t, v.FieldByIndex(f.Index), path+"."+jsonName(f), fn)
		}
	case v.Kind() == reflect.Pointer:
		// A pointer to a struct: change each of its leaves from nil.
		elem := reflect.New(v.Type().Elem()).Elem()
		for f := range elem.Type().Fields() {
			sub := path + "." + jsonName(f)
			fn(sub, func(tk *task.Task) {
				p := reflect.New(v.Type().Elem())
				at(tk).Set(p)
				setOther(fieldAt(reflect.ValueOf(tk).Elem(), sub))
			})
		}
	default:
		fn(path, func(tk *task.Task) { setOther(at(tk)) })
	}
}

// fieldAt returns the field of task at path (JSON names, dot-separated),
// allocating nil pointers on the way.
func fieldAt(v reflect.Value, path string) reflect.Value {
	for name := range strings.SplitSeq(path, ".") {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		for f := range v.Type().Fields() {
			if jsonName(f) == name {
				v = v.FieldByIndex(f.Index)
				break
			}
		}
	}
	return v
}

// setOther sets v to a value other than its current one.
func setOther(v reflect.Value) {
	if t, ok := v.Interface().(time.Time); ok {
		v.Set(reflect.ValueOf(t.Add(time.Second)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("k"), reflect.ValueOf("v"))
		v.Set(m)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 { // json.RawMessage
			v.SetBytes(append(v.Bytes(), "1"...))
		} else {
			v.Set(reflect.Append(v, reflect.ValueOf("a").Convert(v.Type().Elem())))
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		setOther(v.Elem())
	default:
		panic("setOther: add a case for " + v.Type().String())
	}
}

func clone(t *testing.T, tk *task.Task) *task.Task {
	b, err := json.Marshal(tk)
	if err != nil {
		t.Fatal(err)
	}
	var c task.Task
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// TestProfile_SameDefinitionButForTheWrite: the profiles a node decodes of
// a delete_after_fire task before and after a write that only paused it
// (its updated_at and pause record new) are one definition, so that the
// pause is not taken for an edit (upsert); after a write that paused it
// and changed it besides, they are not. A profile built without its
// definition's length took every such write for a pause alone.
func TestProfile_SameDefinitionButForTheWrite(t *testing.T) {
	e := &Engine{cfg: DefaultConfig("p").withDefaults(), scheds: schedule.NewTable(), execs: &executors{}}
	t0 := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	base := &task.Task{ID: "t", Schedule: "@at 2027-01-02T00:00:00Z", Executor: task.Executor{Type: task.ExecutorNoop}, DeleteAfterFire: true}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	base.CreatedAt, base.UpdatedAt = t0, t0
	paused := clone(t, base)
	paused.Paused, paused.Pause, paused.UpdatedAt = true, &task.Pause{By: "ops", At: t0.Add(time.Hour)}, t0.Add(time.Hour)
	edited := clone(t, paused)
	edited.Timeout = task.Duration(time.Second)
	prof := func(tk *task.Task) *profile {
		v, err := json.Marshal(tk)
		if err != nil {
			t.Fatal(err)
		}
		d, err := e.decoder().def(tk.ID, v)
		if err != nil {
			t.Fatal(err)
		}
		return d.prof
	}
	was := prof(base)
	if p := prof(paused); p.key == was.key || !was.sameDefinition(p) {
		t.Errorf("paused only: keys %q and %q; want two profiles of one definition", was.key, p.key)
	}
	if p := prof(edited); was.sameDefinition(p) {
		t.Errorf("paused and edited: keys %q and %q; want two definitions", was.key, p.key)
	}
}

// TestMaxHistoryLimit_MatchesStore: package task states the store's limit
// without linking the store.
func TestMaxHistoryLimit_MatchesStore(t *testing.T) {
	if task.MaxHistoryLimit != store.MaxHistoryLimit {
		t.Fatalf("task.MaxHistoryLimit = %d, store.MaxHistoryLimit = %d", task.MaxHistoryLimit, store.MaxHistoryLimit)
	}
}
