package main

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
	err := probeEtcd(notEtcd.URL, nil)
	if err == nil || !strings.Contains(err.Error(), "an HTTP server answers there, not etcd (GET /version: 404 Not Found): check --etcd") {
		t.Errorf("an HTTP server that is not etcd: %v", err)
	}

	// An HTTP server that answers /version with etcd's fields is taken
	// for etcd: only its transport is probed.
	likeEtcd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"etcdserver":"3.6.0","etcdcluster":"3.6.0"}`)
	}))
	defer likeEtcd.Close()
	if err := probeEtcd(likeEtcd.URL, nil); err != nil {
		t.Errorf("a server answering as etcd: %v", err)
	}

	c := etcdtest.Start(t)
	if err := probeEtcd(c.Endpoints[0], nil); err != nil {
		t.Errorf("etcd at %s: %v", c.Endpoints[0], err)
	}

	err = probeEtcd("http://"+etcdtest.RefusedAddr(t), nil)
	if err == nil || !strings.Contains(err.Error(), "is etcd running there?") || errors.Is(err, errServesTLS) {
		t.Errorf("a refused connection: %v", err)
	}
}

// The first warning of a node waiting for etcd says what is wrong with the
// endpoint, as the error after --start-timeout does: it said only "context
// deadline exceeded", again and again, for a minute by default, when
// --etcd named a node's API instead of its embedded etcd.
func TestServer_FirstEtcdWarningExplains(t *testing.T) {
	notEtcd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"no such endpoint"}`, http.StatusNotFound)
	}))
	defer notEtcd.Close()
	p := startServer(t, false, "--data-dir", t.TempDir(), "--etcd", notEtcd.URL, "--start-timeout", "10m")
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(p.log(), "waiting for etcd") })
	first := p.logged("waiting for etcd", "err")
	if !strings.Contains(first, "an HTTP server answers there, not etcd") {
		t.Errorf("the first warning says %q, not what answers at --etcd", first)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("SIGTERM while waiting for etcd: exit %d", code)
	}
}

// An --etcd endpoint given as host:port, the form README's examples use,
// is probed as the etcd client dials it: plain, or TLS with the etcd TLS
// flags. url.Parse does not read host:port as a host, so the probe was
// skipped and the node said only "context deadline exceeded".
func TestProbeEtcd_HostPortEndpoint(t *testing.T) {
	err := probeEtcd(etcdtest.RefusedAddr(t), nil)
	if err == nil || !strings.Contains(err.Error(), "connection refused (is etcd running there? check --etcd)") {
		t.Errorf("host:port that refuses connections: %v", err)
	}

	notEtcd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"no such endpoint"}`, http.StatusNotFound)
	}))
	defer notEtcd.Close()
	err = probeEtcd(notEtcd.Listener.Addr().String(), nil)
	if err == nil || !strings.Contains(err.Error(), "an HTTP server answers there, not etcd") {
		t.Errorf("host:port of an HTTP server that is not etcd: %v", err)
	}

	// With the etcd TLS flags the client dials host:port over TLS, so the
	// probe does: a plain HTTP server fails the handshake.
	err = probeEtcd(notEtcd.Listener.Addr().String(), &tls.Config{})
	if err == nil || !strings.Contains(err.Error(), "TLS:") {
		t.Errorf("host:port with TLS flags, to a plain server: %v", err)
	}

	c := etcdtest.Start(t)
	if err := probeEtcd(strings.TrimPrefix(c.Endpoints[0], "http://"), nil); err != nil {
		t.Errorf("etcd at %s as host:port: %v", c.Endpoints[0], err)
	}
}

// A unix socket endpoint that nothing listens on says so, as host:port
// does: the node said only "context deadline exceeded".
func TestProbeEtcd_UnixSocket(t *testing.T) {
	dir := t.TempDir()
	for _, ep := range []string{"unix://" + dir + "/none", "unixs:" + dir + "/none"} {
		err := probeEtcd(ep, nil)
		if err == nil || !strings.Contains(err.Error(), "no such file or directory (is etcd running there? check --etcd)") {
			t.Errorf("%s: %v", ep, err)
		}
	}
	l, err := net.Listen("unix", dir+"/etcd.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := probeEtcd("unix://"+dir+"/etcd.sock", nil); err != nil {
		t.Errorf("a socket that accepts: %v", err)
	}
}
