package registry

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// storedExamples are tasks as the registry stores them (marshalStored of
// a decoded, validated task with its times), one for each kind of field.
func storedExamples(t testing.TB) [][]byte {
	t.Helper()
	inputs := []string{
		`{"id":"a","schedule":"* * * * *","executor":{"type":"noop"}}`,
		`{"id":"billing/h<t>&p","schedule":"*/5 * * * * *","timezone":"Europe/Paris","executor":{"type":"http",` +
			`"url":"http://127.0.0.1:9/hook?a=1&b=2","method":"PUT","headers":{"X-B":"2","X-A":"tab\tend"},` +
			`"body":"{\"k\":\"v\\\\w\",\n\"ctl\":\"\u0001\u001f\u007f\",\"ls\":\"\u2028\u2029\",\"bs\":\"\b\f\r\",\"é\":\"日本\"}"},` +
			`"timeout":"1m30s","retry":{"max_attempts":3,"backoff":"1.5s","max_backoff":"10m0s"},"misfire":"fire_all",` +
			`"catchup_window":"1h0m0s","concurrency":"forbid","jitter":"250ms","labels":{"team":"pay","g":"7","created_at":"x"}}`,
		`{"id":"x","schedule":"@every 1h","executor":{"type":"exec","command":["/bin/echo","a b","\"q\""],"env":{"B":"2","A":"1"}},` +
			`"history_limit":{"successes":0,"failures":5},"notify":{"on":["failure","recovery"],"url":"http://127.0.0.1:9/n","headers":{"A":"b"}},` +
			`"pause_on_failure":3,"capture":{"max_bytes":1024,"on":"always"},"on_success":["a","b"],"on_failure":["c"]}`,
		`{"id":"h","schedule":"0 0 * * *","executor":{"type":"handler","name":"h1","payload":{"b": [1, 2.5e3, -0, "s\"<>\u2028", null, true, {}]}}}`,
		`{"id":"w","schedule":"0 0 * * *","executor":{"type":"noop"},"not_before":"2026-01-02T03:04:05.123+02:00",` +
			`"not_after":"2027-01-01T00:00:00Z","max_fires":10,"delete_after_fire":true,"paused":true}`,
		`{"id":"n","schedule":"@at 2030-01-01T00:00:00Z","executor":{"type":"noop"}}`,
	}
	var out [][]byte
	for i, in := range inputs {
		tsk, err := task.DecodeTask([]byte(in))
		if err != nil {
			t.Fatalf("example %d: %v", i, err)
		}
		tsk.CreatedAt = time.Date(2026, 12, 3, 9, 0, 0, 123e6, time.UTC)
		tsk.UpdatedAt = tsk.CreatedAt.Add(time.Duration(i) * time.Second)
		if tsk.Paused {
			tsk.Pause = &task.Pause{Note: "by hand", By: "token", At: tsk.UpdatedAt}
		}
		b, err := marshalStored(tsk)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// decodedJSON is what responses wrote before the pass-through: the task
// decoded by encoding/json, with its partition and version, encoded again.
func decodedJSON(reg *Registry, kv *mvccpb.KeyValue) ([]byte, error) {
	var tsk task.Task
	if err := json.Unmarshal(kv.Value, &tsk); err != nil {
		return nil, err
	}
	p, _, _ := reg.keys.parseTaskKey(string(kv.Key))
	tsk.Partition, tsk.Version, tsk.State = &p, kv.ModRevision, nil
	return marshalStored(&tsk)
}

func storedKV(reg *Registry, p int, id string, value []byte, rev int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(reg.keys.task(p, id)), Value: value, ModRevision: rev}
}

// TestAppendTaskJSON_StoredTasksPassThrough: a task as the registry stores
// it is passed on, and the bytes are those of decoding and encoding it.
func TestAppendTaskJSON_StoredTasksPassThrough(t *testing.T) {
	reg := &Registry{keys: newKeys("/p")}
	for i, stored := range storedExamples(t) {
		for _, p := range []int{0, 13} {
			kv := storedKV(reg, p, "id", stored, int64(1000+i))
			want, err := decodedJSON(reg, kv)
			if err != nil {
				t.Fatal(err)
			}
			got, err := reg.appendTaskJSON([]byte("keep"), kv)
			if err != nil || !bytes.Equal(got, append([]byte("keep"), want...)) {
				t.Errorf("example %d, partition %d:\n got %s (%v)\nwant keep%s", i, p, got, err, want)
			}
		}
	}
}

// TestAppendTaskJSON_WrittenByHand: a stored value that the registry did
// not write but that is one JSON object is passed on as it is, and reads
// as the task it holds (or fails to, where that fails); one that is not,
// or that holds a field only responses write, is a corrupt stored task.
func TestAppendTaskJSON_WrittenByHand(t *testing.T) {
	reg := &Registry{keys: newKeys("/p")}
	base := string(storedExamples(t)[1])
	passed := map[string]string{
		"space after the brace":     strings.Replace(base, `{"id"`, `{ "id"`, 1),
		"newline at the end":        base + "\n",
		"space in a map":            strings.Replace(base, `"g":"7"`, `"g": "7"`, 1),
		"unknown field":             strings.Replace(base, `{"id"`, `{"old":1,"id"`, 1),
		"a field more":              strings.Replace(base, `"created_at":"2026`, `"max_fires":5,"created_at":"2026`, 1),
		"field out of order":        strings.Replace(base, `"id":"billing/h<t>&p","schedule":"*/5 * * * * *"`, `"schedule":"*/5 * * * * *","id":"billing/h<t>&p"`, 1),
		"field in upper case":       strings.Replace(base, `"schedule"`, `"Schedule"`, 1),
		"null field":                strings.Replace(base, `"created_at":"2026`, `"history_limit":null,"created_at":"2026`, 1),
		"escape the encoder spares": strings.Replace(base, `"pay"`, `"p\u0061y"`, 1),
		"labels not sorted":         strings.Replace(base, `{"created_at":"x","g":"7","team":"pay"}`, `{"g":"7","created_at":"x","team":"pay"}`, 1),
		"duration not as written":   strings.Replace(base, `"1m30s"`, `"90s"`, 1),
		"without times":             `{"id":"old","schedule":"0 0 * * *","executor":{"type":"noop"},"labels":{"created_at":"x"}}`,
		"times only":                `{"created_at":"2026-12-03T09:00:00Z","updated_at":"2026-12-03T09:00:00Z"}`,
		"field written twice":       strings.Replace(base, `"timezone"`, `"id":"other","timezone"`, 1),
		"invalid UTF-8 in a string": strings.Replace(base, `"pay"`, "\"p\xffy\"", 1),
		"empty":                     `{}`,
		// Valid JSON, not a task: passed on, and it fails where it is read.
		"a number for id": strings.Replace(base, `"id":"billing/h<t>&p"`, `"id":5`, 1),
		"a bad duration":  strings.Replace(base, `"1m30s"`, `"banana"`, 1),
		"a bad time":      strings.Replace(base, `"2026-12-03T09:00:00.123Z"`, `"yesterday"`, 1),
		"nested garbage":  strings.Replace(base, `"max_attempts":3`, `"max_attempts":{}`, 1),
	}
	for name, v := range passed {
		kv := storedKV(reg, 3, "id", []byte(v), 77)
		got, err := reg.appendTaskJSON(nil, kv)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var gotTask, wantTask task.Task
		gerr, werr := json.Unmarshal(got, &gotTask), json.Unmarshal([]byte(v), &wantTask)
		p := 3
		wantTask.Partition, wantTask.Version = &p, 77
		if (gerr != nil) != (werr != nil) || werr == nil && !reflect.DeepEqual(gotTask, wantTask) {
			t.Errorf("%s: passed on as\n%s\nwhich reads as %+v (%v)\nwant %+v (%v)", name, got, gotTask, gerr, wantTask, werr)
		}
	}

	for name, v := range map[string]string{
		"truncated":                  base[:len(base)-1],
		"not an object":              `["a"]`,
		"not JSON":                   `task`,
		"number with a leading zero": strings.Replace(base, `"max_attempts":3`, `"max_attempts":03`, 1),
		"data after the object":      base + `{}`,
		"stored partition":           strings.Replace(base, `"created_at":"2026`, `"partition":2,"created_at":"2026`, 1),
		"stored version":             strings.Replace(base, `"created_at":"2026`, `"version":2,"created_at":"2026`, 1),
		"stored state":               base[:len(base)-1] + `,"state":{"owner":"n"}}`,
		"stored Version":             strings.Replace(base, `"created_at":"2026`, `"Version":2,"created_at":"2026`, 1),
	} {
		kv := storedKV(reg, 3, "id", []byte(v), 77)
		got, err := reg.appendTaskJSON([]byte("keep"), kv)
		if err == nil || !strings.Contains(err.Error(), "corrupt") || string(got) != "keep" {
			t.Errorf("%s: got %s, %v; want the error of a corrupt stored task", name, got, err)
		}
	}
}

// FuzzAppendResponse: whatever a stored value holds, what is passed on
// is one JSON object that reads as the stored task with its partition and
// version (or fails to read as the stored value does); and a task as the
// registry writes it is passed on as the bytes of decoding and encoding it.
func FuzzAppendResponse(f *testing.F) {
	for _, s := range storedExamples(f) {
		f.Add(s)
	}
	f.Add([]byte(`{"id":"a"}`))
	reg := &Registry{keys: newKeys("/p")}
	f.Fuzz(func(t *testing.T, stored []byte) {
		var want task.Task
		werr := json.Unmarshal(stored, &want)
		if out, err := task.AppendResponse(nil, stored, 5, 99); err == nil {
			var got task.Task
			if !json.Valid(out) {
				t.Fatalf("%s passed on as invalid JSON: %s", stored, out)
			}
			gerr := json.Unmarshal(out, &got)
			p := 5
			want.Partition, want.Version = &p, 99
			if (gerr != nil) != (werr != nil) || werr == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("%s passed on as\n%s\nwhich reads as %+v (%v)\nwant %+v (%v)", stored, out, got, gerr, want, werr)
			}
		}
		if werr != nil {
			return
		}
		want.Partition, want.Version, want.State = nil, 0, nil
		written, err := marshalStored(&want)
		if err != nil {
			return // invalid UTF-8 or the like: never written
		}
		kv := storedKV(reg, 5, "id", written, 99)
		wantOut, err := decodedJSON(reg, kv)
		if err != nil {
			t.Fatal(err)
		}
		out, err := reg.appendTaskJSON(nil, kv)
		if err != nil || !bytes.Equal(out, wantOut) {
			t.Fatalf("the registry's\n%s\npassed on as\n%s (%v)\nwant\n%s", written, out, err, wantOut)
		}
	})
}

// BenchmarkAppendTaskJSON compares writing a stored task as a response
// writes it by passing it through with what decoding and encoding it costs.
func BenchmarkAppendTaskJSON(b *testing.B) {
	reg := &Registry{keys: newKeys("/p")}
	kv := storedKV(reg, 3, "id", storedExamples(b)[1], 77)
	b.Run("impl=pass-through", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = reg.appendTaskJSON(buf[:0], kv); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=decode-encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodedJSON(reg, kv); err != nil {
				b.Fatal(err)
			}
		}
	})
}
