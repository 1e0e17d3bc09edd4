package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy"
	"go.uber.org/zap"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

// An --etcd endpoint where an HTTP server other than etcd answers (a
// node's API port given for its embedded etcd's, say) is named as such;
// the node said only "context deadline exceeded", after --start-timeout.
// etcd itself passes, and so does an endpoint that refuses connections
// with its own finding.
func TestProbeEtcd_HTTPServerThatIsNotEtcd(t *testing.T) {
	notEtcd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"no such endpoint"}`, http.StatusNotFound)
	}))
	defer notEtcd.Close()
	err := probeEtcd(t.Context(), notEtcd.URL, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "an HTTP server answers there, not etcd (GET /version: 404 Not Found): check --etcd") {
		t.Errorf("an HTTP server that is not etcd: %v", err)
	}

	// An HTTP server that answers /version with etcd's fields is taken
	// for etcd: only its transport is probed.
	likeEtcd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"etcdserver":"3.6.0","etcdcluster":"3.6.0"}`)
	}))
	defer likeEtcd.Close()
	if err := probeEtcd(t.Context(), likeEtcd.URL, nil, nil); err != nil {
		t.Errorf("a server answering as etcd: %v", err)
	}

	c := etcdtest.Start(t)
	if err := probeEtcd(t.Context(), c.Endpoints[0], nil, nil); err != nil {
		t.Errorf("etcd at %s: %v", c.Endpoints[0], err)
	}

	err = probeEtcd(t.Context(), "http://"+etcdtest.RefusedAddr(t), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "is etcd running there?") || errors.Is(err, errServesTLS) {
		t.Errorf("a refused connection: %v", err)
	}
}

// An etcd with --host-whitelist refuses the probe's GET /version, whose
// Host (the endpoint's address) it does not list, with 421 and its own
// text, and serves the client's gRPC all the same: it is etcd. The probe
// said "an HTTP server answers there, not etcd (GET /version: 421
// Misdirected Request): check --etcd", an --etcd that was right.
func TestProbeEtcd_EtcdWithHostWhitelist(t *testing.T) {
	c := etcdtest.StartCluster(t, etcdtest.Options{HostWhitelist: []string{"etcd.example.com"}})
	if _, err := c.Client.Get(t.Context(), "k"); err != nil {
		t.Fatalf("gRPC to an etcd with a host whitelist: %v", err)
	}
	if err := probeEtcd(t.Context(), c.Endpoints[0], nil, nil); err != nil {
		t.Errorf("etcd with a host whitelist at %s: %v", c.Endpoints[0], err)
	}
}

// grpcProxyHTTP answers HTTP as the client port of an etcd grpc-proxy
// (etcd grpc-proxy start) does, plain or, withTLS, as one started with
// --cert-file and --key-file: etcdmain's mustHTTPServer
// (go.etcd.io/etcd/server/v3 v3.7.3, etcdmain/grpc_proxy.go) serves
// http.NotFound at "/", so no /version, and etcd's health handlers at
// /health and /proxy/health, which read etcd through c (there the proxy's
// own client and a client to itself) and answer 200, or 503 with the
// reason, and refuse any method but GET (etcdhttp.NewHealthHandler). Its
// /metrics and /proxy/metrics are left out: the probe does not ask them.
// With TLS the proxy offers h2 (transport.TLSInfo.ServerConfig), and its
// cmux hands HTTP/2 to its gRPC server, which answers a request that is
// not gRPC 415: only HTTP/1 reaches the handlers.
func grpcProxyHTTP(t *testing.T, c *clientv3.Client, withTLS bool) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/", http.NotFound)
	grpcproxy.HandleHealth(nil, mux, c)
	grpcproxy.HandleProxyHealth(nil, mux, c)
	if !withTLS {
		s := httptest.NewServer(mux)
		t.Cleanup(s.Close)
		return s
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			w.Header().Set("Content-Type", "application/grpc")
			w.WriteHeader(http.StatusUnsupportedMediaType)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	s.EnableHTTP2 = true
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

// An etcd grpc-proxy serves no /version (404) on its client port: the
// probe said "an HTTP server answers there, not etcd (GET /version: 404
// Not Found): check --etcd", of an --etcd that was right. One whose etcd
// answers passes; one whose etcd does not is named as the proxy, with
// what its /proxy/health says, or that it did not answer in the probe's
// time (its check of etcd waits a second for an etcd that is down).
func TestProbeEtcd_GRPCProxy(t *testing.T) {
	c := etcdtest.Start(t)
	up := grpcProxyHTTP(t, c.Client, false)
	if err := probeEtcd(t.Context(), up.URL, nil, nil); err != nil {
		t.Errorf("a grpc-proxy whose etcd answers: %v", err)
	}

	down, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + etcdtest.RefusedAddr(t)}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	proxy := grpcProxyHTTP(t, down, false)
	err = probeEtcd(t.Context(), proxy.URL, nil, nil)
	const want = "an etcd grpc-proxy answers there, but not the etcd it proxies to (GET /proxy/health: 503 Service Unavailable: " +
		`{"health":"false","reason":"GET ERROR:`
	if err == nil || !strings.Contains(err.Error(), want) || !strings.HasSuffix(err.Error(), "check the proxy's --endpoints") {
		t.Errorf("a grpc-proxy whose etcd is down: %v\nwant %q ... check the proxy's --endpoints", err, want)
	}
	if err := explainEtcd(t.Context(), []string{proxy.URL}, nil, "", nil, context.DeadlineExceeded); cannotHeal(err) {
		t.Errorf("a grpc-proxy whose etcd is down: %v, given up: etcd may come up", err)
	}

	// The probe's time ends while the proxy checks its etcd: the check
	// here ends the probe's context itself, and waits for the request's.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	mux := http.NewServeMux()
	mux.HandleFunc("/", http.NotFound)
	mux.Handle("/proxy/health", etcdhttp.NewHealthHandler(zap.NewNop(), func(rctx context.Context, _ etcdhttp.StringSet, _ bool) etcdhttp.Health {
		cancel()
		<-rctx.Done()
		return etcdhttp.Health{Health: "false"}
	}))
	slow := httptest.NewServer(mux)
	defer slow.Close()
	err = probeEtcd(ctx, slow.URL, nil, nil)
	const wantSlow = "an etcd grpc-proxy answers there, but not the etcd it proxies to (GET /proxy/health: no answer): check the proxy's --endpoints"
	if err == nil || err.Error() != wantSlow {
		t.Errorf("a grpc-proxy whose check of etcd outlasts the probe: %v\nwant %q", err, wantSlow)
	}
}

// An etcd grpc-proxy with TLS is recognised as a plain one is: the probe
// asked an https endpoint nothing past its TLS, found the transport
// working, and a proxy whose etcd is down was left unexplained (the node
// said only "context deadline exceeded", after --start-timeout). The
// probe's HTTP goes over TLS with the etcd TLS flags' configuration
// (etcd's CA from --etcd-cacert), and over HTTP/1, which the proxy's
// HTTP handlers serve. etcd with TLS and client certificates answers the
// probe as etcd, and an HTTPS server that is not etcd is named so.
func TestProbeEtcd_GRPCProxyOverTLS(t *testing.T) {
	c := etcdtest.Start(t)
	down, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + etcdtest.RefusedAddr(t)}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	up, proxy := grpcProxyHTTP(t, c.Client, true), grpcProxyHTTP(t, down, true)
	// One certificate for both: httptest's own.
	tlsCfg := caFileConfig(t, up.Certificate())

	if err := probeEtcd(t.Context(), up.URL, tlsCfg, nil); err != nil {
		t.Errorf("a grpc-proxy over TLS whose etcd answers: %v", err)
	}
	err = explainEtcd(t.Context(), []string{proxy.URL}, tlsCfg, "", nil, context.DeadlineExceeded)
	const want = "an etcd grpc-proxy answers there, but not the etcd it proxies to (GET /proxy/health: 503 Service Unavailable: " +
		`{"health":"false","reason":"GET ERROR:`
	if !strings.Contains(err.Error(), want) || !strings.HasSuffix(err.Error(), "check the proxy's --endpoints") || cannotHeal(err) {
		t.Errorf("a grpc-proxy over TLS whose etcd is down: %v\nwant %q ... check the proxy's --endpoints, retried", err, want)
	}

	notEtcd := httptest.NewUnstartedServer(http.NotFoundHandler())
	notEtcd.EnableHTTP2 = true // as etcd's gRPC needs: the client offers only h2
	notEtcd.StartTLS()
	defer notEtcd.Close()
	err = probeEtcd(t.Context(), notEtcd.URL, caFileConfig(t, notEtcd.Certificate()), nil)
	if err == nil || !strings.Contains(err.Error(), "an HTTP server answers there, not etcd (GET /version: 404 Not Found): check --etcd") {
		t.Errorf("an HTTPS server that is not etcd: %v", err)
	}

	ca := newTestCA(t)
	dir := t.TempDir()
	file := func(name string, b []byte) string {
		writeFile(t, filepath.Join(dir, name), b)
		return filepath.Join(dir, name)
	}
	serverCert, serverKey := ca.issue(t, 2)
	clientCert, clientKey := ca.issue(t, 3)
	f := &serverFlags{etcdCACert: file("ca.pem", ca.pem), etcdCert: file("client.pem", clientCert), etcdKey: file("client-key.pem", clientKey)}
	secure := etcdtest.StartCluster(t, etcdtest.Options{ClientTLS: &transport.TLSInfo{CertFile: file("etcd.pem", serverCert),
		KeyFile: file("etcd-key.pem", serverKey), TrustedCAFile: f.etcdCACert, ClientCertAuth: true}})
	etcdTLS, err := etcdTLSConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := probeEtcd(t.Context(), secure.Endpoints[0], etcdTLS, nil); err != nil {
		t.Errorf("etcd with TLS and client certificates at %s: %v", secure.Endpoints[0], err)
	}
}

// An HTTPS server that does not speak HTTP/2 refuses the handshake of
// the etcd client, which offers only h2, with the alert "no application
// protocol": the probe said etcd refused this node's client certificate,
// and to give --etcd-cert and --etcd-key, which are no remedy. It is not
// etcd, which speaks HTTP/2, nor a grpc-proxy.
func TestProbeEtcd_HTTPSServerWithoutHTTP2(t *testing.T) {
	http1 := httptest.NewTLSServer(http.NotFoundHandler())
	defer http1.Close()
	err := probeEtcd(t.Context(), http1.URL, caFileConfig(t, http1.Certificate()), envFlags{"etcd": true})
	const want = "TLS: remote error: tls: no application protocol (it does not speak HTTP/2, which etcd's gRPC needs: check SHARDCRON_ETCD)"
	if err == nil || err.Error() != want {
		t.Errorf("an HTTPS server without HTTP/2: %v\nwant %q", err, want)
	}
}

// caFileConfig is the etcd clients' TLS configuration with
// --etcd-cacert naming a file that holds cert.
func caFileConfig(t *testing.T, cert *x509.Certificate) *tls.Config {
	t.Helper()
	f := &serverFlags{etcdCACert: filepath.Join(t.TempDir(), "ca.pem")}
	writeFile(t, f.etcdCACert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))
	cfg, err := etcdTLSConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The first warning of a node waiting for etcd says what is wrong with the
// endpoint, as the error after --start-timeout does: it said only "context
// deadline exceeded", again and again, for a minute by default, when
// --etcd named a node's API instead of its embedded etcd.
// The endpoints given by SHARDCRON_ETCD, the warning names that to check,
// not --etcd, which the command line did not give.
func TestServer_FirstEtcdWarningExplains(t *testing.T) {
	notEtcd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"no such endpoint"}`, http.StatusNotFound)
	}))
	defer notEtcd.Close()
	for _, tc := range []struct {
		env   []string
		args  []string
		named string
	}{
		{nil, []string{"--etcd", notEtcd.URL}, "--etcd"},
		{[]string{"SHARDCRON_ETCD=" + notEtcd.URL}, nil, "SHARDCRON_ETCD"},
	} {
		p := startServerEnv(t, tc.env, false, append([]string{"--data-dir", t.TempDir(), "--start-timeout", "10m"}, tc.args...)...)
		etcdtest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(p.log(), "waiting for etcd") })
		first := p.logged("waiting for etcd", "err")
		if want := "an HTTP server answers there, not etcd (GET /version: 404 Not Found): check " + tc.named + " ("; !strings.Contains(first, want) {
			t.Errorf("the first warning says %q, want %q", first, want)
		}
		if code := p.stop(); code != 0 {
			t.Errorf("SIGTERM while waiting for etcd: exit %d", code)
		}
	}
}

// An --etcd endpoint given as host:port, the form README's examples use,
// is probed as the etcd client dials it: plain, or TLS with the etcd TLS
// flags. url.Parse does not read host:port as a host, so the probe was
// skipped and the node said only "context deadline exceeded".
func TestProbeEtcd_HostPortEndpoint(t *testing.T) {
	err := probeEtcd(t.Context(), etcdtest.RefusedAddr(t), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "connection refused (is etcd running there? check --etcd)") {
		t.Errorf("host:port that refuses connections: %v", err)
	}

	notEtcd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"no such endpoint"}`, http.StatusNotFound)
	}))
	defer notEtcd.Close()
	err = probeEtcd(t.Context(), notEtcd.Listener.Addr().String(), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "an HTTP server answers there, not etcd") {
		t.Errorf("host:port of an HTTP server that is not etcd: %v", err)
	}

	// With the etcd TLS flags the client dials host:port over TLS, so the
	// probe does: a plain HTTP server fails the handshake.
	err = probeEtcd(t.Context(), notEtcd.Listener.Addr().String(), &tls.Config{}, nil)
	if err == nil || !strings.Contains(err.Error(), "TLS:") {
		t.Errorf("host:port with TLS flags, to a plain server: %v", err)
	}

	c := etcdtest.Start(t)
	if err := probeEtcd(t.Context(), strings.TrimPrefix(c.Endpoints[0], "http://"), nil, nil); err != nil {
		t.Errorf("etcd at %s as host:port: %v", c.Endpoints[0], err)
	}
}

// A unix socket endpoint that nothing listens on says so, as host:port
// does: the node said only "context deadline exceeded".
func TestProbeEtcd_UnixSocket(t *testing.T) {
	dir := t.TempDir()
	for _, ep := range []string{"unix://" + dir + "/none", "unixs:" + dir + "/none"} {
		err := probeEtcd(t.Context(), ep, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "no such file or directory (is etcd running there? check --etcd)") {
			t.Errorf("%s: %v", ep, err)
		}
	}
	l, err := net.Listen("unix", dir+"/etcd.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := probeEtcd(t.Context(), "unix://"+dir+"/etcd.sock", nil, nil); err != nil {
		t.Errorf("a socket that accepts: %v", err)
	}
}

// silentListener accepts connections on loopback and never answers them;
// count returns how many it accepted before count was called.
func silentListener(t *testing.T) (addr string, count func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn        // guarded by mu; closed at the test's end: the probe sees only silence
	marks := map[string]bool{} // guarded by mu; the remote addresses of count's own connections
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	// A connection of count's own is accepted after every one made before
	// it (the backlog is in order): those before it are the count.
	count = func() int {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		mark := c.LocalAddr().String()
		n := -1
		etcdtest.WaitFor(t, 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			n = 0
			for _, h := range held {
				switch a := h.RemoteAddr().String(); {
				case a == mark:
					marks[a] = true
					return true
				case !marks[a]:
					n++
				}
			}
			return false
		})
		return n
	}
	return ln.Addr().String(), count
}

// The probe that explains a start's failure to reach etcd ends with the
// start's deadline (--start-timeout): an endpoint that takes connections
// and never answers got the TLS handshake's 2 s, then a GET /version's
// 2 s on a second connection, past the deadline. Now the whole probe has
// what the deadline leaves, or probeSlice when it has passed (the final
// error's), in which the handshake's wait ends it: no second connection.
// A start that is stopping (its context canceled) is not probed at all.
func TestExplainEtcd_ProbeEndsWithTheDeadline(t *testing.T) {
	addr, count := silentListener(t)
	base := errors.New("context deadline exceeded")
	passed, cancel := context.WithDeadline(t.Context(), time.Now())
	defer cancel()
	err := explainEtcd(passed, []string{"http://" + addr}, nil, "", nil, base)
	if err.Error() != base.Error() {
		t.Errorf("a silent endpoint: %v, want the client's error alone", err)
	}
	probed := count()
	if probed > 1 {
		t.Errorf("the probe of a silent endpoint made %d connections, want 1: it went on past its budget", probed)
	}

	stopping, stop := context.WithCancel(t.Context())
	stop()
	if err := explainEtcd(stopping, []string{"http://" + addr}, nil, "", nil, base); !errors.Is(err, base) {
		t.Errorf("a start that is stopping: %v", err)
	}
	if n := count(); n != probed {
		t.Errorf("a start that is stopping probed etcd (%d connections more)", n-probed)
	}
}

// probeBudget gives a probe what is left of its caller's deadline, at
// most probeTimeout, and probeSlice once that deadline has passed: a start
// gives up at most probeSlice past --start-timeout.
func TestProbeBudget(t *testing.T) {
	deadline := func(ctx context.Context) time.Time {
		t.Helper()
		pctx, cancel := probeBudget(ctx)
		defer cancel()
		dl, ok := pctx.Deadline()
		if !ok {
			t.Fatal("a probe without a deadline")
		}
		return dl
	}
	before := time.Now()
	if dl := deadline(t.Context()); dl.Before(before.Add(probeTimeout)) || dl.After(time.Now().Add(probeTimeout)) {
		t.Errorf("no deadline: the probe's is %v from now, want %v", time.Until(dl), probeTimeout)
	}
	near, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if dl, want := deadline(near), mustDeadline(t, near); !dl.Equal(want) {
		t.Errorf("a deadline within probeTimeout: the probe's is %v, want the caller's, %v", dl, want)
	}
	// Under probeSlice away: the caller's too. A floor of probeSlice here
	// let the first failure's explanation run past the deadline, and the
	// final error's then had its slice on top.
	soon, cancel := context.WithTimeout(t.Context(), probeSlice/5)
	defer cancel()
	if dl, want := deadline(soon), mustDeadline(t, soon); !dl.Equal(want) {
		t.Errorf("a deadline under probeSlice away: the probe's is %v, want the caller's, %v", dl, want)
	}
	far, cancel := context.WithTimeout(t.Context(), time.Hour)
	defer cancel()
	if dl := deadline(far); dl.After(time.Now().Add(probeTimeout)) {
		t.Errorf("a deadline an hour away: the probe's is %v from now, want %v at most", time.Until(dl), probeTimeout)
	}
	passed, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Minute))
	defer cancel()
	before = time.Now()
	if dl := deadline(passed); dl.Before(before.Add(probeSlice)) || dl.After(time.Now().Add(probeSlice)) {
		t.Errorf("a deadline passed: the probe's is %v from now, want probeSlice, %v", time.Until(dl), probeSlice)
	}
}

func mustDeadline(t *testing.T, ctx context.Context) time.Time {
	t.Helper()
	dl, ok := ctx.Deadline()
	if !ok {
		t.Fatal("no deadline")
	}
	return dl
}

// What waiting for etcd cannot mend ends the wait at its first failure,
// with the first warning's explanation: a login or a permission etcd
// refused, a request without a user where auth is on, a certificate of
// etcd's this node does not trust. They were retried for --start-timeout
// (a minute by default) after the first warning had said what was wrong.
// A refused connection and an endpoint that never answers are still
// retried: they mend as etcd comes up.
func TestWaitForEtcd_GivesUpAtOnceOnWhatWaitingCannotMend(t *testing.T) {
	untrusted := untrustedTLS(t)
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	silent, _ := silentListener(t)
	refused := "http://" + etcdtest.RefusedAddr(t)
	for _, tc := range []struct {
		name, endpoint string
		err            error  // each attempt's
		want           string // in the error it gives up with; "": retried
	}{
		{"permission denied", refused, rpctypes.ErrPermissionDenied, "permission denied (etcd has authentication on: give --etcd-user"},
		{"no user", refused, rpctypes.ErrUserEmpty, "user name is empty (etcd has authentication on: give --etcd-user"},
		{"wrong password", refused, rpctypes.ErrAuthFailed, "authentication failed, invalid user ID or password (check --etcd-user"},
		{"etcd's certificate not trusted", untrusted, context.DeadlineExceeded, "x509: certificate signed by unknown authority (--etcd-cacert must name the CA"},
		{"https to a plain endpoint", "https://" + plain.Listener.Addr().String(), context.DeadlineExceeded,
			"first record does not look like a TLS handshake (it serves plain HTTP/gRPC: use an http:// endpoint, or enable TLS on etcd)"},
		{"connection refused", refused, context.DeadlineExceeded, ""},
		{"no answer", "http://" + silent, context.DeadlineExceeded, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
			defer cancel()
			attempts := 0
			get := func(context.Context) error {
				attempts++
				switch {
				case attempts == 1:
					return tc.err
				case tc.want == "":
					return nil // etcd came up
				}
				cancel() // retried: the wait would go on for its 10 minutes
				return tc.err
			}
			explain := func(ctx context.Context, err error) error {
				return explainEtcd(ctx, []string{tc.endpoint}, nil, "", nil, err)
			}
			err := waitForEtcd(ctx, get, []string{tc.endpoint}, explain, slog.New(slog.DiscardHandler))
			switch {
			case tc.want == "" && (err != nil || attempts != 2):
				t.Errorf("after %d attempts: %v, want it retried until etcd answers", attempts, err)
			case tc.want != "" && (attempts != 1 || err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("after %d attempts: %v, want it given up at once with %q", attempts, err, tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), "etcd at "+tc.endpoint):
				t.Errorf("%v does not name the endpoint", err)
			}
		})
	}
}

// Every --etcd endpoint is probed, and each is named with what it did:
// only the first was, so a silent first endpoint hid a later one that
// refuses connections, and nothing was explained. A certificate refused
// at one endpoint of two is retried (the other may come up); at both it
// is not.
func TestExplainEtcd_ProbesEveryEndpoint(t *testing.T) {
	silent, _ := silentListener(t)
	silent = "http://" + silent
	refused := "http://" + etcdtest.RefusedAddr(t)
	notEtcd := httptest.NewServer(http.NotFoundHandler())
	defer notEtcd.Close()
	base := context.DeadlineExceeded

	err := explainEtcd(t.Context(), []string{silent, refused, notEtcd.URL}, nil, "", nil, base)
	for _, w := range []string{
		silent + ": no answer",
		refused + ": dial tcp " + strings.TrimPrefix(refused, "http://") + ": connect: connection refused (is etcd running there? check --etcd)",
		notEtcd.URL + ": an HTTP server answers there, not etcd",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v\ndoes not say %q", err, w)
		}
	}
	if !errors.Is(err, base) || cannotHeal(err) {
		t.Errorf("%v: want the client's error first, and retried", err)
	}

	c := etcdtest.Start(t)
	if err := explainEtcd(t.Context(), []string{c.Endpoints[0], refused}, nil, "", nil, base); !strings.Contains(err.Error(), c.Endpoints[0]+": reached") {
		t.Errorf("etcd and a refused endpoint: %v, want etcd reached", err)
	}

	one, two := untrustedTLS(t), untrustedTLS(t)
	if err := explainEtcd(t.Context(), []string{one, refused}, nil, "", nil, base); cannotHeal(err) {
		t.Errorf("a certificate refused at one endpoint of two: %v, given up", err)
	}
	err = explainEtcd(t.Context(), []string{one, two}, nil, "", nil, base)
	if !cannotHeal(err) || strings.Count(err.Error(), "x509: certificate signed by unknown authority") != 2 {
		t.Errorf("a certificate refused at both endpoints: %v, want both named and given up", err)
	}
}

// With a client certificate and no --etcd-user, etcd takes the user from
// the certificate's common name: a refused permission names that user and
// the role it needs. It said to give --etcd-user, which is not needed.
func TestExplainEtcd_PermissionDeniedToCertificateUser(t *testing.T) {
	ca := newTestCA(t)
	cert, key := ca.issue(t, 2)
	dir := t.TempDir()
	f := &serverFlags{etcdCert: dir + "/client.pem", etcdKey: dir + "/client-key.pem"}
	writeFile(t, f.etcdCert, cert)
	writeFile(t, f.etcdKey, key)
	tlsCfg, err := etcdTLSConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	err = explainEtcd(t.Context(), []string{"https://127.0.0.1:2379"}, tlsCfg, "", nil, rpctypes.ErrPermissionDenied)
	const want = `permission denied (etcd takes the user from the client certificate's common name "node", ` +
		`which may not read this cluster's keys: grant that user a role with readwrite on the keys under --etcd-prefix)`
	if !strings.Contains(err.Error(), want) || !cannotHeal(err) {
		t.Errorf("%v\nwant %q, given up", err, want)
	}
}

// The flags explainEtcd's remedies name are named as the operator gave
// them, as the node's other errors name them (envFlags.givenAs): by
// their variable when the environment gave them. They were flags
// whatever gave them: SHARDCRON_ETCD pointing at an HTTP server that is
// not etcd was told to check --etcd, which the command line did not give.
func TestExplainEtcd_RemediesNameTheFlagAsGiven(t *testing.T) {
	refused := "http://" + etcdtest.RefusedAddr(t)
	notEtcd := httptest.NewServer(http.NotFoundHandler())
	defer notEtcd.Close()
	untrusted := untrustedTLS(t)
	certRequired := httptest.NewUnstartedServer(http.NotFoundHandler())
	certRequired.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	certRequired.EnableHTTP2 = true
	certRequired.StartTLS()
	defer certRequired.Close()
	trusted := caFileConfig(t, certRequired.Certificate())
	fromEnv := envFlags{"etcd": true, "etcd-cacert": true, "etcd-cert": true, "etcd-key": true,
		"etcd-user": true, "etcd-password-file": true, "etcd-prefix": true}
	for _, tc := range []struct {
		name          string
		endpoint      string
		tlsCfg        *tls.Config
		user          string
		err           error
		byFlag, byEnv string // in the explanation, given by flags, and by the environment
	}{
		{"connection refused", refused, nil, "", context.DeadlineExceeded,
			"(is etcd running there? check --etcd)", "(is etcd running there? check SHARDCRON_ETCD)"},
		{"not etcd", notEtcd.URL, nil, "", context.DeadlineExceeded,
			"not etcd (GET /version: 404 Not Found): check --etcd (", "not etcd (GET /version: 404 Not Found): check SHARDCRON_ETCD ("},
		{"serves TLS", "http://" + strings.TrimPrefix(untrusted, "https://"), nil, "", context.DeadlineExceeded,
			"it serves TLS: use an https:// endpoint and --etcd-cacert", "it serves TLS: use an https:// endpoint and SHARDCRON_ETCD_CACERT"},
		{"etcd's CA", untrusted, nil, "", context.DeadlineExceeded,
			"(--etcd-cacert must name the CA", "(SHARDCRON_ETCD_CACERT must name the CA"},
		{"client certificate", certRequired.URL, trusted, "", context.DeadlineExceeded,
			"give --etcd-cert and --etcd-key,", "give SHARDCRON_ETCD_CERT and SHARDCRON_ETCD_KEY,"},
		{"wrong password", refused, nil, "root", rpctypes.ErrAuthFailed,
			"(check --etcd-user and --etcd-password or --etcd-password-file)",
			"(check SHARDCRON_ETCD_USER and --etcd-password or SHARDCRON_ETCD_PASSWORD_FILE)"},
		{"no user", refused, nil, "", rpctypes.ErrUserEmpty,
			"give --etcd-user and --etcd-password-file)", "give SHARDCRON_ETCD_USER and SHARDCRON_ETCD_PASSWORD_FILE)"},
		{"permission", refused, nil, "root", rpctypes.ErrPermissionDenied,
			"keys under --etcd-prefix)", "keys under SHARDCRON_ETCD_PREFIX)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, g := range []struct {
				given envFlags
				want  string
			}{{nil, tc.byFlag}, {fromEnv, tc.byEnv}} {
				err := explainEtcd(t.Context(), []string{tc.endpoint}, tc.tlsCfg, tc.user, g.given, tc.err)
				if !strings.Contains(err.Error(), g.want) {
					t.Errorf("given %v: %v\nwant %q", g.given, err, g.want)
				}
			}
		})
	}
}

// untrustedTLS returns the https URL of a loopback server that speaks h2,
// as etcd does, with a certificate whose CA the probe is not given.
func untrustedTLS(t *testing.T) string {
	s := httptest.NewUnstartedServer(http.NotFoundHandler())
	s.EnableHTTP2 = true
	s.StartTLS()
	t.Cleanup(s.Close)
	return s.URL
}
