package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/engine/executor"
)

// apiExample is the task of docs/api.md's "Task JSON".
const apiExample = `{
  "id": "billing/invoice-42",
  "schedule": "0 */5 * * * *",
  "timezone": "Europe/Berlin",
  "executor": {"type": "http", "url": "http://127.0.0.5/hook", "method": "POST",
               "headers": {"X-Team": "billing"}, "body": "{\"k\":1}"},
  "timeout": "30s",
  "retry": {"max_attempts": 3, "backoff": "1s", "max_backoff": "1m"},
  "misfire": "fire_once",
  "catchup_window": "1m",
  "concurrency": "allow",
  "jitter": "0s",
  "paused": false,
  "labels": {"team": "billing"}
}`

func TestDecodeTask_APIExample(t *testing.T) {
	got, err := DecodeTask([]byte(apiExample))
	if err != nil {
		t.Fatal(err)
	}
	want := &Task{
		ID:       "billing/invoice-42",
		Schedule: "0 */5 * * * *",
		Timezone: "Europe/Berlin",
		Executor: Executor{Type: ExecutorHTTP, URL: "http://127.0.0.5/hook", Method: "POST",
			Headers: map[string]string{"X-Team": "billing"}, Body: `{"k":1}`},
		Timeout:       Duration(30 * time.Second),
		Retry:         Retry{MaxAttempts: 3, Backoff: Duration(time.Second), MaxBackoff: Duration(time.Minute)},
		Misfire:       MisfireFireOnce,
		CatchupWindow: Duration(time.Minute),
		Concurrency:   ConcurrencyAllow,
		Labels:        map[string]string{"team": "billing"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestDecodeTask_Defaults(t *testing.T) {
	got, err := DecodeTask([]byte(`{"id": "a", "schedule": "@hourly", "executor": {"type": "http", "url": "http://127.0.0.1:9/x"}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := &Task{
		ID: "a", Schedule: "@hourly", Timezone: "UTC",
		Executor:      Executor{Type: ExecutorHTTP, URL: "http://127.0.0.1:9/x", Method: "POST"},
		Timeout:       Duration(time.Minute),
		Retry:         Retry{MaxAttempts: 1, Backoff: Duration(time.Second), MaxBackoff: Duration(time.Minute)},
		Misfire:       MisfireFireOnce,
		CatchupWindow: Duration(time.Minute),
		Concurrency:   ConcurrencyAllow,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	// null is the same as leaving a field out.
	nulls, err := DecodeTask([]byte(`{"id": "a", "schedule": "@hourly", "executor": {"type": "http", "url": "http://127.0.0.1:9/x", "method": null},
		"timezone": null, "timeout": null, "retry": null, "misfire": null, "catchup_window": null, "concurrency": null, "jitter": null, "paused": null, "labels": null}`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(nulls, want) {
		t.Errorf("with nulls: got %+v\nwant %+v", nulls, want)
	}
	// A long backoff raises the default max_backoff with it.
	long, err := DecodeTask([]byte(`{"id": "a", "schedule": "@hourly", "executor": {"type": "noop"}, "retry": {"max_attempts": 5, "backoff": "5m"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if long.Retry.MaxBackoff != Duration(5*time.Minute) {
		t.Errorf("max_backoff = %v, want 5m", long.Retry.MaxBackoff)
	}
}

// A schedule is stored without the spaces around it; one of spaces only is
// missing.
func TestDecodeTask_ScheduleTrimmed(t *testing.T) {
	got, err := DecodeTask([]byte(`{"id": "a", "schedule": " 0 0 * * *\n", "executor": {"type": "noop"}}`))
	if err != nil || got.Schedule != "0 0 * * *" {
		t.Fatalf("schedule %q, %v; want \"0 0 * * *\"", got.Schedule, err)
	}
	_, err = DecodeTask([]byte(`{"id": "a", "schedule": " \t", "executor": {"type": "noop"}}`))
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Field != "schedule" || !strings.Contains(ve.Error(), "required") {
		t.Fatalf("a schedule of spaces: %v, want schedule required", err)
	}
}

func TestDecodeTask_MethodCase(t *testing.T) {
	for method, want := range map[string]string{
		"post": "POST", "Get": "GET", "pAtCh": "PATCH", "DELETE": "DELETE",
		"PURGE": "PURGE", "purge": "purge", // extension methods are case-sensitive: kept as written
	} {
		got, err := DecodeTask([]byte(`{"id": "a", "schedule": "@hourly", "executor": {"type": "http", "url": "http://127.0.0.1:9/x", "method": "` + method + `"}}`))
		if err != nil {
			t.Fatalf("method %q: %v", method, err)
		}
		if got.Executor.Method != want {
			t.Errorf("method %q: stored as %q, want %q", method, got.Executor.Method, want)
		}
	}
}

// A task stored before methods were made canonical is sent with the
// canonical method too.
func TestExecutor_StoredLowerCaseMethodSentCanonical(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Method }))
	defer srv.Close()
	e := Executor{Type: ExecutorHTTP, URL: srv.URL, Method: "post"} // as stored, not validated
	ex, err := e.Build(&executor.Shared{HTTP: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if err := ex.Execute(context.Background(), &executor.Fire{TaskID: "a", ScheduledAt: time.Now(), Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if m := <-got; m != "POST" {
		t.Errorf("sent method %q, want POST", m)
	}
}

// A task stored before the headers Go's HTTP client controls were refused
// still builds and fires: the client drops the header as it did. Host,
// which the executor sends as the request's host, is accepted.
func TestExecutor_StoredClientHeaderStillFires(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Host }))
	defer srv.Close()
	e := Executor{Type: ExecutorHTTP, URL: srv.URL, Body: "abc", // as stored, not validated
		Headers: map[string]string{"Content-Length": "99", "Transfer-Encoding": "gzip", "Host": "example.test"}}
	ex, err := e.Build(&executor.Shared{HTTP: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if err := ex.Execute(context.Background(), &executor.Fire{TaskID: "a", ScheduledAt: time.Now(), Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if host := <-got; host != "example.test" {
		t.Errorf("sent Host %q, want example.test", host)
	}
	if _, err := DecodeTask([]byte(`{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"Host": "example.test"}}}`)); err != nil {
		t.Errorf("a Host header: %v", err)
	}
}

func TestDecodeTask_Kinds(t *testing.T) {
	for _, doc := range []string{
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec", "command": ["/bin/backup", "--full"], "env": {"MODE": "x"}}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "handler", "name": "report", "payload": {"k": [1, 2, {"x": null}]}}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "handler", "name": "report", "payload": "<b>"}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "handler", "name": "report"}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://h:8080/p?q=1", "method": "PATCH", "headers": {"Content-Type": "application/json", "X-A": "b\tc"}}}`,
		`{"id": "` + strings.Repeat("x", 256) + `", "schedule": "H H * * *", "timezone": "America/New_York", "executor": {"type": "noop"}}`,
		`{"id": "日本/タスク", "schedule": "@every 2h", "executor": {"type": "noop"}, "misfire": "fire_all", "concurrency": "replace", "jitter": "1h", "timeout": "24h", "catchup_window": "24h", "paused": true}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}, "labels": {"a.b/c_d-e": "", "X": "` + strings.Repeat("v", 256) + `"}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}, "history_limit": {"successes": 0, "failures": 100}}`,
		`{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}, "history_limit": {"failures": 3}}`,
	} {
		task, err := DecodeTask([]byte(doc))
		if err != nil {
			t.Errorf("DecodeTask(%s): %v", doc, err)
			continue
		}
		assertRoundTrip(t, task)
	}
}

// TestDecodeTask_OutputOnlyFields checks that a task as the API returns it
// can be PUT back: the output-only fields are accepted and ignored.
func TestDecodeTask_OutputOnlyFields(t *testing.T) {
	p := 7
	resp := mustDecode(t, apiExample)
	resp.Partition = &p
	resp.Version = 42
	resp.CreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	resp.UpdatedAt = resp.CreatedAt.Add(time.Hour)
	resp.State = &State{Owner: "node-1", NextFireAt: resp.UpdatedAt, LastStatus: "ok", Fires: 3}
	data, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"partition":7`, `"version":42`, `"created_at":"2026-01-02T03:04:05Z"`, `"state":{"owner":"node-1"`} {
		if !strings.Contains(string(data), f) {
			t.Errorf("response %s lacks %s", data, f)
		}
	}
	back, err := DecodeTask(data)
	if err != nil {
		t.Fatalf("PUT back what GET answered: %v", err)
	}
	want := mustDecode(t, apiExample)
	want.CreatedAt = resp.CreatedAt // read, for a create to keep
	if !reflect.DeepEqual(back, want) {
		t.Errorf("output-only fields not ignored: %+v", back)
	}
	// A decoded task does not marshal them.
	plain, _ := json.Marshal(back)
	for _, f := range outputOnlyFields {
		if strings.Contains(string(plain), `"`+f+`"`) {
			t.Errorf("decoded task marshals %s: %s", f, plain)
		}
	}
}

// TestDecodeTask_PauseRecord: a paused task's pause record, as an export
// writes it, is read, for an import to keep who paused the task, when and
// why; a task not paused has none, whatever record it gives. It was
// ignored, as an output field, and an export read back lost it.
func TestDecodeTask_PauseRecord(t *testing.T) {
	const base = `"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}, `
	rec := `"pause": {"note": "INC-9: vendor down", "by": "token", "at": "2026-01-02T03:04:05.678Z"}`
	paused := mustDecode(t, `{`+base+`"paused": true, `+rec+`}`)
	want := &Pause{Note: "INC-9: vendor down", By: "token", At: time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.UTC)}
	if !reflect.DeepEqual(paused.Pause, want) {
		t.Errorf("a paused task's record decoded as %+v, want %+v", paused.Pause, want)
	}
	if running := mustDecode(t, `{`+base+`"paused": false, `+rec+`}`); running.Pause != nil {
		t.Errorf("a task not paused kept the record %+v", running.Pause)
	}
}

// TestDecodeTask_Invalid is the table of refused inputs, each with the field
// the error names.
func TestDecodeTask_Invalid(t *testing.T) {
	const base = `"id": "a", "schedule": "* * * * *", "executor": {"type": "noop"}`
	with := func(extra string) string { return `{` + base + `, ` + extra + `}` }
	tests := []struct {
		name, doc, field, reason string // reason: a substring of the message
	}{
		{"oversized", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "body": "` + strings.Repeat("b", MaxTaskSize) + `"}}`, "", "more than the limit of 65536"},
		{"malformed", `{"id": "a",`, "", "malformed JSON"},
		{"malformed nested", with(`"labels": {"a": }`), "", "malformed JSON at byte"},
		{"trailing data", `{` + base + `} {}`, "", "after top-level value"},
		{"not an object", `["a"]`, "", "task must be a JSON object, got an array"},
		{"null", `null`, "", "task must be a JSON object, got null"},
		{"empty", ``, "", "malformed JSON"},
		{"invalid UTF-8", "{\"id\": \"a\xff\", \"schedule\": \"* * * * *\", \"executor\": {\"type\": \"noop\"}}", "", "not valid UTF-8"},
		{"unknown field", with(`"retries": 3`), "retries", "unknown field (did you mean \"retry\"?)"},
		{"a field twice", with(`"paused": true, "paused": false`), "paused", "given twice"},
		{"a nested field twice", `{"id": "a", "schedule": "@hourly", "executor": {"type": "noop", "type": "http"}}`, "executor.type", "given twice"},
		{"a label twice", with(`"labels": {"k": "1", "k": "2"}`), "labels.k", "given twice"},
		{"a field twice after a lone surrogate", with(`"labels": {"k": "\ud800"}, "paused": true, "paused": false`), "paused", "given twice"},
		{"unknown field, case", with(`"Paused": true`), "Paused", "did you mean \"paused\""},
		{"unknown field, far", with(`"color": "red"`), "color", "unknown field (want one of id, schedule"},
		{"unknown executor field", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "uri": "y"}}`, "executor.uri", "did you mean \"url\""},
		{"unknown retry field", with(`"retry": {"attempts": 2}`), "retry.attempts", "unknown field"},
		{"missing id", `{"schedule": "* * * * *", "executor": {"type": "noop"}}`, "id", "required"},
		{"id too long", `{"id": "` + strings.Repeat("x", 257) + `", "schedule": "* * * * *", "executor": {"type": "noop"}}`, "id", "257 bytes, more than 256"},
		{"id control char", `{"id": "a\nb", "schedule": "* * * * *", "executor": {"type": "noop"}}`, "id", "control character U+000A"},
		{"id C1 control char", `{"id": "a\u0085b", "schedule": "* * * * *", "executor": {"type": "noop"}}`, "id", "control character U+0085"},
		{"id not a string", `{"id": 42, "schedule": "* * * * *", "executor": {"type": "noop"}}`, "id", "want a string, got 42"},
		{"missing schedule", `{"id": "a", "executor": {"type": "noop"}}`, "schedule", "required"},
		{"invalid cron", `{"id": "a", "schedule": "61 * * * * *", "executor": {"type": "noop"}}`, "schedule", `"61 * * * * *": second 61 out of range 0-59`},
		{"never fires", `{"id": "a", "schedule": "0 0 30 2 *", "executor": {"type": "noop"}}`, "schedule", "never fires"},
		{"sub-second every", `{"id": "a", "schedule": "@every 500ms", "executor": {"type": "noop"}}`, "schedule", `"@every 500ms": interval must be whole seconds and at least 1s`},
		{"TZ= prefix", `{"id": "a", "schedule": "TZ=Europe/Berlin 0 * * * *", "executor": {"type": "noop"}}`, "schedule", "put the zone in the timezone field"},
		{"bad H", `{"id": "a", "schedule": "0 0 H(1-31) * *", "executor": {"type": "noop"}}`, "schedule", "within 1-28"},
		{"unknown zone", with(`"timezone": "Mars/Olympus"`), "timezone", `unknown time zone "Mars/Olympus"`},
		{"Local zone", with(`"timezone": "Local"`), "timezone", "differs between machines"},
		{"missing executor", `{"id": "a", "schedule": "* * * * *"}`, "executor", "required"},
		{"executor not an object", `{"id": "a", "schedule": "* * * * *", "executor": "noop"}`, "executor", "want an object, got a string"},
		{"missing executor type", `{"id": "a", "schedule": "* * * * *", "executor": {}}`, "executor.type", "required"},
		{"unknown executor", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "ftp"}}`, "executor.type", `unknown executor "ftp" (want http, exec, handler or noop)`},
		{"http without url", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http"}}`, "executor.url", "required"},
		{"http relative url", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "/hook"}}`, "executor.url", "absolute http or https URL"},
		{"http ftp url", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "ftp://x/y"}}`, "executor.url", "absolute http or https URL"},
		{"http port out of range", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://127.0.0.1:99999/"}}`, "executor.url", "want 1 to 65535"},
		{"http port zero", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://127.0.0.1:0/"}}`, "executor.url", "want 1 to 65535"},
		{"http no host", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://:80/"}}`, "executor.url", "names no host"},
		{"http bad url", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x y/"}}`, "executor.url", "not a valid URL"},
		{"http bad method", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "method": "GE T"}}`, "executor.method", "not an HTTP method"},
		{"http bad header name", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"X Y": "z"}}}`, "executor.headers", "not a valid header name"},
		{"http header injection", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"X": "a\r\nEvil: 1"}}}`, "executor.headers", "control character U+000D"},
		{"http reserved header", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"idempotency-key": "k"}}}`, "executor.headers", "set by the executor itself"},
		{"http content-length", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"Content-Length": "3"}}}`, "executor.headers", `"Content-Length" is set by the HTTP client itself, from the body: a task cannot set it`},
		{"http transfer-encoding", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"transfer-encoding": "chunked"}}}`, "executor.headers", `"transfer-encoding" is set by the HTTP client itself`},
		{"http trailer", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"Trailer": "X"}}}`, "executor.headers", "is set by the HTTP client itself"},
		{"http connection", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"Connection": "close"}}}`, "executor.headers", `"Connection" is a header of the connection (hop-by-hop)`},
		{"http keep-alive", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"Keep-Alive": "timeout=5"}}}`, "executor.headers", "hop-by-hop"},
		{"http proxy-connection", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"Proxy-Connection": "keep-alive"}}}`, "executor.headers", "hop-by-hop"},
		{"http te", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"TE": "trailers"}}}`, "executor.headers", "hop-by-hop"},
		{"http upgrade", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"Upgrade": "websocket"}}}`, "executor.headers", "hop-by-hop"},
		{"http header not a string", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"X": 1}}}`, "executor.headers.X", "want a string, got 1"},
		{"exec without command", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec"}}`, "executor.command", "required"},
		{"exec empty command", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec", "command": []}}`, "executor.command", "required"},
		{"exec command string", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec", "command": "ls -l"}}`, "executor.command", "want an array of strings, got a string"},
		{"exec command element", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec", "command": ["ls", 1]}}`, "executor.command[1]", "want a string, got 1"},
		{"exec bad env", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec", "command": ["ls"], "env": {"A=B": "c"}}}`, "executor.env", "not a valid variable name"},
		{"handler without name", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "handler", "payload": 1}}`, "executor.name", "required"},
		{"url on noop", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "noop", "url": "http://x/"}}`, "executor.url", `not allowed with executor type "noop" (url is for http)`},
		{"command on http", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "command": ["ls"]}}`, "executor.command", "command is for exec"},
		{"payload on exec", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec", "command": ["ls"], "payload": {}}}`, "executor.payload", "payload is for handler"},
		{"timeout number", with(`"timeout": 30`), "timeout", `want a duration string such as "30s", got 30`},
		{"timeout garbage", with(`"timeout": "30 seconds"`), "timeout", `"30 seconds" is not a duration`},
		{"timeout zero", with(`"timeout": "0s"`), "timeout", "0s is not more than 0"},
		{"timeout negative", with(`"timeout": "-1s"`), "timeout", "-1s is not more than 0"},
		{"timeout too long", with(`"timeout": "25h"`), "timeout", "25h0m0s is more than 24h0m0s"},
		{"timeout overflow", with(`"timeout": "9999999999h"`), "timeout", "is not a duration"},
		{"retry not an object", with(`"retry": 3`), "retry", "want an object, got 3"},
		{"max_attempts zero", with(`"retry": {"max_attempts": 0}`), "retry.max_attempts", "0 is not within 1-100"},
		{"max_attempts too many", with(`"retry": {"max_attempts": 101}`), "retry.max_attempts", "101 is not within 1-100"},
		{"max_attempts fraction", with(`"retry": {"max_attempts": 1.5}`), "retry.max_attempts", "want a whole number, got 1.5"},
		{"max_attempts string", with(`"retry": {"max_attempts": "3"}`), "retry.max_attempts", "want a whole number, got a string"},
		{"backoff zero", with(`"retry": {"backoff": "0s"}`), "retry.backoff", "not more than 0"},
		{"history_limit not an object", with(`"history_limit": 10`), "history_limit", "want an object, got 10"},
		{"history_limit unknown field", with(`"history_limit": {"success": 3}`), "history_limit.success", `unknown field (did you mean "successes"?)`},
		{"history successes negative", with(`"history_limit": {"successes": -1}`), "history_limit.successes",
			"-1 is not within 0-100 (leave it out for the node's --history-success-limit)"},
		{"history failures too many", with(`"history_limit": {"failures": 101}`), "history_limit.failures",
			"101 is not within 0-100 (leave it out for the node's --history-failure-limit)"},
		{"history successes fraction", with(`"history_limit": {"successes": 2.5}`), "history_limit.successes", "want a whole number, got 2.5"},
		{"history failures string", with(`"history_limit": {"failures": "3"}`), "history_limit.failures", "want a whole number, got a string"},
		{"max_backoff below backoff", with(`"retry": {"backoff": "10s", "max_backoff": "5s"}`), "retry.max_backoff", "5s is less than retry.backoff 10s"},
		{"misfire", with(`"misfire": "sometimes"`), "misfire", `unknown policy "sometimes" (want fire_once, skip or fire_all)`},
		{"catchup zero", with(`"catchup_window": "0s"`), "catchup_window", "not more than 0"},
		{"catchup negative", with(`"catchup_window": "-1m"`), "catchup_window", "not more than 0"},
		{"concurrency", with(`"concurrency": "queue"`), "concurrency", `unknown policy "queue" (want allow, forbid, buffer_one or replace)`},
		{"jitter negative", with(`"jitter": "-1s"`), "jitter", "not more than 0"},
		{"jitter too long", with(`"jitter": "2h"`), "jitter", "2h0m0s is more than 1h0m0s"},
		{"jitter not under the period", `{"id": "a", "schedule": "*/10 * * * * *", "executor": {"type": "noop"}, "jitter": "10s"}`, "jitter", "not shorter than the schedule's shortest interval 10s"},
		{"paused not bool", with(`"paused": "yes"`), "paused", "want true or false, got a string"},
		{"pause not an object", with(`"paused": true, "pause": "me"`), "pause", "want an object, got a string"},
		{"pause unknown field", with(`"paused": true, "pause": {"by": "me", "why": "x"}`), "pause.why", "unknown field"},
		{"pause without who", with(`"paused": true, "pause": {"note": "x"}`), "pause.by", "required"},
		{"pause who too long", with(`"paused": true, "pause": {"by": "` + strings.Repeat("b", MaxPauseBy+1) + `"}`), "pause.by", "more than the limit of 64"},
		{"pause note control", with(`"paused": true, "pause": {"by": "me", "note": "a\u0000b"}`), "pause.note", "control character U+0000"},
		{"pause at not a time", with(`"paused": true, "pause": {"by": "me", "at": "yesterday"}`), "pause.at", "not an RFC 3339 time"},
		{"labels not object", with(`"labels": ["a"]`), "labels", "want an object of strings, got an array"},
		{"label value not string", with(`"labels": {"team": 7}`), "labels.team", "want a string, got 7"},
		// null inside an object or array of strings is no string: taken as "", it
		// ran exec commands with an empty argument and sent empty headers.
		{"label value null", with(`"labels": {"team": null}`), "labels.team", "want a string, got null"},
		{"http header null", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "http", "url": "http://x/", "headers": {"X": null}}}`, "executor.headers.X", "want a string, got null"},
		{"exec command element null", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec", "command": ["ls", null]}}`, "executor.command[1]", "want a string, got null"},
		{"exec env null", `{"id": "a", "schedule": "* * * * *", "executor": {"type": "exec", "command": ["ls"], "env": {"A": null}}}`, "executor.env.A", "want a string, got null"},
		{"on_success element null", with(`"on_success": [null]`), "on_success[0]", "want a string, got null"},
		{"label key charset", with(`"labels": {"te am": "x"}`), "labels", `key "te am"`},
		{"label key empty", with(`"labels": {"": "x"}`), "labels", `key ""`},
		{"label key too long", with(`"labels": {"` + strings.Repeat("k", 64) + `": "x"}`), "labels", "want 1-63 bytes"},
		{"label value too long", with(`"labels": {"k": "` + strings.Repeat("v", 257) + `"}`), "labels", "257 bytes, more than 256"},
		{"label value with a control character", with(`"labels": {"k": "a\u0000b"}`), "labels", "control character U+0000"},
		{"too many labels", with(`"labels": {` + manyLabels(65) + `}`), "labels", "65 labels, more than 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task, err := DecodeTask([]byte(tt.doc))
			if err == nil {
				t.Fatalf("accepted: %+v", task)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
			}
			if ve.Field != tt.field {
				t.Errorf("Field = %q, want %q (%v)", ve.Field, tt.field, err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not contain %q", err, tt.reason)
			}
			if tt.field != "" && !strings.HasPrefix(err.Error(), tt.field+": ") {
				t.Errorf("error %q does not start with the field", err)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error is %d bytes long", len(err.Error()))
			}
		})
	}
}

func manyLabels(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`"k` + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `": "v"`)
	}
	return b.String()
}

// TestDecodeTask_ErrorMessages pins the exact messages of the examples the
// contract and the style guide give.
func TestDecodeTask_ErrorMessages(t *testing.T) {
	tests := []struct{ doc, want string }{
		{`{"id": "a", "schedule": "61 * * * * *", "executor": {"type": "noop"}}`, `schedule: "61 * * * * *": second 61 out of range 0-59`},
		{`{"id": "a", "schedule": "* * * * *", "executor": {"type": "ftp"}}`, `executor.type: unknown executor "ftp" (want http, exec, handler or noop)`},
		{`{"id": "a", "schedule": "@every 500ms", "executor": {"type": "noop"}}`, `schedule: "@every 500ms": interval must be whole seconds and at least 1s`},
		{`{"id": "a", "schedule": "* * * * *", "timezone": "Mars/Olympus", "executor": {"type": "noop"}}`, `timezone: unknown time zone "Mars/Olympus" (want an IANA name such as "Europe/Berlin")`},
		{`{"id": "a", "schedule": "0 0 30 2 *", "executor": {"type": "noop"}}`, `schedule: "0 0 30 2 *": never fires: day-of-month 30 does not exist in February`},
	}
	for _, tt := range tests {
		_, err := DecodeTask([]byte(tt.doc))
		if err == nil || err.Error() != tt.want {
			t.Errorf("DecodeTask(%s)\n got %v\nwant %s", tt.doc, err, tt.want)
		}
	}
}

func TestTask_Validate(t *testing.T) {
	task := &Task{ID: "go/built", Schedule: "*/5 * * * *", Executor: Executor{Type: ExecutorHandler, Name: "h", Payload: json.RawMessage(`{ "a" : [1, 2] }`)}}
	if err := task.Validate(); err != nil {
		t.Fatal(err)
	}
	if task.Timezone != "UTC" || task.Timeout != Duration(time.Minute) || task.Retry.MaxAttempts != 1 ||
		task.Retry.Backoff != Duration(time.Second) || task.Retry.MaxBackoff != Duration(time.Minute) ||
		task.Misfire != MisfireFireOnce || task.CatchupWindow != Duration(time.Minute) || task.Concurrency != ConcurrencyAllow {
		t.Errorf("defaults not applied: %+v", task)
	}
	if string(task.Executor.Payload) != `{"a":[1,2]}` {
		t.Errorf("payload not compacted: %s", task.Executor.Payload)
	}
	before := *task
	if err := task.Validate(); err != nil || !reflect.DeepEqual(*task, before) {
		t.Errorf("Validate is not idempotent: %v, %+v", err, task)
	}
	assertRoundTrip(t, task)

	bad := []struct {
		task  Task
		field string
	}{
		{Task{Schedule: "* * * * *", Executor: Executor{Type: ExecutorNoop}}, "id"},
		{Task{ID: "a\x00", Schedule: "* * * * *", Executor: Executor{Type: ExecutorNoop}}, "id"},
		{Task{ID: "a\xff", Schedule: "* * * * *", Executor: Executor{Type: ExecutorNoop}}, "id"},
		{Task{ID: "a", Schedule: "* * * * *", Timezone: "Nowhere/City", Executor: Executor{Type: ExecutorNoop}}, "timezone"},
		{Task{ID: "a", Schedule: "* * * * *", Executor: Executor{Type: ExecutorNoop}, Timeout: -1}, "timeout"},
		{Task{ID: "a", Schedule: "* * * * *", Executor: Executor{Type: ExecutorNoop}, Retry: Retry{MaxAttempts: -1}}, "retry.max_attempts"},
		{Task{ID: "a", Schedule: "* * * * *", Executor: Executor{Type: ExecutorHandler, Name: "h", Payload: json.RawMessage(`{`)}}, "executor.payload"},
		{Task{ID: "a", Schedule: "* * * * *", Executor: Executor{Type: ExecutorExec, Command: []string{"ls", "a\x00"}}}, "executor.command"},
		{Task{ID: "a", Schedule: "* * * * *", Executor: Executor{Type: ExecutorNoop}, Labels: map[string]string{"k": "\xff"}}, "labels"},
		{Task{ID: "a", Schedule: "* * * * *", Executor: Executor{Type: ExecutorNoop}, HistoryLimit: &HistoryLimit{Failures: new(101)}}, "history_limit.failures"},
	}
	for _, tt := range bad {
		err := tt.task.Validate()
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != tt.field {
			t.Errorf("Validate(%+v) = %v, want a *ValidationError for %s", tt.task, err, tt.field)
		}
	}
}

func TestDuration_JSON(t *testing.T) {
	var d Duration
	if err := json.Unmarshal([]byte(`"1m30s"`), &d); err != nil || d != Duration(90*time.Second) {
		t.Errorf("Unmarshal: %v, %v", d, err)
	}
	if b, err := json.Marshal(Duration(90 * time.Second)); err != nil || string(b) != `"1m30s"` {
		t.Errorf("Marshal: %s, %v", b, err)
	}
	if err := json.Unmarshal([]byte(`90`), &d); err == nil {
		t.Error("accepted a number")
	}
	if err := json.Unmarshal([]byte(`null`), &d); err != nil || d != Duration(90*time.Second) {
		t.Errorf("null changed the duration: %v, %v", d, err)
	}
}

func mustDecode(t *testing.T, doc string) *Task {
	t.Helper()
	task, err := DecodeTask([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return task
}

// assertRoundTrip checks that task encodes and decodes to an equal task.
func assertRoundTrip(t *testing.T, task *Task) {
	t.Helper()
	data, err := json.Marshal(task)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeTask(data)
	if err != nil {
		t.Fatalf("re-decoding %s: %v", data, err)
	}
	if !reflect.DeepEqual(back, task) {
		t.Errorf("round trip changed the task:\n got %+v\nwant %+v\njson %s", back, task, data)
	}
}

func ExampleDecodeTask() {
	task, err := DecodeTask([]byte(`{"id": "reports/daily", "schedule": "H 6 * * mon-fri", "timezone": "Europe/Berlin",
		"executor": {"type": "http", "url": "https://reports.internal/run"}}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(task.Executor.Method, task.Timeout, task.Retry.MaxAttempts, task.Misfire)

	_, err = DecodeTask([]byte(`{"id": "x", "schedule": "* * * * *", "executor": {"type": "ftp"}}`))
	var ve *ValidationError
	if errors.As(err, &ve) {
		fmt.Println(ve.Field, "|", err)
	}
	// Output:
	// POST 1m0s 1 fire_once
	// executor.type | executor.type: unknown executor "ftp" (want http, exec, handler or noop)
}

// BenchmarkDecodeTask reads a task as the API receives it: one line of an
// import (noop, no defaults written) and docs/api.md's example.
func BenchmarkDecodeTask(b *testing.B) {
	for _, c := range []struct{ name, data string }{
		{"import-line", `{"id":"job-0000001","schedule":"@every 1s","executor":{"type":"noop"}}`},
		{"api-example", apiExample},
	} {
		b.Run("task="+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeTask([]byte(c.data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestPeekID(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":"x","schedule":"@hourly"}`:                    "x",
		`{"schedule":"@hourly","id":"x"}`:                    "x",
		`{"labels":{"id":"y"},"tags":[{"id":"z"}],"id":"x"}`: "x",
		`{"id":"a\u0062"}`:                                   "ab",
		`{"id":1}`:                                           "",
		`{"schedule":"@hourly"}`:                             "",
		`["id","x"]`:                                         "",
		`{"id":"x"`:                                          "x",
		`{"id"`:                                              "",
	} {
		if got := PeekID([]byte(in)); got != want {
			t.Errorf("PeekID(%s) = %q, want %q", in, got, want)
		}
	}
}
