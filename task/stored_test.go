package task

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// encoded are tasks as the encoder writes them (without HTML escaping):
// every field set, with an owner's state as a response has it, and none.
func encoded(t testing.TB) [][]byte {
	t.Helper()
	at := time.Date(2026, 12, 3, 9, 0, 0, 5e8, time.FixedZone("", 3600))
	p, n := 7, 0
	full := &Task{ID: "billing/a<b>", Schedule: "*/5 * * * * *", Timezone: "Europe/Paris",
		Executor: Executor{Type: ExecutorHTTP, URL: "http://127.0.0.1:9/x", Method: "PUT",
			Headers: map[string]string{"B": "2", "A": "\"1\"\t"}, Body: "{\"a\":\n\u2028\x01é}",
			Command: []string{"x", ""}, Env: map[string]string{"E": ""}, Name: "h",
			Payload: json.RawMessage(`{"k":[1,-2.5e3,"\u00e9\/",null,{}]}`)},
		Timeout: Duration(90 * time.Second), Retry: Retry{MaxAttempts: 3, Backoff: Duration(1500 * time.Millisecond), MaxBackoff: Duration(time.Hour)},
		Misfire: MisfireFireAll, CatchupWindow: Duration(time.Minute), Concurrency: ConcurrencyForbid, Jitter: 0, Paused: true,
		Labels: map[string]string{"team": "pay", "g": "7"}, HistoryLimit: &HistoryLimit{Successes: &n, Failures: &p},
		Notify:         &Notify{On: []NotifyEvent{NotifyFailure}, URL: "http://127.0.0.1:9/n", Headers: map[string]string{"A": "b"}},
		PauseOnFailure: 3, Capture: &Capture{MaxBytes: 100, On: CaptureAlways}, OnSuccess: []string{"a"}, OnFailure: []string{"b", "c"},
		NotBefore: at, NotAfter: at.Add(time.Hour), MaxFires: 5, DeleteAfterFire: true, Partition: &p, Version: 1 << 40,
		CreatedAt: at.UTC(), UpdatedAt: at.UTC(),
		State: &State{Owner: "n", NextFireAt: at, Fires: 1 << 63, LastError: "boom", Stale: true,
			Backfill: &Backfill{From: at, To: at, Concurrency: 1, Fires: 2, State: "done", CreatedAt: at}},
		Pause: &Pause{Note: "by hand", By: "token", At: at}}
	var out [][]byte
	for _, tsk := range []*Task{full, {ID: "bare"}, {ID: "p0", Partition: &n, Executor: Executor{Command: []string{}}}} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(tsk); err != nil {
			t.Fatal(err)
		}
		out = append(out, bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	}
	return out
}

// firingPart is some of Task's fields, as the registry's firing.
type firingPart struct {
	Schedule     string        `json:"schedule"`
	Executor     Executor      `json:"executor"`
	HistoryLimit *HistoryLimit `json:"history_limit"`
	CreatedAt    time.Time     `json:"created_at"`
}

// TestDecodeStored_AsEncodingJSON: task JSON as the encoder writes it is
// read into what json.Unmarshal reads, whatever the destination held.
func TestDecodeStored_AsEncodingJSON(t *testing.T) {
	for i, data := range encoded(t) {
		var want Task
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		got := Task{ID: "old", Labels: map[string]string{"old": "1"}, MaxFires: 9, State: &State{Owner: "x"}}
		if err := DecodeStored(data, &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("example %d:\n got %+v (%v)\nwant %+v", i, got, err, want)
		}
		var wantPart firingPart
		if err := json.Unmarshal(data, &wantPart); err != nil {
			t.Fatal(err)
		}
		gotPart := firingPart{Schedule: "old", HistoryLimit: &HistoryLimit{}}
		if err := DecodeStored(data, &gotPart); err != nil || !reflect.DeepEqual(gotPart, wantPart) {
			t.Errorf("example %d, some fields:\n got %+v (%v)\nwant %+v", i, gotPart, err, wantPart)
		}
	}
}

// TestDecodeStored_AsEncodingJSONReadsIt: what encoding/json reads its own
// way (a name given twice, invalid UTF-8, a name in another case) is read
// the same; what it refuses is refused.
func TestDecodeStored_AsEncodingJSONReadsIt(t *testing.T) {
	for _, data := range []string{
		`{"id":"a","id":"b","retry":{"max_attempts":1},"retry":{"backoff":"1s"},"labels":{"a":"1"},"labels":{"b":"2","a":"3"}}`,
		`{"id":"a","\u0069d":"b"}`,
		"{\"id\":\"\xff\",\"executor\":{\"payload\":{\"a\":\"\xfe\",\"a\":1}}}",
		`{"ID":"a","Schedule":"x","executor":{"Type":"noop"}}`,
		`{"id":"a","timeout":null,"labels":null,"history_limit":null}`,
	} {
		var got, want Task
		if err, werr := DecodeStored([]byte(data), &got), json.Unmarshal([]byte(data), &want); err != nil || werr != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %+v (%v)\nwant %+v (%v)", data, got, err, want, werr)
		}
	}
	for _, data := range []string{`{"id":"a"} x`, `{"timeout":"banana"}`, `{"id":5}`, `[]`, `{"id":"a"`} {
		var tsk Task
		if err := DecodeStored([]byte(data), &tsk); err == nil {
			t.Errorf("%s: read as %+v", data, tsk)
		}
	}
}

// FuzzDecodeStored: whatever the JSON, DecodeStored reads what
// json.Unmarshal reads or fails; and what json.Unmarshal reads, once
// encoded, DecodeStored reads back the same.
func FuzzDecodeStored(f *testing.F) {
	for _, data := range encoded(f) {
		f.Add(data)
	}
	f.Add([]byte(apiExample))
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want Task
		err, werr := DecodeStored(data, &got), json.Unmarshal(data, &want)
		if err == nil && (werr != nil || !reflect.DeepEqual(got, want)) {
			t.Fatalf("%s:\n got %+v\nwant %+v (%v)", data, got, want, werr)
		}
		var gotPart, wantPart firingPart
		err, werr = DecodeStored(data, &gotPart), json.Unmarshal(data, &wantPart)
		if err == nil && (werr != nil || !reflect.DeepEqual(gotPart, wantPart)) {
			t.Fatalf("some fields of %s:\n got %+v\nwant %+v (%v)", data, gotPart, wantPart, werr)
		}
		if json.Unmarshal(data, &want) != nil {
			return
		}
		enc := encode(t, &want)
		want = Task{}
		if err := json.Unmarshal(enc, &want); err != nil {
			t.Fatalf("the encoder's %s does not decode: %v", enc, err)
		}
		if err := DecodeStored(enc, &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("the encoder's %s:\n got %+v (%v)\nwant %+v", enc, got, err, want)
		}
	})
}

// encode encodes t as the registry and the API do: without HTML escaping.
func encode(tb testing.TB, t *Task) []byte {
	tb.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(t); err != nil {
		tb.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// TestAppendResponse: partition and version go where the encoder writes
// them, whatever fields the stored task has around them, and what
// encoding/json reads its own way is passed on; what is not one JSON
// object, or holds an output field, is refused.
func TestAppendResponse(t *testing.T) {
	for _, c := range []struct{ stored, want string }{
		{`{}`, `{"partition":3,"version":7}`},
		{` { } `, ` {"partition":3,"version":7 } `},
		{`{"id":"a"}`, `{"id":"a","partition":3,"version":7}`},
		{`{"created_at":"x"}`, `{"partition":3,"version":7,"created_at":"x"}`},
		{`{"id":"a","pause":{"by":"t"}}`, `{"id":"a","partition":3,"version":7,"pause":{"by":"t"}}`},
		{`{"id":"a","max_fires":1,"created_at":"x","updated_at":"y"}`, `{"id":"a","max_fires":1,"partition":3,"version":7,"created_at":"x","updated_at":"y"}`},
		{"{ \"id\" : \"a\" ,\n \"created_at\" : 1 }\n", "{ \"id\" : \"a\",\"partition\":3,\"version\":7 ,\n \"created_at\" : 1 }\n"},
		{`{"labels":{"created_at":"x"},"on_success":["pause"]}`, `{"labels":{"created_at":"x"},"on_success":["pause"],"partition":3,"version":7}`},
		{`{"id":"a","id":"b","labels":{"a":"1","a":"2"}}`, `{"id":"a","id":"b","labels":{"a":"1","a":"2"},"partition":3,"version":7}`},
		{"{\"id\":\"\xff\"}", "{\"id\":\"\xff\",\"partition\":3,\"version\":7}"},
	} {
		got, err := AppendResponse([]byte("keep"), []byte(c.stored), 3, 7)
		if err != nil || string(got) != "keep"+c.want {
			t.Errorf("%s:\n got %s (%v)\nwant keep%s", c.stored, got, err, c.want)
		}
	}
	if got, _ := AppendResponse(nil, []byte(`{"id":"a"}`), 0, 0); string(got) != `{"id":"a","partition":0}` {
		t.Errorf("version 0 is left out (omitempty): %s", got)
	}
	for name, stored := range map[string]string{
		"empty":             ``,
		"truncated":         `{"id":"a"`,
		"not an object":     `["a"]`,
		"a string":          `"a"`,
		"data after":        `{"id":"a"}{}`,
		"bad nested JSON":   `{"retry":{"max_attempts":01}}`,
		"partition":         `{"id":"a","partition":1}`,
		"version":           `{"version":1,"id":"a"}`,
		"state":             `{"id":"a","state":{}}`,
		"state in capitals": `{"id":"a","STATE":{}}`,
		"escaped version":   `{"id":"a","v\u0065rsion":1}`,
	} {
		got, err := AppendResponse([]byte("keep"), []byte(stored), 3, 7)
		if err == nil || string(got) != "keep" {
			t.Errorf("%s: got %s, %v; want an error", name, got, err)
		}
		if strings.Contains(name, "partition") || strings.Contains(name, "version") || strings.Contains(name, "state") {
			if !errors.Is(err, ErrStoredOutputField) {
				t.Errorf("%s: %v, want ErrStoredOutputField", name, err)
			}
		}
	}
}

// BenchmarkDecodeStored compares reading a stored task with json v2
// (DecodeStored) and with json.Unmarshal: a task of the bench's fleet
// (noop, two labels), and one with every field.
func BenchmarkDecodeStored(b *testing.B) {
	fleet := []byte(`{"id":"job-0000001","schedule":"* * * * * *","timezone":"UTC","executor":{"type":"noop"},` +
		`"timeout":"1m0s","retry":{"max_attempts":1,"backoff":"1s","max_backoff":"1m0s"},"misfire":"fire_once",` +
		`"catchup_window":"1m0s","concurrency":"allow","jitter":"0s","paused":false,"labels":{"g":"1","team":"1"},` +
		`"created_at":"2026-12-03T09:00:00.123Z","updated_at":"2026-12-03T09:00:00.123Z"}`)
	for _, c := range []struct {
		name string
		data []byte
	}{{"fleet", fleet}, {"every-field", encoded(b)[0]}} {
		b.Run("task="+c.name+"/impl=json-v2", func(b *testing.B) {
			b.ReportAllocs()
			var t Task
			for b.Loop() {
				if err := DecodeStored(c.data, &t); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("task="+c.name+"/impl=encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var t Task
				if err := json.Unmarshal(c.data, &t); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
