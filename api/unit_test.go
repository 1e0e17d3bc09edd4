package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/lograte"
	"github.com/shardcron/shardcron/membership"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

func TestMergeHistory(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := func(sec, attempt int, node string) task.Execution {
		at := t0.Add(time.Duration(sec) * time.Second)
		return task.Execution{TaskID: "t", ScheduledAt: at, StartedAt: at, FinishedAt: at, Attempt: attempt, Node: node, Status: "ok"}
	}
	// The same instant in another location is the same record.
	inBerlin := rec(2, 1, "a")
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	inBerlin.ScheduledAt = inBerlin.ScheduledAt.In(berlin)

	for _, tc := range []struct {
		name  string
		lists [][]task.Execution
		limit int
		want  []task.Execution
	}{
		{"empty", nil, 10, nil},
		{"one list kept", [][]task.Execution{{rec(3, 1, "a"), rec(2, 1, "a")}}, 10, []task.Execution{rec(3, 1, "a"), rec(2, 1, "a")}},
		{"interleaved", [][]task.Execution{{rec(5, 1, "a"), rec(1, 1, "a")}, {rec(4, 1, "b"), rec(2, 1, "b")}}, 10,
			[]task.Execution{rec(5, 1, "a"), rec(4, 1, "b"), rec(2, 1, "b"), rec(1, 1, "a")}},
		{"attempt desc within a time", [][]task.Execution{{rec(2, 1, "a")}, {rec(2, 3, "b"), rec(2, 2, "a")}}, 10,
			[]task.Execution{rec(2, 3, "b"), rec(2, 2, "a"), rec(2, 1, "a")}},
		{"identical once", [][]task.Execution{{rec(2, 1, "a"), rec(1, 1, "a")}, {rec(2, 1, "a")}, {inBerlin}}, 10,
			[]task.Execution{rec(2, 1, "a"), rec(1, 1, "a")}},
		{"same fire on two nodes kept", [][]task.Execution{{rec(2, 1, "a")}, {rec(2, 1, "b")}}, 10,
			[]task.Execution{rec(2, 1, "a"), rec(2, 1, "b")}},
		{"limit", [][]task.Execution{{rec(3, 1, "a"), rec(1, 1, "a")}, {rec(2, 1, "b")}}, 2,
			[]task.Execution{rec(3, 1, "a"), rec(2, 1, "b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeHistory(tc.lists, tc.limit)
			if !equalExecutions(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestRateSampler(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	var r rateSampler
	if got := r.rate(t0, 100); got != 0 {
		t.Fatalf("rate without samples: %v", got)
	}
	r.add(at(0), 0)
	if got := r.rate(at(2), 200); got != 100 {
		t.Fatalf("rate after 2 s: %v, want 100", got)
	}
	// Samples every second at 50/s for 30 s: the rate covers about the
	// last 10 s only, so an earlier burst no longer counts.
	fires := uint64(1_000_000) // a burst at 0.5 s
	for s := 1; s <= 30; s++ {
		r.add(at(float64(s)), fires+uint64(50*s))
	}
	if got := r.rate(at(30.5), fires+50*30+25); got != 50 {
		t.Fatalf("steady rate: %v, want 50", got)
	}
	// A counter that went back (an engine restarted in place) is not a
	// negative rate.
	r.add(at(31), 3)
	if got := r.rate(at(31.2), 3); got != 0 {
		t.Fatalf("rate of a counter that went back: %v", got)
	}
	// All samples too old: no rate.
	if got := r.rate(at(100), fires); got != 0 {
		t.Fatalf("rate from stale samples: %v", got)
	}
}

// Fires come in a burst at the start of each second; samples at another
// point of it. The rate is the bursts' size whenever it is asked: a window
// ending at the question held one burst more at some points of the second.
func TestRateSampler_BurstsAtEachSecond(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	fired := func(s float64) uint64 { return 525 * uint64(s+1) } // bursts at 0, 1, 2 ...
	var r rateSampler
	for s := 0.4; s < 20; s++ {
		r.add(at(s), fired(s))
	}
	for _, q := range []float64{19.45, 19.7, 20.05, 20.35} {
		if got := r.rate(at(q), fired(q)); got != 525 {
			t.Errorf("rate at %.2f s: %v, want 525", q, got)
		}
	}
}

func TestParseIfMatch(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", 0, true}, {"123", 123, true}, {`"123"`, 123, true}, {` "7" `, 7, true},
		{"0", 0, false}, {"-1", 0, false}, {"abc", 0, false}, {`"12`, 0, false}, {`W/"12"`, 0, false},
		{"*", 0, false}, {"99999999999999999999", 0, false},
	} {
		got, err := parseIfMatch(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseIfMatch(%q) = %d, %v", tc.in, got, err)
		}
	}
}

func TestSplitBatch(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		max        int
		want       []string // item bodies
		lines      []int
		err        string
	}{
		{"empty", "", 3, nil, nil, ""},
		{"blank lines", "\n \r\n", 3, nil, nil, ""},
		{"empty array", " [ ] ", 3, nil, nil, ""},
		{"array", `[{"a":1}, {"b":2}]`, 3, []string{`{"a":1}`, `{"b":2}`}, []int{0, 0}, ""},
		{"array of non-objects", `[1, null, "x"]`, 3, []string{`1`, `null`, `"x"`}, []int{0, 0, 0}, ""},
		{"array at max", `[1,2,3]`, 3, []string{`1`, `2`, `3`}, []int{0, 0, 0}, ""},
		{"array over max", `[1,2,3,4]`, 3, nil, nil, "at most 3"},
		{"truncated array", `[{"a":1}, {"b"`, 3, nil, nil, "malformed JSON array"},
		{"unclosed array", `[{"a":1}`, 3, nil, nil, "malformed JSON array"},
		{"trailing data", `[1] [2]`, 3, nil, nil, "after its closing"},
		{"lines", "{\"a\":1}\n\n{\"b\":2}\r\n{oops\n", 3, []string{`{"a":1}`, `{"b":2}`, `{oops`}, []int{1, 3, 4}, ""},
		{"lines over max", "1\n2\n\n3\n4", 3, nil, nil, "at most 3"},
		{"no final newline", `{"a":1}`, 3, []string{`{"a":1}`}, []int{1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, err := splitBatch([]byte(tc.body), tc.max)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(items) != len(tc.want) {
				t.Fatalf("%d items, want %d", len(items), len(tc.want))
			}
			for i, it := range items {
				if string(it.raw) != tc.want[i] || it.line != tc.lines[i] {
					t.Fatalf("item %d: %q line %d, want %q line %d", i, it.raw, it.line, tc.want[i], tc.lines[i])
				}
			}
		})
	}
}

// TestEscapeID checks that every id reaches a ServeMux {id} wildcard
// unchanged, without redirects, as the Server routes it.
func TestEscapeID(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/tasks/{id}/history", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, pathID(r))
	})
	for _, id := range []string{"plain", "billing/invoice-42", "with space", "/", "//", "a//b", ".", "..", "../x",
		"x/..", "./x", "/x", "x/", "%", "%2F", "%zz", "?", "#", "a?b=c#d", "ü", "日本", "+", ";", "@", "tab\tno"} {
		req := httptest.NewRequest("GET", "/v1/tasks/"+client.EscapeID(id)+"/history", nil)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, withSlashID(req))
		if w.Code != http.StatusOK || w.Body.String() != id {
			t.Errorf("id %q escaped as %q: %d %q", id, client.EscapeID(id), w.Code, w.Body.String())
		}
	}
}

func TestWithPathID(t *testing.T) {
	for _, tc := range []struct {
		name, body, id string
		want           string // "" = body unchanged
		err            bool
	}{
		{"added", `{"schedule":"@daily"}`, "a/b", `{"id":"a/b","schedule":"@daily"}`, false},
		{"not HTML-escaped", `{"schedule":"@daily","labels":{"a":"<&>"}}`, "x", `{"id":"x","labels":{"a":"<&>"},"schedule":"@daily"}`, false},
		{"null replaced", `{"id":null,"schedule":"@daily"}`, "a", `{"id":"a","schedule":"@daily"}`, false},
		{"equal kept", `{"id":"a", "schedule":"@daily"}`, "a", "", false},
		{"different refused", `{"id":"b"}`, "a", "", true},
		{"not a string left for DecodeTask", `{"id":5}`, "a", "", false},
		{"malformed left for DecodeTask", `{"id":`, "a", "", false},
		{"invalid UTF-8 left for DecodeTask", "{\"x\":\"\xff\"}", "a", "", false},
		{"array left for DecodeTask", `[]`, "a", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := withPathID([]byte(tc.body), tc.id)
			if tc.err {
				var ve *task.ValidationError
				if !errors.As(err, &ve) || ve.Field != "id" {
					t.Fatalf("err %v, want a ValidationError of id", err)
				}
				return
			}
			want := tc.want
			if want == "" {
				want = tc.body
			}
			if err != nil || string(got) != want {
				t.Fatalf("got %s, %v; want %s", got, err, want)
			}
		})
	}
}

func TestBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:8080":           "http://127.0.0.1:8080",
		"http://127.0.0.5:8080/":   "http://127.0.0.5:8080",
		"https://node.example:443": "https://node.example:443",
	} {
		if got := baseURL(in); got != want {
			t.Errorf("baseURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestConfig_Validate(t *testing.T) {
	if _, err := New(Config{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("New without an engine: %v", err)
	}
	// A client that never connects: the engine is built, not started.
	cli := clientv3.NewCtxClient(context.Background())
	defer cli.Close()
	e, err := engine.New(engine.DefaultConfig("n"), cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Engine: e}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "started") {
		t.Fatalf("New with an engine not started: %v", err)
	}
	if err := (Config{Engine: e, MaxBatchBytes: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "MaxBatchBytes") {
		t.Fatalf("negative MaxBatchBytes: %v", err)
	}
}

// TestSeries_Points: the series turns counter samples into per-interval
// rates and a p99 of the interval's lags alone, not of all time.
func TestSeries_Points(t *testing.T) {
	var s series
	bounds := []float64{0.001, 0.01, 0.1}
	at := time.Unix(1000, 0)
	stats := func(fires uint64, counts ...uint64) engine.Stats {
		return engine.Stats{Fires: fires, QueueCapacity: 10, QueueDepth: 5,
			FireLag: engine.Histogram{Bounds: bounds, Counts: counts, Count: counts[len(counts)-1]}}
	}
	s.add(at, stats(0, 0, 0, 0))
	s.add(at.Add(time.Second), stats(100, 0, 0, 100))       // 100 slow fires: p99 in (0.01, 0.1]
	s.add(at.Add(2*time.Second), stats(300, 200, 200, 300)) // then 200 fast ones: p99 within 1 ms
	pts := s.points()
	if len(pts) != 2 || pts[0].FireRate != 100 || pts[1].FireRate != 200 || pts[1].QueueFill != 0.5 {
		t.Fatalf("points %+v", pts)
	}
	if pts[0].P99LagMS <= 10 || pts[0].P99LagMS > 100 || pts[1].P99LagMS > 1 {
		t.Fatalf("p99 %v ms then %v ms, want in (10, 100] then at most 1", pts[0].P99LagMS, pts[1].P99LagMS)
	}
}

// A small request body is decoded strictly, and its errors name the field
// in the JSON's terms.
func TestDecodeObject(t *testing.T) {
	for _, tc := range []struct {
		body string
		dst  any
		want string // "" for no error
	}{
		{`{"prefix": "a/", "labels": {"team": "x"}, "dry_run": true}`, &task.Selector{}, ""},
		{`{"prefix": "a/", "dry_run": true, "dry_run": false}`, &task.Selector{}, "dry_run: given twice"},
		{`{"prefx": "a/"}`, &task.Selector{}, "prefx: unknown field"},
		{`{"labels": {"team": 7}}`, &task.Selector{}, "labels.team: want a string, got a number"},
		{`{"all": "yes"}`, &task.Selector{}, "all: want true or false, got a string"},
		{`["a"]`, &task.Selector{}, "the body: want an object, got an array"},
		{` null `, &task.Selector{}, "the body: want an object, got null"},
		{`null`, &task.Override{}, "the body: want an object, got null"},
		{`{} {}`, &task.Selector{}, "malformed JSON at byte"},
		{`{"body": 5}`, &task.Override{}, "body: want a string, got a number"},
		{`{"payload": {"n": 1}}`, &task.Override{}, ""},
		// null in a string's place inside the body's fields is no string:
		// decoded as "", a selector with {"team": null} chose the tasks
		// whose team label is empty. A field of the body itself given as
		// null is left out, as in a task.
		{`{"labels": {"team": null}}`, &task.Selector{}, "labels.team: want a string, got null"},
		{`{"ids": ["a", null]}`, &client.StatesRequest{}, "ids.1: want a string, got null"},
		{`{"note": null}`, &struct {
			Note string `json:"note"`
		}{}, ""},
		{`{"payload": {"n": null}}`, &task.Override{}, ""},
		{`{"from": "yesterday", "to": "2026-01-02T00:00:00Z"}`, &client.BackfillRequest{}, "from: want an RFC 3339 time such as 2026-01-02T15:04:05Z"},
		{`{"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "concurrency": 1.5}`, &client.BackfillRequest{}, "concurrency: want a whole number"},
		{`{"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "concurrency": 99999999999999999999}`, &client.BackfillRequest{}, "concurrency: 99999999999999999999 is out of range"},
	} {
		err := decodeObject([]byte(tc.body), tc.dst)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.body, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.body, err, tc.want)
		}
	}
	var o task.Override
	if err := decodeObject([]byte(`{"payload": {"n": 1}}`), &o); err != nil || string(o.Payload) != `{"n": 1}` {
		t.Errorf("payload %s, %v: want the raw JSON", o.Payload, err)
	}
}

// A small body the request does not take is answered with the fields it
// does take: a trigger's {"bdy": "x"} said only "bdy: unknown field", a
// resume's {"note": "x"} only "note: unknown field".
func TestReadSmallJSON_SaysWhatTheRequestTakes(t *testing.T) {
	for _, tc := range []struct {
		body string
		dst  any
		want string
	}{
		{`{"bdy": "x"}`, &task.Override{}, `bdy: unknown field (this request takes {"body", "payload"})`},
		{`{"note": "x"}`, &struct{}{}, `note: unknown field (this request takes no body, or {})`},
		{`{"from": 1}`, &client.BackfillRequest{}, `from: want an RFC 3339 time such as 2026-01-02T15:04:05Z (this request takes {"from", "to", "concurrency"})`},
		{`{"note": "x"`, &pauseRequest{}, `(this request takes {"note"})`},
	} {
		w := httptest.NewRecorder()
		if readSmallJSON(w, httptest.NewRequest("POST", "/v1/tasks/t/trigger", strings.NewReader(tc.body)), tc.dst) ||
			w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), strings.ReplaceAll(tc.want, `"`, `\"`)) {
			t.Errorf("%s: %d %s, want 400 with %s", tc.body, w.Code, w.Body, tc.want)
		}
	}
}

// Server.fail answers each kind of error with its status: a write that
// lost to other writers as often as it tried is a 409 (retry), not a 500.
func TestServer_FailStatuses(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("pause task %q: %w, try again", "t", registry.ErrContention), http.StatusConflict},
		{fmt.Errorf("get: %w", registry.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("put: %w", registry.ErrVersionMismatch), http.StatusPreconditionFailed},
		{&task.ValidationError{Field: "schedule", Reason: "bad"}, http.StatusBadRequest},
		{errors.New("etcd exploded"), http.StatusInternalServerError},
	} {
		w := httptest.NewRecorder()
		s.fail(w, httptest.NewRequest(http.MethodPost, "/v1/tasks/t/pause", nil), "t", tc.err)
		if w.Code != tc.want {
			t.Errorf("fail(%v) = %d, want %d", tc.err, w.Code, tc.want)
		}
	}
}

// A node that does not answer is warned of once a peerWarnEvery, each
// node on its own; the repeats go to debug (the dashboard asks every 3 s).
func TestWarnPeer_OnceAMinuteANode(t *testing.T) {
	var buf strings.Builder
	s := &Server{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		peerWarns: lograte.Limiter{Every: peerWarnEvery}}
	for range 3 {
		s.warnPeer("n2", "api: a node did not answer", "err", "refused")
	}
	s.warnPeer("n3", "api: a node did not answer", "err", "refused")
	out := buf.String()
	if w, d := strings.Count(out, "level=WARN"), strings.Count(out, "level=DEBUG"); w != 2 || d != 2 {
		t.Errorf("%d warnings and %d debug lines, want 2 (n2's first, n3's) and 2:\n%s", w, d, out)
	}
	if !strings.Contains(out, "node=n3") {
		t.Errorf("the lines do not name the node:\n%s", out)
	}
}

// A node whose record says it is leaving shows as leaving in /v1/nodes:
// its API stops answering first, and it read as "no answer" only.
func TestFillMember_Leaving(t *testing.T) {
	at := time.Date(2026, 12, 5, 16, 0, 0, 0, time.UTC)
	var n client.Node
	fillMember(&n, membership.Member{ID: "n2", Info: membership.NodeInfo{ID: "n2", APIAddr: "127.0.0.1:8081", StartedAt: at, Version: "v1", Leaving: true}})
	if want := (client.Node{APIAddr: "127.0.0.1:8081", StartedAt: at, Version: "v1", Leaving: true}); !reflect.DeepEqual(n, want) {
		t.Errorf("fillMember: %+v, want %+v", n, want)
	}
}

// TestReadBodyOr_RefusesAContentEncoding: a compressed body is refused
// with a 400 that says why. It was read as it came: a gzipped task was
// "task JSON is not valid UTF-8", and a gzipped batch a 200 with an error
// for each "line" of the compressed bytes.
func TestReadBodyOr_RefusesAContentEncoding(t *testing.T) {
	for _, tc := range []struct {
		encoding string
		status   int
	}{
		{"", http.StatusOK},
		{"identity", http.StatusOK},
		{"gzip", http.StatusBadRequest},
		{"br", http.StatusBadRequest},
	} {
		r := httptest.NewRequest("PUT", "/v1/tasks/a", strings.NewReader(`{}`))
		if tc.encoding != "" {
			r.Header.Set("Content-Encoding", tc.encoding)
		}
		w := httptest.NewRecorder()
		if _, ok := readBodyOr(w, r, 1024, "too big"); ok {
			w.WriteHeader(http.StatusOK)
		}
		if w.Code != tc.status {
			t.Errorf("Content-Encoding %q: status %d, want %d: %s", tc.encoding, w.Code, tc.status, w.Body)
		}
		if want := `Content-Encoding \"` + tc.encoding + `\" is not supported: send the body uncompressed`; tc.status != http.StatusOK && !strings.Contains(w.Body.String(), want) {
			t.Errorf("Content-Encoding %q: %s, want %q", tc.encoding, w.Body, want)
		}
	}
}

// A body that begins with a UTF-8 byte order mark (what editors and
// PowerShell on Windows write) is read without it, as JSON allows and the
// command line's files are: it was "invalid character 'ï'".
func TestReadBody_DropsAUTF8ByteOrderMark(t *testing.T) {
	r := httptest.NewRequest("PUT", "/v1/tasks/a", strings.NewReader("\xef\xbb\xbf{\"id\": \"a\"}"))
	body, err := readBody(r, 1024)
	if err != nil || string(body) != `{"id": "a"}` {
		t.Errorf("readBody = %q, %v; want the JSON without its byte order mark", body, err)
	}
}
