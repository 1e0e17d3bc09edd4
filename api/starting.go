package api

import (
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Starting returns the handlers of a node that has not started yet, for
// its API and probe listeners (Handler and ProbeHandler later) from the
// moment they open: a node waits for its data directory, for etcd and,
// after a crash, for the lease of its previous session to expire (up to
// the lease TTL), and a probe that timed out all that while would have it
// restarted again. GET /healthz answers 200 (the process is alive), GET
// /readyz 503 with "starting: " and phase() as the reason, GET /metrics
// the Go and process metrics with shardcron_ready 0 and
// shardcron_build_info, and any other request 503 with Retry-After, in
// the API's JSON and behind cfg's tokens as the started node's answers
// are; under ProbeAuth an answer to a request without the token (outside
// /v1 and the probes) leaves the phase out. Only cfg's tokens and
// ProbeAuth are read: there is no engine yet.
func Starting(cfg Config, phase func() string) (api, probes http.Handler, err error) {
	tk := newTokens(cfg)
	reg, err := newMetrics(nil, cfg.Version, newRequestMetrics())
	if err != nil {
		return nil, nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: promLogger{log}, ErrorHandling: promhttp.ContinueOnError})
	api = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probe := isProbe(r)
		// Open as on the started node: the probes unless ProbeAuth, and
		// everything outside /v1 (the dashboard asks for its token itself).
		open := !underV1(r.URL.Path) && !(probe && cfg.ProbeAuth)
		if !open && !tk.authorized(w, r) {
			return
		}
		// Under ProbeAuth the phase is the probes' to tell, to a caller
		// with the token: not to one that only asked for an open path.
		reason := "starting"
		if !open || !cfg.ProbeAuth {
			reason += ": " + phase()
		}
		switch {
		case probe && r.URL.Path == "/healthz":
			writeJSON(w, http.StatusOK, readyResponse{Status: "starting", Reason: reason})
		case probe && r.URL.Path == "/metrics":
			metrics.ServeHTTP(w, r)
		case probe && r.URL.Path == "/readyz":
			writeJSON(w, http.StatusServiceUnavailable, readyResponse{Status: "not ready", Reason: reason, Error: "not ready: " + reason})
		default:
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "the node is %s; retry shortly", reason)
		}
	})
	return api, probesOnly(api), nil
}
