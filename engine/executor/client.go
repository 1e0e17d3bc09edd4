package executor

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// ClientConfig tunes the *http.Client that NewClient builds, shared by all
// HTTP executors of a node. A zero field takes its default; a negative one is
// invalid. No field bounds a whole request: the task's timeout, through the
// fire's context, does that, so a node-wide limit never silently shortens a
// task that was given longer.
type ClientConfig struct {
	// DialTimeout bounds establishing one TCP connection. Default 5s: a host
	// that does not answer a SYN in that long is down, and the rest of the
	// fire's timeout is better spent reporting it.
	DialTimeout time.Duration
	// KeepAlive is the TCP keep-alive probe period of connections, which
	// finds dead peers of idle pooled connections. Default 30s.
	KeepAlive time.Duration
	// TLSHandshakeTimeout bounds the TLS handshake. Default 10s.
	TLSHandshakeTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for the response headers after
	// the request is written. Default 0: no bound but the fire's timeout,
	// since many webhooks only answer when their work is done.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout closes a pooled connection idle that long. Default 90s:
	// longer than the most common schedule interval (a minute), so a task
	// firing every minute at a host finds its connection still open.
	IdleConnTimeout time.Duration
	// MaxIdleConns caps idle pooled connections over all hosts, which bounds
	// the file descriptors the pool holds. Default 1024.
	MaxIdleConns int
	// MaxIdleConnsPerHost caps idle pooled connections per host. Default
	// 256, the default worker count: when every worker fires at one host,
	// each finds a connection to reuse instead of dialing and closing one
	// per fire (Go's default of 2 would do that). Values above MaxIdleConns
	// are allowed but capped by it in effect.
	MaxIdleConnsPerHost int
	// MaxConnsPerHost caps connections (dialing, active and idle) per host;
	// a fire beyond it waits for a connection within its timeout. Default 0:
	// no cap, since the worker pool already bounds concurrency.
	MaxConnsPerHost int
	// Allow, when set, is the node's HTTP allow-list: the client dials only
	// the addresses it allows, and refuses a request whose URL host it
	// leaves out (errors wrap ErrNotAllowed). NewHTTP checks each task's URL
	// against it too. Default nil: every host.
	Allow *HostAllow
}

// DefaultClientConfig returns the configuration NewClient uses for zero
// fields.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{
		DialTimeout:         5 * time.Second,
		KeepAlive:           30 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
	}
}

// Validate refuses negative fields.
func (c ClientConfig) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"DialTimeout", c.DialTimeout}, {"KeepAlive", c.KeepAlive},
		{"TLSHandshakeTimeout", c.TLSHandshakeTimeout},
		{"ResponseHeaderTimeout", c.ResponseHeaderTimeout},
		{"IdleConnTimeout", c.IdleConnTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("executor: client config: %s is %v, want 0 (default) or more", d.name, d.v))
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"MaxIdleConns", c.MaxIdleConns}, {"MaxIdleConnsPerHost", c.MaxIdleConnsPerHost},
		{"MaxConnsPerHost", c.MaxConnsPerHost},
	} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("executor: client config: %s is %d, want 0 (default) or more", n.name, n.v))
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns c with zero fields set to their defaults.
func (c ClientConfig) withDefaults() ClientConfig {
	d := DefaultClientConfig()
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.DialTimeout, d.DialTimeout)
	set(&c.KeepAlive, d.KeepAlive)
	set(&c.TLSHandshakeTimeout, d.TLSHandshakeTimeout)
	set(&c.IdleConnTimeout, d.IdleConnTimeout)
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = d.MaxIdleConns
	}
	if c.MaxIdleConnsPerHost == 0 {
		c.MaxIdleConnsPerHost = d.MaxIdleConnsPerHost
	}
	return c
}

// maxResponseHeaderBytes bounds the response headers a webhook may send:
// we read none of them but Location.
const maxResponseHeaderBytes = 64 << 10

// NewClient returns an *http.Client with its own Transport, for all the HTTP
// executors of a node, or the error of cfg.Validate. Besides cfg:
//
//   - It does not follow redirects: a 3xx answer is returned as is, and the
//     HTTP executor reports it as a failure (see the package documentation).
//   - It has no Client.Timeout: each fire's context bounds its request.
//   - Proxies come from the environment (HTTP_PROXY, HTTPS_PROXY, NO_PROXY),
//     as with Go's default transport. With cfg.Allow, a request through a
//     proxy to a host name that no name entry matches is refused: the
//     proxy, not the node, resolves it.
//   - It asks for HTTP/2 over TLS when the server offers it, and does not ask
//     for compressed responses, since bodies are discarded.
//
// Call CloseIdleConnections on it when the node stops.
func NewClient(cfg ClientConfig) (*http.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	dialer := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: cfg.KeepAlive}
	dial := dialer.DialContext
	if cfg.Allow != nil {
		dial = cfg.Allow.dialContext(dialer)
	}
	t := &http.Transport{
		Proxy:                  http.ProxyFromEnvironment,
		DialContext:            dial,
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    cfg.TLSHandshakeTimeout,
		ResponseHeaderTimeout:  cfg.ResponseHeaderTimeout,
		IdleConnTimeout:        cfg.IdleConnTimeout,
		MaxIdleConns:           cfg.MaxIdleConns,
		MaxIdleConnsPerHost:    cfg.MaxIdleConnsPerHost,
		MaxConnsPerHost:        cfg.MaxConnsPerHost,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	var rt http.RoundTripper = t
	if cfg.Allow != nil {
		rt = &allowTransport{Transport: t, allow: cfg.Allow}
	}
	return &http.Client{
		Transport: rt,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}, nil
}

// allowTransport refuses a request whose URL host the allow-list leaves
// out before the transport dials anything (the dial checks the rest).
// Through a proxy the dial reaches the proxy, which resolves the host
// itself: a host name is then allowed only by name.
type allowTransport struct {
	*http.Transport // CloseIdleConnections comes from it
	allow           *HostAllow
}

func (t *allowTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	err := t.allow.checkHost(r.URL.Hostname())
	if err == nil && t.Proxy != nil {
		if p, perr := t.Proxy(r); perr == nil && p != nil {
			err = t.allow.checkProxied(r.URL.Hostname())
		}
	}
	if err != nil {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, err
	}
	return t.Transport.RoundTrip(r)
}
