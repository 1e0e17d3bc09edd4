package task

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzDecodeTask checks that decoding never panics, and that a decoded task
// is valid, has the id PeekID reads, and re-encodes and re-decodes to an
// equal task.
func FuzzDecodeTask(f *testing.F) {
	f.Add([]byte(apiExample))
	for _, s := range []string{
		`{"id": "a", "schedule": "@hourly", "executor": {"type": "noop"}}`,
		`{"id": "a", "schedule": "H * * * *", "executor": {"type": "exec", "command": ["ls", "-l"], "env": {"A": "b"}}, "labels": {}}`,
		`{"id": "a<b>&", "schedule": "* * * * *", "executor": {"type": "handler", "name": "h", "payload": {"html": "<b>\u2028", "n": 1e3}}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "handler", "name": "h", "payload": null}, "partition": 3, "state": {"fires": 1}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "https://x/y", "headers": {}}, "retry": {"max_attempts": 100, "backoff": "2h"}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}, "timeout": "0s"}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}} trailing`,
		`{"id": "\ud800", "schedule": "* * * * *", "executor": {"type": "noop"}}`,
		`{"id": "w", "schedule": "@hourly", "executor": {"type": "noop"}, "not_before": "2027-01-01T09:00:00+09:00", "not_after": "2027-01-02T00:00:00.5Z", "max_fires": 3, "delete_after_fire": true}`,
		`{"id": "o", "schedule": "@at 2027-01-01T09:00:00", "timezone": "Europe/Berlin", "executor": {"type": "noop"}, "delete_after_fire": true}`,
		`[]`, `null`, `{}`, `{"id": "a", "id": "b", "schedule": "* * * * *", "executor": {"type": "noop"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		task, err := DecodeTask(data)
		if err != nil {
			if _, ok := err.(*ValidationError); !ok {
				t.Fatalf("error %v is a %T, not a *ValidationError", err, err)
			}
			return
		}
		if id := PeekID(data); id != task.ID {
			t.Fatalf("PeekID read %q, the task's id is %q", id, task.ID)
		}
		again := *task
		if err := again.Validate(); err != nil || !reflect.DeepEqual(&again, task) {
			t.Fatalf("Validate of a decoded task: %v, changed it: %v", err, !reflect.DeepEqual(&again, task))
		}
		enc, err := json.Marshal(task)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		if len(enc) > MaxTaskSize {
			return // escaping (<, >, & as \u003c) can grow a task past the limit
		}
		back, err := DecodeTask(enc)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", enc, err)
		}
		if !reflect.DeepEqual(back, task) {
			t.Fatalf("round trip changed the task:\n got %+v\nwant %+v", back, task)
		}
	})
}

// FuzzUnmarshal: unmarshal reads every type DecodeTask reads fields into
// as json.Unmarshal does, and fails where it fails.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range []string{`"a"`, `"\ud800\u00e9"`, `true`, `1`, `-0`, `1e2`, `1.0`, `99999999999999999999`,
		`{"a":1,"a":"b"}`, `{"b": [1, 2]}`, `[1,"x",{}]`, `null`, `[]`, `{}`, ` "a" `, `"a" "b"`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, newPair := range []func() (any, any){
			func() (any, any) { return new(string), new(string) },
			func() (any, any) { return new(bool), new(bool) },
			func() (any, any) { return new(int), new(int) },
			func() (any, any) { return new(map[string]json.RawMessage), new(map[string]json.RawMessage) },
			func() (any, any) { return new([]json.RawMessage), new([]json.RawMessage) },
		} {
			got, want := newPair()
			err, werr := unmarshal(data, got), json.Unmarshal(data, want)
			if (err == nil) != (werr == nil) || !reflect.DeepEqual(got, want) {
				t.Fatalf("%q into %T: got %#v (%v), want %#v (%v)", data, got, got, err, want, werr)
			}
		}
	})
}
