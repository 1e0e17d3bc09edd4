package task

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

func TestCheckShape(t *testing.T) {
	if err := CheckShape(); err != nil {
		t.Fatalf("every task JSON goes through encoding/json: %v", err)
	}
}

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

// firingPart is a projection of Task, as the registry's firing.
type firingPart struct {
	Schedule     string        `json:"schedule"`
	Executor     Executor      `json:"executor"`
	HistoryLimit *HistoryLimit `json:"history_limit"`
	CreatedAt    time.Time     `json:"created_at"`
}

// TestDecodeStored_AsEncodingJSON: task JSON as the encoder writes it is
// read in one pass, into what json.Unmarshal reads, whatever t held.
func TestDecodeStored_AsEncodingJSON(t *testing.T) {
	proj := NewProjection[firingPart]()
	if !proj.ok {
		t.Fatal("the projection is read by encoding/json")
	}
	for i, data := range encoded(t) {
		if end, _, ok := taskShape.walkStruct(data, 0, reflect.Value{}, nil); !ok || end != len(data) {
			t.Errorf("example %d is not read in one pass:\n%s", i, data)
		}
		var want Task
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		got := Task{ID: "old", Labels: map[string]string{"old": "1"}, MaxFires: 9}
		if err := DecodeStored(data, &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("example %d:\n got %+v (%v)\nwant %+v", i, got, err, want)
		}
		var wantPart firingPart
		if err := json.Unmarshal(data, &wantPart); err != nil {
			t.Fatal(err)
		}
		gotPart := firingPart{Schedule: "old"}
		if err := proj.Decode(data, &gotPart); err != nil || !reflect.DeepEqual(gotPart, wantPart) {
			t.Errorf("example %d, projection:\n got %+v (%v)\nwant %+v", i, gotPart, err, wantPart)
		}
	}
}

// TestNewProjection_OtherFieldsUseEncodingJSON: a struct with a field that
// Task has not, or of another type, is read by json.Unmarshal.
func TestNewProjection_OtherFieldsUseEncodingJSON(t *testing.T) {
	type other struct {
		Schedule string `json:"schedule"`
		Extra    string `json:"extra"`
	}
	type retyped struct {
		Schedule []byte `json:"schedule"`
	}
	if NewProjection[other]().ok || NewProjection[retyped]().ok || NewProjection[int]().ok {
		t.Fatal("a projection that is not Task's is read in one pass")
	}
	var got other
	if err := NewProjection[other]().Decode([]byte(`{"schedule":"x","extra":"y"}`), &got); err != nil || got.Extra != "y" {
		t.Fatalf("got %+v, %v", got, err)
	}
}

// FuzzDecodeStored: whatever the JSON, DecodeStored and a projection read
// what json.Unmarshal reads, and fail when it fails.
func FuzzDecodeStored(f *testing.F) {
	for _, data := range encoded(f) {
		f.Add(data)
	}
	f.Add([]byte(apiExample))
	proj := NewProjection[firingPart]()
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want Task
		err, werr := DecodeStored(data, &got), json.Unmarshal(data, &want)
		if (err == nil) != (werr == nil) || (err == nil && !reflect.DeepEqual(got, want)) {
			t.Fatalf("%s:\n got %+v (%v)\nwant %+v (%v)", data, got, err, want, werr)
		}
		var gotPart, wantPart firingPart
		err, werr = proj.Decode(data, &gotPart), json.Unmarshal(data, &wantPart)
		if (err == nil) != (werr == nil) || (err == nil && !reflect.DeepEqual(gotPart, wantPart)) {
			t.Fatalf("projection of %s:\n got %+v (%v)\nwant %+v (%v)", data, gotPart, err, wantPart, werr)
		}
	})
}

// BenchmarkDecodeStored compares reading a stored task in one pass with
// json.Unmarshal: a task of the bench's fleet (noop, two labels), and one
// with every field.
func BenchmarkDecodeStored(b *testing.B) {
	fleet := []byte(`{"id":"job-0000001","schedule":"* * * * * *","timezone":"UTC","executor":{"type":"noop"},` +
		`"timeout":"1m0s","retry":{"max_attempts":1,"backoff":"1s","max_backoff":"1m0s"},"misfire":"fire_once",` +
		`"catchup_window":"1m0s","concurrency":"allow","jitter":"0s","paused":false,"labels":{"g":"1","team":"1"},` +
		`"created_at":"2026-12-03T09:00:00.123Z","updated_at":"2026-12-03T09:00:00.123Z"}`)
	for _, c := range []struct {
		name string
		data []byte
	}{{"fleet", fleet}, {"every-field", encoded(b)[0]}} {
		b.Run("task="+c.name+"/impl=walk", func(b *testing.B) {
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
