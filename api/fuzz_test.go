package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

// FuzzSplitBatch checks that cutting a batch body never panics, keeps at
// most max items, and cuts each format as its definition says: a JSON
// array into its elements (valid JSON, as many as json.Unmarshal finds),
// JSON Lines into its non-blank lines, in order, without their newline.
func FuzzSplitBatch(f *testing.F) {
	for _, s := range []string{
		"",
		"[]",
		` [ {"id":"a","schedule":"@daily","executor":{"type":"noop"}} , {"id":"b"} ] `,
		"{\"id\":\"a\"}\n\n{\"id\":\"b\"}\r\n  \n{\"id\":\"c\"}",
		"[1,2,3",
		"[1] [2]",
		"[\"\\u00e9\", null, {}, []]",
		"\xff\xfe{\"id\":\"x\"}\n",
		"#comment\n{}\n",
		"[{}]\n{\"id\":\"after\"}",
	} {
		f.Add([]byte(s), 2)
		f.Add([]byte(s), 1000)
	}
	f.Fuzz(func(t *testing.T, body []byte, max int) {
		if max < 1 || max > 1000 {
			max = 1 + (max%1000+1000)%1000
		}
		items, err := splitBatch(body, max)
		if err != nil {
			if items != nil {
				t.Fatalf("error %v with %d items", err, len(items))
			}
			return
		}
		if len(items) > max {
			t.Fatalf("%d items, max %d", len(items), max)
		}
		if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
			var all []json.RawMessage
			if err := json.Unmarshal(body, &all); err != nil {
				t.Fatalf("accepted an array json.Unmarshal refuses (%v)", err)
			}
			if len(all) != len(items) {
				t.Fatalf("%d array items, json.Unmarshal finds %d", len(items), len(all))
			}
			for i, it := range items {
				if !json.Valid(it.raw) {
					t.Fatalf("array item %d is not valid JSON: %q", i, it.raw)
				}
			}
			return
		}
		last := 0
		for _, it := range items {
			if it.line <= last || bytes.IndexByte(it.raw, '\n') >= 0 || len(bytes.TrimSpace(it.raw)) == 0 ||
				bytes.HasSuffix(it.raw, []byte{'\r'}) {
				t.Fatalf("line item %d %q after line %d", it.line, it.raw, last)
			}
			last = it.line
		}
		if want := nonBlankLines(body); want != len(items) {
			t.Fatalf("%d items, %d non-blank lines", len(items), want)
		}
	})
}

func nonBlankLines(body []byte) int {
	n := 0
	for _, l := range bytes.Split(body, []byte{'\n'}) {
		if len(bytes.TrimSpace(l)) > 0 {
			n++
		}
	}
	return n
}

// FuzzRequestTarget sends requests with arbitrary paths and query strings
// (as net/http's server parses them off the wire) to a node's API with a
// few tasks: no handler panics, and every /v1 answer that is an error is
// JSON with an "error" message.
func FuzzRequestTarget(f *testing.F) {
	for _, s := range []struct{ method, target string }{
		{"GET", "/v1/tasks?limit=10&cursor=a&prefix=fz"},
		{"GET", "/v1/tasks?label=team%3Dx&label=env=prod&limit=-1"},
		{"GET", "/v1/tasks?limit=99999999999999999999"},
		{"GET", "/v1/tasks:export?prefix=%ff"},
		{"GET", "/v1/tasks/fz-1"},
		{"GET", "/v1/tasks/%2F"},
		{"GET", "/v1/tasks/%2f/history?limit=3&status=failed"},
		{"GET", "/v1/tasks/fz-1/history?before=2026-01-01T00:00:00Z&limit=x"},
		{"GET", "/v1/tasks/fz-1/next?count=1000000"},
		{"GET", "/v1/tasks/fz-1/state"},
		{"GET", "/v1/series?scope=self&from=-1"},
		{"GET", "/v1/nodes/self"},
		{"GET", "/v1/partitions?x=%zz"},
		{"POST", "/v1/tasks/fz-2/trigger"},
		{"POST", "/v1/tasks/nope/pause?"},
		{"POST", "/v1/tasks:pause?prefix=fz-9&label=a=b"},
		{"POST", "/v1/tasks:batch"},
		{"DELETE", "/v1/tasks/nope%00x"},
		{"PUT", "/v1/tasks/fz-3?x=1"},
		{"GET", "/v1/../v1/tasks"},
		{"GET", "//v1//tasks"},
		{"GET", "/v1"},
		{"GET", "/metrics?name[]=1"},
		{"GET", "/readyz;x"},
		{"OPTIONS", "*"},
	} {
		f.Add(s.method, s.target)
	}
	c := etcdtest.Start(f)
	n := startNode(f, c, nodeOptions{id: "fuzz"})
	h := n.srv.Handler()
	for _, id := range []string{"fz-1", "fz-2", "/"} {
		body := `{"schedule": "@daily", "executor": {"type": "noop"}, "labels": {"team": "x"}}`
		req, _ := http.NewRequest(http.MethodPut, n.ts.URL+"/v1/tasks/"+strings.ReplaceAll(id, "/", "%2F"), strings.NewReader(body))
		resp, err := n.ts.Client().Do(req)
		if err != nil {
			f.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			f.Fatalf("seed task %q: %s", id, resp.Status)
		}
	}
	f.Fuzz(func(t *testing.T, method, target string) {
		switch method {
		case "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH":
		default:
			method = "GET"
		}
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")))
		if err != nil {
			return // the server answers 400 before any handler runs
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r = r.WithContext(ctx)
		r.RemoteAddr = "127.0.0.1:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		body := w.Body.String()
		if strings.Contains(body, "the request handler failed") {
			t.Fatalf("%s %q: a handler panicked: %s", method, target, body)
		}
		if underV1(r.URL.Path) && w.Code >= 400 && method != "HEAD" {
			var e struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == "" {
				t.Fatalf("%s %q: %d answer is not a JSON error: %q", method, target, w.Code, body)
			}
		}
	})
}
