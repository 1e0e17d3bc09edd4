package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// explainEtcd adds to err, an etcd client's failure to reach endpoints,
// what the operator can act on, each of this node's flags it names named
// as the operator gave it (given's givenAs: by its variable when the
// environment gave it, where the operator looks for it): a refused login
// names the flags to check, a permission refused to user (--etcd-user),
// or without one to the client certificate's common name (etcd's user
// then), the role to grant;
// and a connection that fails below gRPC (which only reports a deadline)
// is tried once by hand, to every endpoint at once, to find the refused
// connection or the TLS error behind it. One endpoint's finding
// is added as it is; of several, each is named with what it did, one
// that answered nothing or whose transport works too: the first may be
// silent and a later one refuse. The probes end at ctx's deadline,
// --start-timeout's (probeBudget), and are not made once ctx is
// canceled: the node is stopping. It never adds a credential: the error
// texts it adds come from etcd and crypto/tls.
func explainEtcd(ctx context.Context, endpoints []string, tlsCfg *tls.Config, user string, given envFlags, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "permission denied") && user != "":
		// Logged in: the user's roles do not cover the cluster's keys.
		return fmt.Errorf("%w (etcd user %q may not read this cluster's keys: grant it a role with readwrite on the keys under %s)",
			err, user, given.givenAs("etcd-prefix"))
	case strings.Contains(msg, "permission denied") && tlsCfg != nil && tlsCfg.GetClientCertificate != nil:
		// Without --etcd-user, etcd takes the user from the client
		// certificate's common name: --etcd-user is no remedy, a role is.
		return fmt.Errorf("%w (etcd takes the user from the client certificate's common name%s, which may not read this cluster's keys: "+
			"grant that user a role with readwrite on the keys under %s)", err, certUser(tlsCfg), given.givenAs("etcd-prefix"))
	case strings.Contains(msg, "authentication failed"):
		return fmt.Errorf("%w (check %s and %s or %s)", err,
			given.givenAs("etcd-user"), given.givenAs("etcd-password"), given.givenAs("etcd-password-file"))
	case strings.Contains(msg, "permission denied"), strings.Contains(msg, "user name is empty"),
		strings.Contains(msg, "invalid auth token"):
		return fmt.Errorf("%w (etcd has authentication on: give %s and %s)", err, given.givenAs("etcd-user"), given.givenAs("etcd-password-file"))
	}
	if len(endpoints) == 0 || errors.Is(ctx.Err(), context.Canceled) {
		return err
	}
	pctx, cancel := probeBudget(ctx)
	defer cancel()
	found := make([]error, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		wg.Go(func() { found[i] = probeEtcd(pctx, ep, tlsCfg, given) })
	}
	wg.Wait()
	refused := true
	for i, f := range found {
		refused = refused && tlsRefused(f)
		switch {
		case len(endpoints) > 1:
			if f == nil {
				f = errReached
			}
			err = fmt.Errorf("%w; %s: %w", err, endpoints[i], f)
		case f == nil, errors.Is(f, errNoAnswer):
			return err // the client's error says as much
		default:
			err = fmt.Errorf("%w; %w", err, f)
		}
	}
	if refused {
		return unhealable{err}
	}
	return err
}

// certUser is ` %q` of the common name of tlsCfg's client certificate, or
// "" when it cannot be read.
func certUser(tlsCfg *tls.Config) string {
	cert, err := tlsCfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || cert == nil || len(cert.Certificate) == 0 {
		return ""
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil || leaf.Subject.CommonName == "" {
		return ""
	}
	return fmt.Sprintf(" %q", leaf.Subject.CommonName)
}

// unhealable marks what explainEtcd found when every endpoint refused
// this node's TLS (tlsRefused): no retry mends it.
type unhealable struct{ error }

func (u unhealable) Unwrap() error { return u.error }

// cannotHeal reports whether err, a failure to reach etcd or explainEtcd's
// explanation of one, is one that waiting for etcd does not mend: etcd
// refused the user and password, or a request without them (auth is on),
// or the user's permission to read (auth is the same on every member), or
// every endpoint refused this node's TLS. The operator must change a flag
// or etcd's configuration first. A refused connection, a timeout, a
// leader election, an expired token (the client fetches a new one) are
// retried: they mend as etcd comes up. So is an HTTP server that does not
// answer GET /version as etcd (probeNotEtcd), even at every endpoint: an
// HTTP load balancer before etcd may answer 503 until etcd is up; and an
// etcd grpc-proxy whose etcd does not answer (probeGRPCProxy), which
// proxies the client's gRPC to etcd once it does. (An etcd that is still
// starting answers nothing: it serves its clients once ready.)
func cannotHeal(err error) bool {
	var u unhealable
	return errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrPermissionDenied) ||
		errors.Is(err, rpctypes.ErrUserEmpty) || errors.As(err, &u)
}

// tlsRefused reports whether perr, probeEtcd's finding, is a TLS error
// that the same endpoint gives at every attempt: a certificate of etcd's
// this node does not trust (--etcd-cacert), a certificate of this node's
// that etcd refuses (its alert names a certificate), or TLS on one side
// only (errServesTLS; an https endpoint that answers without TLS). A
// handshake cut short (etcd restarting) or timed out is not one.
func tlsRefused(perr error) bool {
	var verr *tls.CertificateVerificationError
	var rerr tls.RecordHeaderError
	var oerr *net.OpError
	switch {
	case errors.As(perr, &verr), errors.As(perr, &rerr), errors.Is(perr, errServesTLS):
		return true
	case errors.As(perr, &oerr) && oerr.Op == "remote error":
		return strings.Contains(oerr.Err.Error(), "certificate")
	}
	return false
}

// A probe of etcd takes probeTimeout at most, and no more than what is
// left of its caller's deadline; probeSlice once that has passed: the
// error that says --start-timeout passed is explained after the deadline,
// as is the first attempt's when it ran into it (a --start-timeout under
// an attempt's 2 s). A refused connection, a TLS error or an HTTP server
// other than etcd answers within milliseconds, and is what the probe is
// for; only an endpoint that answers nothing uses up the slice, and the
// probe then adds only that it did not answer. The endpoints are probed
// at once, each with the whole budget. So a start gives up at most probeSlice
// past --start-timeout, not the seconds of a probe of every step.
const (
	probeTimeout = 2 * time.Second
	probeSlice   = 500 * time.Millisecond
)

// probeBudget returns the context of a probe under ctx (probeTimeout,
// probeSlice). It outlives ctx's deadline by the slice, but not a cancel
// of ctx (the node is asked to stop).
func probeBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	now := time.Now()
	end := now.Add(probeTimeout)
	if dl, ok := ctx.Deadline(); ok {
		switch {
		case !dl.After(now):
			end = now.Add(probeSlice)
		case dl.Before(end):
			end = dl
		}
	}
	pctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})
	return pctx, func() { stop(); cancel() }
}

// Findings of probeEtcd: a plain endpoint that speaks TLS (probeEtcd adds
// the remedy); an endpoint that answered nothing before the probe's end.
// errReached is explainEtcd's word for an endpoint where the probe found
// nothing wrong.
var (
	errServesTLS = errors.New("it serves TLS")
	errNoAnswer  = errors.New("no answer")
	errReached   = errors.New("reached: its transport works")
)

// probeEtcd connects to endpoint as the etcd client would and returns what
// the connection or the TLS layer says, with the flag to look at (as
// given gave it), or that an HTTP server other than etcd answers there,
// plain or over TLS (probeNotEtcd); errNoAnswer when ctx ends before the
// endpoint answers the TLS handshake (the server's or the one it
// refuses); nil when the transport works (a unix socket is only dialed).
// The etcd client's own error for an endpoint that refuses connections is
// only its deadline.
func probeEtcd(ctx context.Context, endpoint string, tlsCfg *tls.Config, given envFlags) error {
	var d net.Dialer
	if scheme, rest, ok := strings.Cut(endpoint, ":"); ok && (scheme == "unix" || scheme == "unixs") {
		// The socket's path as the etcd client reads it: unix:path,
		// unix://path, unix:///absolute/path.
		conn, err := d.DialContext(ctx, "unix", strings.TrimPrefix(rest, "//"))
		if err != nil {
			return fmt.Errorf("%w (is etcd running there? check %s)", err, given.givenAs("etcd"))
		}
		conn.Close()
		return nil
	}
	if !strings.Contains(endpoint, "://") {
		// host:port, which url.Parse does not read as a host: the etcd
		// client dials it over TLS when the etcd TLS flags give one.
		scheme := "http://"
		if tlsCfg != nil {
			scheme = "https://"
		}
		endpoint = scheme + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil
	}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return fmt.Errorf("%w (is etcd running there? check %s)", err, given.givenAs("etcd"))
	}
	defer conn.Close()
	if u.Scheme != "https" {
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) // only to learn whether it speaks TLS
		switch err := tc.HandshakeContext(ctx); {
		case err == nil:
			return fmt.Errorf("%w: use an https:// endpoint and %s", errServesTLS, given.givenAs("etcd-cacert"))
		case ctx.Err() != nil:
			return errNoAnswer
		}
		return probeNotEtcd(ctx, "http://"+u.Host, nil, given)
	}
	cfg := &tls.Config{}
	if tlsCfg != nil {
		cfg = tlsCfg.Clone()
	}
	cfg.ServerName, cfg.NextProtos = u.Hostname(), []string{"h2"}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		if ctx.Err() != nil {
			return errNoAnswer
		}
		return tlsHint(err, given)
	}
	// With TLS 1.3 a server that refuses the client's certificate says so
	// after the handshake: at the first read.
	read := time.Now().Add(500 * time.Millisecond)
	if dl, ok := ctx.Deadline(); ok && dl.Before(read) {
		read = dl
	}
	_ = tc.SetReadDeadline(read)
	var b [1]byte
	if _, err := tc.Read(b[:]); err != nil && strings.Contains(err.Error(), "tls:") {
		return tlsHint(err, given)
	}
	// etcd serves its HTTP over TLS as well, and so does a grpc-proxy
	// with TLS, over HTTP/1 only: its HTTP/2 goes to gRPC.
	httpCfg := cfg.Clone()
	httpCfg.NextProtos = []string{"http/1.1"}
	return probeNotEtcd(ctx, "https://"+u.Host, httpCfg, given)
}

// probeNotEtcd asks the endpoint at base (scheme://host; over TLS with
// tlsCfg) for GET /version, which etcd serves on its client port beside
// gRPC, and returns an error when an HTTP server answers there without
// etcd's version: another program, such as a shardcron node's API given
// for its embedded etcd (which listens on the API port + 10000). The
// etcd client only reports its deadline for such an endpoint, after
// --start-timeout. nil when it answers as etcd does (its versions, or its
// refusal of a Host that its --host-whitelist does not list), not over
// HTTP/1 at all, or not before ctx ends. An etcd grpc-proxy, which serves
// no /version, is asked whether its etcd answers (probeGRPCProxy).
func probeNotEtcd(ctx context.Context, base string, tlsCfg *tls.Config, given envFlags) error {
	resp, body, err := probeGet(ctx, tlsCfg, http.MethodGet, base+"/version")
	if err != nil {
		return nil
	}
	switch {
	case resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"etcdserver"`)):
		return nil
	case resp.StatusCode == http.StatusMisdirectedRequest && bytes.Contains(body, []byte("etcd received your request")):
		// etcd with --host-whitelist refuses plain HTTP whose Host it
		// does not list, and serves the client's gRPC all the same.
		return nil
	case resp.StatusCode == http.StatusNotFound:
		if proxy, err := probeGRPCProxy(ctx, base, tlsCfg); proxy {
			return err
		}
	}
	return fmt.Errorf("an HTTP server answers there, not etcd (GET /version: %s): check %s "+
		"(a node's embedded etcd listens on its API port + 10000, or its --etcd-listen)", resp.Status, given.givenAs("etcd"))
}

// probeGRPCProxy reports whether an etcd grpc-proxy answers at base (as
// probeNotEtcd's), and if so, an error when the etcd it proxies the
// client's gRPC to does not answer it. Its client port serves HTTP/1
// beside gRPC, over TLS when the proxy has TLS: no /version,
// but etcd's health handlers at /health and /proxy/health (etcdmain's
// mustHTTPServer, go.etcd.io/etcd/server/v3 v3.7.3), which etcd itself
// does not serve. Those refuse any method but GET at once (405, Allow:
// GET), which tells the proxy; the GET then waits for the proxy's read of
// etcd through itself, a second when etcd does not answer, and says 200,
// or 503 with the reason. A GET that ctx ends first is such a wait.
func probeGRPCProxy(ctx context.Context, base string, tlsCfg *tls.Config) (bool, error) {
	health := base + "/proxy/health"
	resp, _, err := probeGet(ctx, tlsCfg, http.MethodHead, health)
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodGet {
		return false, nil
	}
	said := "no answer"
	resp, body, err := probeGet(ctx, tlsCfg, http.MethodGet, health)
	switch {
	case err == nil && resp.StatusCode == http.StatusOK:
		return true, nil
	case err == nil:
		said = resp.Status + ": " + string(bytes.TrimSpace(body))
	}
	return true, fmt.Errorf("an etcd grpc-proxy answers there, but not the etcd it proxies to (GET /proxy/health: %s): "+
		"check the proxy's --endpoints", said)
}

// probeGet makes one HTTP request of the probe (over TLS with tlsCfg),
// without a proxy or a redirect followed, and returns its answer with
// what arrived of the first 4 KiB of its body.
func probeGet(ctx context.Context, tlsCfg *tls.Config, method, target string) (*http.Response, []byte, error) {
	c := &http.Client{
		Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true, TLSClientConfig: tlsCfg},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, err := http.NewRequestWithContext(ctx, method, target, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp, body, nil
}

// tlsHint wraps a TLS error with the flags that fix it, as given gave them.
func tlsHint(err error, given envFlags) error {
	var rerr tls.RecordHeaderError
	switch {
	case errors.As(err, &rerr):
		// The answer to the handshake is not TLS: errServesTLS's case
		// the other way round.
		return fmt.Errorf("TLS: %w (it serves plain HTTP/gRPC: use an http:// endpoint, or enable TLS on etcd)", err)
	case strings.Contains(err.Error(), "no application protocol"):
		// The server offers no h2, the only protocol the probe offers,
		// as the etcd client does: not a certificate refused.
		return fmt.Errorf("TLS: %w (it does not speak HTTP/2, which etcd's gRPC needs: check %s)", err, given.givenAs("etcd"))
	case strings.Contains(err.Error(), "remote error"):
		return fmt.Errorf("TLS: %w (etcd refused this node's client certificate: give %s and %s, "+
			"signed by a CA etcd trusts)", err, given.givenAs("etcd-cert"), given.givenAs("etcd-key"))
	case strings.Contains(err.Error(), "x509:"):
		return fmt.Errorf("TLS: %w (%s must name the CA that signed etcd's certificate)", err, given.givenAs("etcd-cacert"))
	}
	return fmt.Errorf("TLS: %w", err)
}
