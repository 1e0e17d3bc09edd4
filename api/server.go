package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"path"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardcron/shardcron/engine"
	"github.com/shardcron/shardcron/internal/lograte"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// Limits and defaults of the API.
const (
	// DefaultMaxBatchBytes is Config.MaxBatchBytes when left zero.
	DefaultMaxBatchBytes = 64 << 20
	// MaxBatchItems is the most tasks one POST /v1/tasks:batch may hold.
	MaxBatchItems = registry.MaxBatchItems
	// DefaultHistoryLimit and MaxHistoryLimit bound the records of one
	// GET /v1/tasks/{id}/history.
	DefaultHistoryLimit = 100
	MaxHistoryLimit     = 1000
	// DefaultListLimit and MaxListLimit are the default and largest limit
	// of GET /v1/tasks.
	DefaultListLimit = registry.DefaultListLimit
	MaxListLimit     = registry.MaxListLimit

	// peerTimeout bounds one request to another node: a node that does not
	// answer within it is left out of the answer.
	peerTimeout = 2 * time.Second
	// stateTimeout bounds asking the local dispatch loop for a task's state
	// (it may be busy with a burst of fires).
	stateTimeout = time.Second
)

// ErrConfig is wrapped by the errors New returns for an invalid Config.
var ErrConfig = errors.New("api: invalid config")

// Config configures a Server.
type Config struct {
	// Engine is the node's engine, already started (its Registry is in
	// use). Required.
	Engine *engine.Engine
	// AuthToken, when not empty, is required of every request under /v1 as
	// "Authorization: Bearer <token>"; others get 401. The node also sends
	// it with its requests to other nodes, so a cluster shares one token.
	// /healthz, /readyz and /metrics stay open (load balancers and
	// scrapers) unless ProbeAuth; the dashboard page always does, and asks
	// the user for the token.
	AuthToken string
	// ReadToken, when not empty, is a second token that may only read:
	// requests with it are served for GET and HEAD, and refused with 403
	// for every write. It needs AuthToken and must differ from it.
	ReadToken string
	// ProbeAuth puts /healthz, /readyz and /metrics behind the tokens too
	// (either one); by default they are open, for load balancers and
	// scrapers that hold no secret. It needs AuthToken.
	ProbeAuth bool
	// Version is the software version, reported by /v1/nodes/self and the
	// shardcron_build_info metric.
	Version string
	// Logger receives request logs (debug level), peers that did not
	// answer (warn) and handler panics (error). Default slog.Default().
	Logger *slog.Logger
	// Peer is the HTTP client for requests to other nodes (a task's state,
	// history, node counters). Default: a client of its own with a 1 s
	// connect timeout and a 2 s request timeout, whose idle connections
	// Close closes.
	Peer *http.Client
	// PeerTLS, when set, is the TLS configuration of the default Peer
	// client: the CA that other nodes' certificates are verified with and
	// this node's client certificate, for clusters that serve their API
	// over (mutual) TLS. Ignored when Peer is set. Default nil: Go's
	// defaults (the system's roots, no client certificate).
	PeerTLS *tls.Config
	// EtcdTimeout bounds a request about one task or a view of the
	// cluster (Server.bounded): etcd not answering within it is a 504, not
	// a request that hangs for as long as etcd is out of reach. Exports,
	// batches, bulk actions and backfills run as long as their work.
	// Default 10 s (DefaultEtcdTimeout).
	EtcdTimeout time.Duration
	// MaxBatchBytes bounds the body of POST /v1/tasks:batch; a bigger body
	// is refused with 413. Default 64 MiB (DefaultMaxBatchBytes): about
	// 10,000 tasks of 6 KiB. The body is held in memory while decoded.
	MaxBatchBytes int64
}

// Validate reports what is missing or out of range.
func (c Config) Validate() error {
	var errs []error
	if c.Engine == nil {
		errs = append(errs, fmt.Errorf("%w: Engine is required", ErrConfig))
	} else if c.Engine.Registry() == nil {
		errs = append(errs, fmt.Errorf("%w: Engine must be started before the API is created", ErrConfig))
	}
	if c.EtcdTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: EtcdTimeout must not be negative, got %v", ErrConfig, c.EtcdTimeout))
	}
	if c.MaxBatchBytes < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxBatchBytes must not be negative, got %d", ErrConfig, c.MaxBatchBytes))
	}
	if strings.ContainsAny(c.AuthToken, "\r\n") || strings.ContainsAny(c.ReadToken, "\r\n") {
		errs = append(errs, fmt.Errorf("%w: AuthToken and ReadToken must not contain line breaks", ErrConfig))
	}
	if c.ReadToken != "" && (c.AuthToken == "" || c.ReadToken == c.AuthToken) {
		errs = append(errs, fmt.Errorf("%w: ReadToken needs an AuthToken that differs from it", ErrConfig))
	}
	if c.ProbeAuth && c.AuthToken == "" {
		errs = append(errs, fmt.Errorf("%w: ProbeAuth needs AuthToken", ErrConfig))
	}
	return errors.Join(errs...)
}

// Server serves the API of one node. Its Handler is safe for concurrent
// use; Close stops its background sampling.
type Server struct {
	cfg     Config
	e       *engine.Engine
	reg     *registry.Registry
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *prometheus.Registry
	reqs    *requestMetrics
	peer    *http.Client
	ownPeer bool // peer was made here: Close closes its idle connections
	tokens  tokens

	rate      rateSampler
	series    series
	members   memberCache
	peerWarns lograte.Limiter // of peers that did not answer, by node id

	stop      chan struct{} // closed by Close: ends sampleLoop
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New returns a Server for cfg.Engine. It starts one goroutine that samples
// the engine's fire counter once a second (for fire rates); Close stops it.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if cfg.EtcdTimeout == 0 {
		cfg.EtcdTimeout = DefaultEtcdTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		cfg:       cfg,
		peerWarns: lograte.Limiter{Every: peerWarnEvery},
		e:         cfg.Engine,
		reg:       cfg.Engine.Registry(),
		log:       cfg.Logger,
		peer:      cfg.Peer,
		stop:      make(chan struct{}),
	}
	if s.peer == nil {
		s.peer, s.ownPeer = defaultPeerClient(cfg.PeerTLS), true
	}
	s.tokens = newTokens(cfg)
	s.reqs = newRequestMetrics()
	reg, err := newMetrics(s.e, cfg.Version, s.reqs)
	if err != nil {
		return nil, err
	}
	s.metrics = reg
	s.mux = s.routes()
	s.rate.add(time.Now(), s.e.Stats().Fires)
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.sampleLoop() }()
	return s, nil
}

func defaultPeerClient(tc *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if tc != nil {
		t.TLSClientConfig = tc.Clone()
	}
	t.DialContext = (&net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.MaxIdleConnsPerHost = 4
	t.IdleConnTimeout = 30 * time.Second
	t.ResponseHeaderTimeout = peerTimeout
	t.Proxy = nil // nodes talk to each other directly
	return &http.Client{Transport: t, Timeout: peerTimeout}
}

// Close stops the fire-rate sampling and closes idle connections to other
// nodes (when Config.Peer was left nil). The Handler keeps answering after
// Close, with fire rates frozen at the last sample. Close is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
		if s.ownPeer {
			s.peer.CloseIdleConnections()
		}
	})
	return nil
}

// sampleLoop records the fire counter once a second; it runs until Close.
func (s *Server) sampleLoop() {
	t := time.NewTicker(sampleInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			st := s.e.Stats()
			s.rate.add(now, st.Fires)
			s.series.add(now, st)
		}
	}
}

// Handler returns the HTTP handler of the whole API: /v1, /healthz,
// /readyz, /metrics and the dashboard at /.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// ProbeHandler returns a handler of the probes only: GET /healthz,
// /readyz and /metrics, answered as Handler answers them (behind the token
// when Config.ProbeAuth); anything else is a 404 that names the three. It
// is for a listener of its own (shardcron server --probe-listen), so that
// a load balancer, kubelet or container health check reaches the probes
// without the client certificate the API asks for under mutual TLS, and
// without reaching any task.
func (s *Server) ProbeHandler() http.Handler { return probesOnly(s.Handler()) }

// probesOnly passes the probes on to h; anything else is a 404 that names
// them.
func probesOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isProbe(r) {
			writeError(w, http.StatusNotFound, "no such endpoint: %s %s (this listener serves only GET /healthz, /readyz and /metrics)",
				r.Method, r.URL.EscapedPath())
			return
		}
		h.ServeHTTP(w, r)
	})
}

// isProbe says whether r asks for one of the probes (GET, which includes
// HEAD).
func isProbe(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && probePatterns["GET "+r.URL.Path]
}

// probePatterns are served without a token unless Config.ProbeAuth.
var probePatterns = map[string]bool{
	"GET /healthz": true,
	"GET /readyz":  true,
	"GET /metrics": true,
}

func (s *Server) routes() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("PUT /v1/tasks/{id}", s.bounded(s.putTask))
	m.HandleFunc("GET /v1/tasks/{id}", s.bounded(s.getTask))
	m.HandleFunc("DELETE /v1/tasks/{id}", s.bounded(s.deleteTask))
	m.HandleFunc("GET /v1/tasks", s.bounded(s.listTasks))
	m.HandleFunc("POST /v1/tasks:batch", s.putBatch)
	for _, a := range []task.BulkAction{task.BulkPause, task.BulkResume, task.BulkDelete, task.BulkTrigger} {
		m.HandleFunc("POST /v1/tasks:"+string(a), s.bulk(a))
	}
	m.HandleFunc("GET /v1/tasks:export", s.exportTasks)
	m.HandleFunc("GET /v1/tasks:status", s.bounded(s.localStatus))
	m.HandleFunc("POST /v1/tasks:states", s.bounded(s.localStates))
	m.HandleFunc("GET /v1/failures", s.bounded(s.failures))
	m.HandleFunc("POST /v1/tasks/{id}/pause", s.bounded(s.pauseTask))
	m.HandleFunc("POST /v1/tasks/{id}/resume", s.bounded(s.resumeTask))
	m.HandleFunc("POST /v1/tasks/{id}/trigger", s.bounded(s.triggerTask))
	m.HandleFunc("POST /v1/tasks/{id}/backfill", s.backfillTask)
	m.HandleFunc("POST /v1/tasks/{id}/backfill:cancel", s.bounded(s.cancelBackfill))
	m.HandleFunc("GET /v1/tasks/{id}/history", s.bounded(s.history))
	m.HandleFunc("GET /v1/tasks/{id}/state", s.bounded(s.taskStateHandler))
	m.HandleFunc("GET /v1/tasks/{id}/next", s.bounded(s.nextFires))
	m.HandleFunc("POST /v1/schedules:preview", s.previewSchedule)
	m.HandleFunc("GET /v1/series", s.bounded(s.seriesHandler))
	m.HandleFunc("GET /v1/nodes", s.bounded(s.nodes))
	m.HandleFunc("GET /v1/nodes/self", s.bounded(s.selfHandler))
	m.HandleFunc("GET /v1/partitions", s.bounded(s.partitions))
	m.HandleFunc("GET /healthz", s.healthz)
	m.HandleFunc("GET /readyz", s.readyz)
	m.Handle("GET /metrics", s.metricsHandler())
	m.HandleFunc("GET /{$}", s.dashboard)
	return m
}

// serveHTTP wraps the mux: panics become 500, requests under /v1 need the
// token, ServeMux's plain-text 404 and 405 become JSON, and every request
// is logged at debug level.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	var pattern string // the route, once known
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("api: handler panicked", "method", r.Method, "path", r.URL.EscapedPath(),
				"panic", v, "stack", string(debug.Stack()))
			if !sw.wroteHeader {
				writeError(sw, http.StatusInternalServerError, "internal error: the request handler failed (see the node's log)")
			}
		}
		s.reqs.observe(r.Method, pattern, sw.status(), time.Since(start))
		if s.log.Enabled(r.Context(), slog.LevelDebug) {
			s.log.Debug("http request", "method", r.Method, "path", r.URL.EscapedPath(), "status", sw.status(),
				"bytes", sw.bytes, "duration", time.Since(start), "remote", r.RemoteAddr)
		}
	}()

	req := withSlashID(r)
	_, pattern = s.mux.Handler(req)
	if why := browserRefusal(req, !s.tokens.auth); why != "" {
		writeError(sw, http.StatusForbidden, "%s", why)
		return
	}
	// The dashboard page holds no data: it asks the user for a token.
	open := pattern == "GET /{$}" || probePatterns[pattern] && !s.cfg.ProbeAuth || pattern == "" && !underV1(req.URL.Path)
	if !open && !s.tokens.authorized(sw, req) {
		return
	}
	if pattern == "" {
		s.noRoute(sw, req)
		return
	}
	if p := req.URL.EscapedPath(); req.Method != http.MethodConnect && cleanPath(p) != p {
		// ServeMux redirects it to the clean path with a 307, which a
		// client following redirects sends a write to again: to another
		// task (/v1/tasks/a/../b is b's).
		pattern = ""
		s.noRoute(sw, req)
		return
	}
	if err := checkQuery(pattern, req.URL.RawQuery); err != nil {
		writeError(sw, http.StatusBadRequest, "%v", err)
		return
	}
	if err := checkConditions(pattern, req.Header); err != nil {
		writeError(sw, http.StatusBadRequest, "%v", err)
		return
	}
	s.mux.ServeHTTP(sw, req)
}

// cleanPath is p as ServeMux cleans an escaped path before it routes it:
// no empty, "." or ".." segment, a trailing slash kept.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// ifMatchRoutes are the routes that check If-Match (a task's version).
var ifMatchRoutes = []string{"PUT /v1/tasks/{id}", "DELETE /v1/tasks/{id}"}

// checkConditions refuses a write under /v1 with a condition its route
// does not check: If-Match but on ifMatchRoutes, If-None-Match and
// If-Unmodified-Since on any. Ignored, they made a write its writer had
// bound to a condition (If-None-Match: * to create only) an unconditional
// one. Reads are not checked: a cache may add its conditions, and the
// answer in full is correct for them.
func checkConditions(pattern string, h http.Header) error {
	if !strings.Contains(pattern, " /v1/") || strings.HasPrefix(pattern, "GET ") {
		return nil
	}
	for _, name := range []string{"If-Match", "If-None-Match", "If-Unmodified-Since"} {
		if _, ok := h[name]; !ok || name == "If-Match" && slices.Contains(ifMatchRoutes, pattern) {
			continue
		}
		if name == "If-Match" {
			return fmt.Errorf("%s: %s does not check it (only PUT and DELETE /v1/tasks/{id} do); nothing was done", name, pattern)
		}
		return fmt.Errorf("%s: %s does not check it (a task's writes take If-Match: <version>); nothing was done", name, pattern)
	}
	return nil
}

// DefaultEtcdTimeout is Config.EtcdTimeout's default.
const DefaultEtcdTimeout = 10 * time.Second

// bounded gives h's request a deadline of Config.EtcdTimeout, for the
// routes that read or write a few etcd keys (a task, its history, a page of
// 10 000 at most) or ask the other nodes, which answer within 2 s: etcd out
// of reach is then a 504, not a request that hangs.
func (s *Server) bounded(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.EtcdTimeout)
		defer cancel()
		h(w, r.WithContext(ctx))
	}
}

// queryParams are the query parameters each route under /v1 reads; the
// others read none. Any other parameter is refused, so that a typo
// (?dryrun=1 for ?dry_run=1) is an error, not a request that does what
// it was not asked. Each is read once: only label may repeat
// (repeatedParams).
var queryParams = map[string][]string{
	"PUT /v1/tasks/{id}":         {"dry_run", "allow_missing_targets"},
	"GET /v1/tasks":              {"prefix", "label", "limit", "cursor", "status", "state"},
	"GET /v1/tasks:export":       {"prefix", "label"},
	"GET /v1/tasks:status":       {"status", "prefix", "after", "limit"},
	"GET /v1/failures":           {"limit", "local"},
	"GET /v1/tasks/{id}/history": {"limit", "local"},
	"GET /v1/tasks/{id}/next":    {"count"},
	"GET /v1/series":             {"scope"},
}

// repeatedParams are the query parameters that may be given more than
// once: several labels must all match.
var repeatedParams = []string{"label"}

// checkQuery refuses a query that does not parse, a query parameter that
// the route of pattern does not read, and one given twice that is read
// once (?limit=1&limit=2 would act as one of them, unseen by its writer).
// Routes outside /v1 (the probes, /metrics, the dashboard) are not
// checked.
func checkQuery(pattern, rawQuery string) error {
	if rawQuery == "" || !strings.Contains(pattern, " /v1/") {
		return nil
	}
	// url.URL.Query drops the pairs it cannot parse, so ?dry_run=1% would
	// write and ?prefix=a%zz would choose every task.
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return fmt.Errorf("malformed query: %v (a value's %%, & and ; are written %%25, %%26 and %%3B); nothing was done", err)
	}
	known := queryParams[pattern]
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if slices.Contains(known, name) {
			if vs := q[name]; len(vs) > 1 && !slices.Contains(repeatedParams, name) {
				return fmt.Errorf("%s: given %d times in the query, %q: which one was meant?", name, len(vs), vs)
			}
			continue
		}
		if len(known) == 0 {
			return fmt.Errorf("unknown query parameter %q: %s takes none", name, pattern)
		}
		return fmt.Errorf("unknown query parameter %q: %s takes %s", name, pattern, strings.Join(known, ", "))
	}
	return nil
}

// slashIDKey marks a request whose task id is "/" (see withSlashID).
type slashIDKey struct{}

// withSlashID works around ServeMux taking a path segment that unescapes
// to "/" (the task id "/", sent as %2F) for a trailing slash, which no {id}
// wildcard matches. It stands in NUL for that segment, which no task id
// contains, and marks the request so that pathID maps it back.
func withSlashID(r *http.Request) *http.Request {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/v1/tasks/")
	if !ok {
		return r
	}
	seg, tail, _ := strings.Cut(rest, "/")
	if !strings.EqualFold(seg, "%2F") {
		return r
	}
	u := *r.URL
	u.RawPath = "/v1/tasks/%00"
	if tail != "" || strings.HasSuffix(rest, "/") {
		u.RawPath += "/" + tail
	}
	p, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return r
	}
	u.Path = p
	r = r.WithContext(context.WithValue(r.Context(), slashIDKey{}, true))
	r.URL = &u
	return r
}

// pathID returns the task id of the path.
func pathID(r *http.Request) string {
	id := r.PathValue("id")
	if id == "\x00" && r.Context().Value(slashIDKey{}) != nil {
		return "/"
	}
	return id
}

func underV1(path string) bool { return path == "/v1" || strings.HasPrefix(path, "/v1/") }

// tokens checks the bearer token of a request against the node's auth
// and read tokens (Config.AuthToken and ReadToken).
type tokens struct {
	auth, read       bool
	authSum, readSum [32]byte // sha256 of each, compared in constant time
}

func newTokens(cfg Config) tokens {
	return tokens{auth: cfg.AuthToken != "", read: cfg.ReadToken != "",
		authSum: sha256.Sum256([]byte(cfg.AuthToken)), readSum: sha256.Sum256([]byte(cfg.ReadToken))}
}

// authorized checks the bearer token, answering 401 when it is missing or
// wrong, and 403 when it is the read-only token on a write. Both sides are
// hashed first so that the comparison takes the same time whatever the
// length of the token sent. No answer or log quotes a token.
func (tk *tokens) authorized(w http.ResponseWriter, r *http.Request) bool {
	if !tk.auth {
		return true
	}
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		w.Header().Set("WWW-Authenticate", `Bearer realm="shardcron"`)
		writeError(w, http.StatusUnauthorized, "this node requires an auth token: send \"Authorization: Bearer <token>\" (shardcron --token or --token-file, or SHARDCRON_TOKEN)")
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	full := subtle.ConstantTimeCompare(got[:], tk.authSum[:]) == 1
	read := tk.read && subtle.ConstantTimeCompare(got[:], tk.readSum[:]) == 1
	switch {
	case full:
		return true
	case read && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		return true
	case read:
		writeError(w, http.StatusForbidden, "the read-only token cannot %s %s: writes need the auth token", r.Method, r.URL.EscapedPath())
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="shardcron", error="invalid_token"`)
	writeError(w, http.StatusUnauthorized, "the bearer token is not this node's auth token")
	return false
}

// noRoute answers a request no pattern matches: 405 with Allow when the
// path exists for other methods, else 404, both in JSON.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	// The mux's own answer says which (and sets Allow); capture it.
	h, _ := s.mux.Handler(r)
	c := &captureWriter{header: http.Header{}}
	h.ServeHTTP(c, r)
	if c.code == http.StatusMethodNotAllowed {
		allow := c.header.Get("Allow")
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, "method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.EscapedPath(), allow)
		return
	}
	msg := fmt.Sprintf("no such endpoint: %s %s (see the HTTP API in docs/api.md)", r.Method, r.URL.EscapedPath())
	if strings.HasPrefix(r.URL.Path, "/v1/tasks/") {
		msg += `; a task id containing "/" must be path-escaped in the URL, e.g. /v1/tasks/billing%2Finvoice-42 (and the ids "." and ".." as %2E and %2E%2E)`
	}
	writeError(w, http.StatusNotFound, "%s", msg)
}

// statusWriter records the status and size of an answer.
type statusWriter struct {
	http.ResponseWriter
	code        int
	bytes       int64
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.code, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) status() int {
	if !w.wroteHeader {
		return http.StatusOK
	}
	return w.code
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// captureWriter keeps the status and headers of the mux's error answers
// and drops their plain-text bodies.
type captureWriter struct {
	header http.Header
	code   int
}

func (c *captureWriter) Header() http.Header { return c.header }
func (c *captureWriter) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}
}
func (c *captureWriter) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return len(b), nil
}
