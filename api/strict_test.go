package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/internal/etcdtest"
)

// TestServer_PutRefusesANameGivenTwice: a PUT whose body gives a top-level
// field twice is refused, as the batch and a body with its id are, with
// or without dry_run, and nothing is stored; adding the path's id to the
// body must not drop one of the two before the check sees them.
func TestServer_PutRefusesANameGivenTwice(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	for _, tc := range []struct{ field, body string }{
		{"schedule", `{"schedule":"* * * * *","schedule":"0 * * * *","executor":{"type":"noop"}}`},
		{"executor", `{"schedule":"* * * * *","executor":{"type":"noop"},"executor":{"type":"handler","name":"h"}}`},
		{"timezone", `{"schedule":"* * * * *","timezone":"UTC","timezone":"Europe/Paris","executor":{"type":"noop"}}`},
		{"paused", `{"schedule":"* * * * *","paused":true,"executor":{"type":"noop"},"paused":false}`},
	} {
		for _, query := range []string{"", "?dry_run=1"} {
			t.Run(tc.field+query, func(t *testing.T) {
				wantError(t, call(t, n.ts, "PUT", "/v1/tasks/t1"+query, tc.body), http.StatusBadRequest,
					tc.field+": given twice: which one was meant?")
			})
		}
	}
	wantError(t, call(t, n.ts, "GET", "/v1/tasks/t1", ""), http.StatusNotFound, "t1")
}

// TestServer_ListRefusesQueriesNothingCanAnswer: a list parameter read
// once and given twice is refused, naming it, as a label with two values
// is; so are a prefix and a label key that no task can match (the task
// model's rules), in a query or a bulk selector, instead of an empty
// answer. Labels may repeat, and a label value is not judged.
func TestServer_ListRefusesQueriesNothingCanAnswer(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	if a := call(t, n.ts, "PUT", "/v1/tasks/q%2F1", `{"schedule":"@yearly","executor":{"type":"noop"},"labels":{"team":"x","env":"prod"}}`); a.status != http.StatusOK {
		t.Fatalf("put: %s", a)
	}
	for _, tc := range []struct{ name, method, path, body string }{
		{"limit twice", "GET", "/v1/tasks?limit=1&limit=2", ""},
		{"cursor twice", "GET", "/v1/tasks?cursor=a&cursor=b", ""},
		{"prefix twice", "GET", "/v1/tasks?prefix=q/&prefix=r/", ""},
		{"status twice", "GET", "/v1/tasks?status=failing&status=paused", ""},
		{"prefix twice in an export", "GET", "/v1/tasks:export?prefix=q/&prefix=r/", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, _, _ := strings.Cut(tc.name, " ")
			wantError(t, call(t, n.ts, tc.method, tc.path, tc.body), http.StatusBadRequest, name+": given 2 times")
		})
	}
	for _, tc := range []struct{ name, method, path, body, field, why string }{
		{"label key", "GET", "/v1/tasks?label=bad%20key=v", "", "label:", `"bad key"`},
		{"label key by status", "GET", "/v1/tasks?status=failing&label=bad%20key=v", "", "label:", `"bad key"`},
		{"label key in an export", "GET", "/v1/tasks:export?label=team=x&label=b%C3%A9=v", "", "label:", `"bé"`},
		{"prefix not UTF-8", "GET", "/v1/tasks?prefix=%FF", "", "prefix:", "not valid UTF-8"},
		{"prefix not UTF-8 by status", "GET", "/v1/tasks?status=paused&prefix=%FF", "", "prefix:", "not valid UTF-8"},
		{"prefix not UTF-8 in an export", "GET", "/v1/tasks:export?prefix=%FF", "", "prefix:", "not valid UTF-8"},
		{"prefix with a control character", "GET", "/v1/tasks?prefix=q%01", "", "prefix:", "control character"},
		{"selector label key", "POST", "/v1/tasks:pause", `{"labels":{"bad key":"v"}}`, "labels:", `"bad key"`},
		{"selector label key with a prefix", "POST", "/v1/tasks:delete", `{"prefix":"q/","labels":{"team":"x","":"v"}}`, "labels:", `key ""`},
		{"selector prefix", "POST", "/v1/tasks:resume", `{"prefix":"q\u0001"}`, "prefix:", "control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, call(t, n.ts, tc.method, tc.path, tc.body), http.StatusBadRequest, tc.field, tc.why)
		})
	}
	if got, err := n.c.GetTask(t.Context(), "q/1"); err != nil || got.Paused {
		t.Fatalf("refused bulk actions changed q/1: paused %v, err %v", got != nil && got.Paused, err)
	}

	// What a task can match is still answered.
	for _, path := range []string{
		"/v1/tasks?label=team=x&label=env=prod&prefix=q/",
		"/v1/tasks?label=team=x&label=team=x", // the same label twice asks for it once
		"/v1/tasks:export?prefix=q/&label=team=x",
	} {
		a := call(t, n.ts, "GET", path, "")
		if a.status != http.StatusOK || !strings.Contains(string(a.body), `"q/1"`) {
			t.Fatalf("%s: %s, want q/1", path, a)
		}
	}
	for _, path := range []string{
		"/v1/tasks?prefix=%C3%A9",          // é: whole characters
		"/v1/tasks?label=team=a%09b",       // a tab: values stored before they were refused stay findable
		"/v1/tasks?label=team=%FF&limit=5", // and values are not judged at all
	} {
		var page client.ListResponse
		if a := call(t, n.ts, "GET", path, ""); a.status != http.StatusOK || json.Unmarshal(a.body, &page) != nil || len(page.Tasks) != 0 {
			t.Fatalf("%s: %s, want an empty page", path, a)
		}
	}
}

// TestServer_ResumeTakesNoBody: a resume with no body, blanks or {}
// resumes; with any other body it is refused and the task stays paused.
func TestServer_ResumeTakesNoBody(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	if a := call(t, n.ts, "PUT", "/v1/tasks/r1", `{"schedule":"@yearly","executor":{"type":"noop"},"paused":true}`); a.status != http.StatusOK {
		t.Fatalf("put: %s", a)
	}
	paused := func() bool {
		t.Helper()
		got, err := n.c.GetTask(t.Context(), "r1")
		if err != nil {
			t.Fatal(err)
		}
		return got.Paused
	}
	for _, tc := range []struct{ body, want string }{
		{"garbage{{", "malformed JSON"},
		{`{"note":"back"}`, "note: unknown field"},
		{`[]`, "want an object"},
		{`{} {}`, "malformed JSON"},
	} {
		wantError(t, call(t, n.ts, "POST", "/v1/tasks/r1/resume", tc.body), http.StatusBadRequest, tc.want)
		if !paused() {
			t.Fatalf("a resume with the body %q was refused and resumed the task", tc.body)
		}
	}
	for _, body := range []string{"", " \r\n\t", "{}", " { } \n"} {
		if a := call(t, n.ts, "POST", "/v1/tasks/r1/pause", ""); a.status != http.StatusOK {
			t.Fatalf("pause: %s", a)
		}
		if a := call(t, n.ts, "POST", "/v1/tasks/r1/resume", body); a.status != http.StatusOK {
			t.Fatalf("resume with the body %q: %s", body, a)
		}
		if paused() {
			t.Fatalf("a resume with the body %q left the task paused", body)
		}
	}
}

// TestServer_StatesDecodesStrictly: the node-to-node body of
// POST /v1/tasks:states is read as the other small bodies are: a value of
// the wrong type, an unknown field and a field given twice are refused
// with the field named in the JSON's terms.
func TestServer_StatesDecodesStrictly(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	for _, tc := range []struct{ body, want string }{
		{`{"ids":5}`, "ids: want an array, got a number"},
		{`{"ids":["a"],"idz":["b"]}`, "idz: unknown field"},
		{`{"ids":["a"],"ids":["b"]}`, "ids: given twice"},
		{`{"ids":[1]}`, "ids.0: want a string, got a number"},
		{`{"ids":[]} x`, "malformed JSON"},
	} {
		a := call(t, n.ts, "POST", "/v1/tasks:states", tc.body)
		wantError(t, a, http.StatusBadRequest, tc.want, `want {"ids": [task ids]}`)
		if strings.Contains(string(a.body), "Go struct") {
			t.Fatalf("%s: the error names Go's types: %s", tc.body, a.body)
		}
	}
	var got client.StatesAnswer
	if a := call(t, n.ts, "POST", "/v1/tasks:states", `{"ids":["none"]}`); a.status != http.StatusOK ||
		json.Unmarshal(a.body, &got) != nil || len(got.States) != 1 || got.States[0] != nil {
		t.Fatalf("states of a task nobody holds: %s", a)
	}
}

// An export sends its headers with its first task, not a chunk of 64 KiB
// later: a client bounds its wait for them (task export's --timeout), and
// an export of a few tasks behind a slow scan gave them at its very end.
func TestServer_ExportBeginsWithItsFirstTask(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	if a := call(t, n.ts, "PUT", "/v1/tasks/x%2F1", `{"schedule":"@yearly","executor":{"type":"noop"}}`); a.status != http.StatusOK {
		t.Fatalf("put: %s", a)
	}
	rec := httptest.NewRecorder()
	n.srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/v1/tasks:export?prefix=x/", nil))
	if rec.Code != http.StatusOK || !rec.Flushed {
		t.Errorf("export: status %d, flushed %v; want 200, flushed at its first task", rec.Code, rec.Flushed)
	}
}

// TestServer_RefusesConditionsItDoesNotCheck: a write with a condition
// its route does not check is refused and changes nothing. If-Match
// binds a PUT and a DELETE of a task only; If-None-Match: * (create only)
// and If-Unmodified-Since bind none. They were ignored: the PUT of a
// "create only" replaced the task, and a pause "if at version 1" paused
// a task at another.
func TestServer_RefusesConditionsItDoesNotCheck(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"})
	const def = `{"schedule":"@yearly","executor":{"type":"noop"}}`
	if a := call(t, n.ts, "PUT", "/v1/tasks/c1", def); a.status != http.StatusOK {
		t.Fatalf("put: %s", a)
	}
	stored, err := n.c.GetTask(t.Context(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, body, header, value, want string }{
		{"PUT", "/v1/tasks/c1", `{"schedule":"@daily","executor":{"type":"noop"}}`, "If-None-Match", "*",
			"If-None-Match: PUT /v1/tasks/{id} does not check it"},
		{"DELETE", "/v1/tasks/c1", "", "If-Unmodified-Since", "Sat, 01 Jan 2000 00:00:00 GMT",
			"If-Unmodified-Since: DELETE /v1/tasks/{id} does not check it"},
		{"POST", "/v1/tasks/c1/pause", "", "If-Match", `"1"`,
			"If-Match: POST /v1/tasks/{id}/pause does not check it (only PUT and DELETE /v1/tasks/{id} do)"},
		{"POST", "/v1/tasks:delete", `{"prefix":"c"}`, "If-Match", `"1"`, "If-Match: POST /v1/tasks:delete does not check it"},
	} {
		a := call(t, n.ts, tc.method, tc.path, tc.body, tc.header, tc.value)
		wantError(t, a, http.StatusBadRequest, tc.want, "nothing was done")
	}
	got, err := n.c.GetTask(t.Context(), "c1")
	if err != nil {
		t.Fatalf("the task is gone: %v", err)
	}
	if got.Version != stored.Version || got.Paused || got.Schedule != "@yearly" {
		t.Fatalf("refused requests changed the task: %+v, was %+v", got, stored)
	}
	// Reads may carry a cache's conditions: they are answered in full.
	if a := call(t, n.ts, "GET", "/v1/tasks/c1", "", "If-None-Match", `"1"`); a.status != http.StatusOK {
		t.Fatalf("GET with If-None-Match: %s", a)
	}
}
