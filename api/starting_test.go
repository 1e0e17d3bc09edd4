package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The starting answers keep the started node's tokens: the probes open
// unless ProbeAuth, /v1 behind the token, a 503 only once that passed.
func TestStarting_AnswersBehindTheTokens(t *testing.T) {
	phase := func() string { return "waiting for etcd" }
	api, probes, err := Starting(Config{AuthToken: "full", ReadToken: "read", Version: "test-1"}, phase)
	if err != nil {
		t.Fatal(err)
	}
	ts, ps := httptest.NewServer(api), httptest.NewServer(probes)
	defer ts.Close()
	defer ps.Close()
	read := []string{"Authorization", "Bearer read"}

	for _, s := range []*httptest.Server{ts, ps} {
		if a := call(t, s, "GET", "/healthz", ""); a.status != http.StatusOK || !strings.Contains(string(a.body), "starting: waiting for etcd") {
			t.Errorf("/healthz: %v", a)
		}
		wantError(t, call(t, s, "GET", "/readyz", ""), http.StatusServiceUnavailable, "not ready: starting: waiting for etcd")
		// Scrapes see the node not ready, rather than fail.
		if a := call(t, s, "GET", "/metrics", ""); a.status != http.StatusOK || !strings.Contains(string(a.body), "shardcron_ready 0") ||
			!strings.Contains(string(a.body), `shardcron_build_info{goversion="`) || !strings.Contains(string(a.body), "process_cpu_seconds_total") {
			t.Errorf("/metrics while starting: %v", a)
		}
	}
	wantError(t, call(t, ts, "GET", "/v1/tasks", ""), http.StatusUnauthorized)
	wantError(t, call(t, ts, "PUT", "/v1/tasks/x", "{}", read...), http.StatusForbidden)
	a := call(t, ts, "GET", "/v1/tasks", "", read...)
	wantError(t, a, http.StatusServiceUnavailable, "the node is starting: waiting for etcd; retry shortly")
	if a.header.Get("Retry-After") == "" {
		t.Errorf("503 without Retry-After: %v", a.header)
	}
	wantError(t, call(t, ts, "GET", "/", ""), http.StatusServiceUnavailable)
	wantError(t, call(t, ps, "GET", "/v1/tasks", "", read...), http.StatusNotFound, "serves only")
	wantError(t, call(t, ps, "POST", "/healthz", ""), http.StatusNotFound, "serves only")

	api, _, _ = Starting(Config{AuthToken: "full", ProbeAuth: true}, phase)
	ts = httptest.NewServer(api)
	defer ts.Close()
	wantError(t, call(t, ts, "GET", "/healthz", ""), http.StatusUnauthorized)
	if a := call(t, ts, "GET", "/healthz", "", "Authorization", "Bearer full"); a.status != http.StatusOK {
		t.Errorf("/healthz with the token under ProbeAuth: %v", a)
	}
}

// Under ProbeAuth the probes' answers, the phase among them, need the
// token: no other open path tells a caller without it what the node waits
// for (the started node answers those with the dashboard page or a 404).
func TestStarting_ProbeAuthKeepsThePhase(t *testing.T) {
	api, _, _ := Starting(Config{AuthToken: "full", ProbeAuth: true}, func() string { return "waiting for etcd at etcd-0:2379" })
	ts := httptest.NewServer(api)
	defer ts.Close()
	for _, tc := range []struct{ method, path string }{{"GET", "/"}, {"GET", "/nope"}, {"POST", "/healthz"}, {"GET", "//v1/tasks"}} {
		a := call(t, ts, tc.method, tc.path, "")
		if strings.Contains(string(a.body), "etcd") {
			t.Errorf("%s %s without the token under ProbeAuth: %d %s", tc.method, tc.path, a.status, a.body)
		}
	}
	wantError(t, call(t, ts, "GET", "/", ""), http.StatusServiceUnavailable, "the node is starting; retry shortly")
	wantError(t, call(t, ts, "GET", "/v1/tasks", "", "Authorization", "Bearer full"), http.StatusServiceUnavailable, "waiting for etcd")
}
