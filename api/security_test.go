package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

// TestServer_Browsers: what a web page the node's operator visits can make
// their browser send to a node. Without --auth-token nothing but the
// browser's own rules stood between any site and the API: a cross-site
// POST of text/plain is a "simple" request, sent without a preflight, and
// the API read its body as JSON whatever its Content-Type, so a page could
// create tasks (exec tasks on a node with --allow-exec: its commands run)
// or delete every one. And a page whose name the attacker re-points at
// 127.0.0.1 (DNS rebinding) reads and writes as the same origin.
func TestServer_Browsers(t *testing.T) {
	c := etcdtest.Start(t)
	n := startNode(t, c, nodeOptions{id: "node-1"}) // no token, on 127.0.0.1
	ts := n.ts

	t.Run("CrossSiteWritesRefused", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			hdr  []string
		}{
			{"a cross-site page", []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
			{"another port of this host", []string{"Origin", "http://127.0.0.1:1", "Sec-Fetch-Site", "same-site"}},
			{"a browser without Sec-Fetch-Site", []string{"Origin", "https://evil.example"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				hdr := append([]string{"Content-Type", "text/plain"}, tc.hdr...)
				wantError(t, call(t, ts, "POST", "/v1/tasks:batch", noopJSON("csrf-1")+"\n", hdr...),
					http.StatusForbidden, "cross-origin")
				wantError(t, call(t, ts, "PUT", "/v1/tasks/csrf-2", noopJSON(""), hdr...), http.StatusForbidden, "cross-origin")
				wantError(t, call(t, ts, "POST", "/v1/tasks:delete", `{"all": true}`, hdr...), http.StatusForbidden, "cross-origin")
				for _, id := range []string{"csrf-1", "csrf-2"} {
					wantError(t, call(t, ts, "GET", "/v1/tasks/"+id, ""), http.StatusNotFound)
				}
			})
		}
	})

	t.Run("SameOriginAndCommandLineWrite", func(t *testing.T) {
		// The dashboard's own requests, and those of programs (no Origin).
		for i, hdr := range [][]string{
			{"Origin", ts.URL, "Sec-Fetch-Site", "same-origin"},
			{"Origin", ts.URL},
			nil,
		} {
			id := "same-" + string(rune('a'+i))
			if a := call(t, ts, "PUT", "/v1/tasks/"+id, noopJSON(""), hdr...); a.status != http.StatusOK {
				t.Fatalf("PUT with %q: %v", hdr, a)
			}
		}
		// Reads are not refused: a cross-site page cannot read the answer.
		if a := call(t, ts, "GET", "/v1/tasks/same-a", "", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"); a.status != http.StatusOK {
			t.Fatalf("cross-site GET: %v", a)
		}
	})

	t.Run("RebindingRefusedWithoutToken", func(t *testing.T) {
		port := ts.URL[strings.LastIndexByte(ts.URL, ':'):]
		for _, host := range []string{"evil.example" + port, "EVIL.example.", "rebind.127.0.0.1.nip.io" + port} {
			for _, rt := range []struct{ method, path, body string }{
				{"GET", "/v1/tasks", ""}, {"GET", "/v1/tasks/same-a", ""},
				{"PUT", "/v1/tasks/rebound", noopJSON("")}, {"GET", "/", ""},
			} {
				t.Run("Host "+host+" "+rt.method+" "+rt.path, func(t *testing.T) { // the failure names the Host and route
					wantError(t, call(t, ts, rt.method, rt.path, rt.body, "Host", host, "Sec-Fetch-Site", "same-origin"),
						http.StatusForbidden, "Host", "--auth-token")
				})
			}
		}
		wantError(t, call(t, ts, "GET", "/v1/tasks/rebound", ""), http.StatusNotFound)
		for _, host := range []string{"localhost" + port, "LocalHost", "node.localhost" + port, "127.0.0.1" + port, "[::1]" + port} {
			if a := call(t, ts, "GET", "/v1/tasks/same-a", "", "Host", host); a.status != http.StatusOK {
				t.Errorf("Host %s: %v", host, a)
			}
		}
		// With a token, a page that rebound a name has no token to send:
		// the name is served.
		_, tts := n.serve(t, Config{AuthToken: "s3cret"})
		if a := call(t, tts, "GET", "/v1/tasks/same-a", "", "Host", "shardcron.example", "Authorization", "Bearer s3cret"); a.status != http.StatusOK {
			t.Errorf("with the token, Host shardcron.example: %v", a)
		}
	})
}

// TestServer_EveryRouteNeedsTheToken: every route the server registers,
// as server.go lists them (so a route added later is checked too), answers
// 401 without the token or with a wrong one and 403 to the read token on a
// write, before its handler runs (none could here: the Server has no
// engine). Open are the dashboard page and, without ProbeAuth, the probes.
func TestServer_EveryRouteNeedsTheToken(t *testing.T) {
	for _, probeAuth := range []bool{false, true} {
		s := &Server{log: testLog, reqs: newRequestMetrics(),
			tokens: newTokens(Config{AuthToken: "full", ReadToken: "read"}), cfg: Config{ProbeAuth: probeAuth}}
		s.mux = s.routes()
		routes := routeHandlers(t)
		if len(routes) < 20 {
			t.Fatalf("found only %d routes in server.go", len(routes))
		}
		for pattern := range routes {
			if pattern == "GET /{$}" || probePatterns[pattern] && !probeAuth {
				continue
			}
			method, path, _ := strings.Cut(pattern, " ")
			path = strings.ReplaceAll(path, "{id}", "t1")
			for _, auth := range []string{"", "Bearer wrong", "Basic ZnVsbA==", "Bearer"} {
				r := httptest.NewRequest(method, path, strings.NewReader("{}"))
				if auth != "" {
					r.Header.Set("Authorization", auth)
				}
				rec := httptest.NewRecorder()
				s.serveHTTP(rec, r)
				if rec.Code != http.StatusUnauthorized {
					t.Errorf("%s (probe auth %v) with Authorization %q: %d %s, want 401", pattern, probeAuth, auth, rec.Code, rec.Body)
				}
			}
			if method != "GET" {
				r := httptest.NewRequest(method, path, strings.NewReader("{}"))
				r.Header.Set("Authorization", "Bearer read")
				rec := httptest.NewRecorder()
				s.serveHTTP(rec, r)
				if rec.Code != http.StatusForbidden {
					t.Errorf("%s with the read token: %d %s, want 403", pattern, rec.Code, rec.Body)
				}
			}
		}
	}
}
