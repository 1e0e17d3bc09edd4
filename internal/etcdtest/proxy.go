package etcdtest

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free loopback port in front of an etcd client
// endpoint. Cut simulates a network partition between the clients that use
// the proxy and etcd; Restore heals it. Other clients are not affected.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup // accept loop and one goroutine per forwarded connection

	mu     sync.Mutex // guards cut, closed and conns
	cut    bool
	closed bool
	// conns holds every open connection: both ends of forwarded pairs and,
	// while cut, the accepted connections that are held without forwarding.
	conns map[net.Conn]struct{}
}

// NewProxy starts a proxy to the cluster's server. It is closed when the test
// ends.
func (c *Cluster) NewProxy(t testing.TB) *Proxy {
	t.Helper()
	return NewProxy(t, c.Addr())
}

// NewProxy starts a proxy on a free loopback port that forwards every
// connection to target ("host:port"). It is closed when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdtest: proxy listen: %v", err)
	}
	p := &Proxy{target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

// Endpoint is the proxy's URL for an etcd client ("http://127.0.0.1:port").
func (p *Proxy) Endpoint() string { return "http://" + p.ln.Addr().String() }

// Cut drops every current connection and blackholes new ones: they are
// accepted but nothing is forwarded in either direction, so requests hang
// until their deadline as in a real partition. Cut is idempotent.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.closeConnsLocked()
}

// Restore ends a Cut: the connections accepted during the cut are closed (so
// clients redial at once instead of waiting on them) and new connections are
// forwarded again. Restore is idempotent.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return
	}
	p.cut = false
	p.closeConnsLocked()
}

// Close stops the proxy, closes every connection and waits for its
// goroutines. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	p.closeConnsLocked()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) closeConnsLocked() {
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		switch {
		case p.closed:
			_ = c.Close()
		case p.cut:
			p.conns[c] = struct{}{} // held, never read: a blackhole
		default:
			p.conns[c] = struct{}{}
			p.wg.Add(1)
			go p.forward(c)
		}
		p.mu.Unlock()
	}
}

// forward pipes c to a new connection to the target until either side ends
// or the proxy drops both.
func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.drop(c)
		return
	}
	if !p.track(up) {
		// Cut or closed while dialing: c has been closed already.
		_ = up.Close()
		return
	}
	var pipes sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer pipes.Done()
		_, _ = io.Copy(dst, src)
		// Closing both ends makes the other direction return as well.
		p.drop(dst)
		p.drop(src)
	}
	pipes.Add(2)
	go pipe(up, c)
	go pipe(c, up)
	pipes.Wait()
}

// track registers an upstream connection; false if the proxy was cut or
// closed meanwhile.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}
