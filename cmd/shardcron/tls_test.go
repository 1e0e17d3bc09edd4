package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/logbuf"
)

// testCA is a certificate authority made in the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shardcron test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate and key, PEM, for 127.0.0.1 with serial
// number serial, good for servers and clients.
func (ca *testCA) issue(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	return ca.issueFor(t, serial, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
}

// issueFor is issue with the extended key usages given (none: the
// certificate has no extended key usage extension).
func (ca *testCA) issueFor(t *testing.T, serial int64, usages ...x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	// Written aside and renamed, as a certificate manager does, so that a
	// reload never reads half a file.
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// TestServer_MutualTLS runs two nodes serving their API over mutual TLS
// with certificates made here: a client with a certificate of the CA is
// served, one without is refused at the handshake, plain HTTP is refused;
// each node reaches the other over https (GET /v1/nodes has both reports);
// the node serves a renewed certificate after SIGHUP, and after its files
// change without one.
func TestServer_MutualTLS(t *testing.T) {
	c := etcdtest.Start(t)
	ca := newTestCA(t)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	writeFile(t, caFile, ca.pem)
	var nodes []*proc
	var certFiles, keyFiles []string
	for i := range 2 {
		certPEM, keyPEM := ca.issue(t, int64(10+i))
		cf, kf := filepath.Join(dir, "node"+string(rune('a'+i))+".pem"), filepath.Join(dir, "node"+string(rune('a'+i))+"-key.pem")
		writeFile(t, cf, certPEM)
		writeFile(t, kf, keyPEM)
		certFiles, keyFiles = append(certFiles, cf), append(keyFiles, kf)
		nodes = append(nodes, startServer(t, true, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "16",
			"--tls-cert", cf, "--tls-key", kf, "--tls-client-ca", caFile, "--tls-ca", caFile, "--probe-listen", "127.0.0.1:0"))
	}
	clientCert, clientKey := ca.issue(t, 99)
	clientCertFile, clientKeyFile := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	writeFile(t, clientCertFile, clientCert)
	writeFile(t, clientKeyFile, clientKey)
	pair, err := tls.X509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	client := func(certs ...tls.Certificate) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}, DisableKeepAlives: true}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	good := client(pair)

	a := nodes[0]
	if !strings.HasPrefix(a.API, "https://127.0.0.1:") {
		t.Fatalf("node started at %q, want https", a.API)
	}
	etcdtest.WaitFor(t, 60*time.Second, func() bool {
		resp, err := good.Get(a.API + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if _, err := client().Get(a.API + "/readyz"); err == nil {
		t.Error("a client without a certificate was served")
	}
	if resp, err := http.Get("http://" + strings.TrimPrefix(a.API, "https://") + "/readyz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP was served")
		}
	}

	// The probes' own listener answers without a certificate (kubelet,
	// docker HEALTHCHECK), and serves nothing but the probes.
	probes := a.started("probes")
	if !strings.HasPrefix(probes, "http://127.0.0.1:") {
		t.Fatalf("no probe listener in the start line: %q", probes)
	}
	for path, want := range map[string]string{"/readyz": `"status":"ready"`, "/healthz": "ok", "/metrics": "shardcron_build_info"} {
		resp, err := http.Get(probes + path)
		if err != nil {
			t.Fatalf("GET %s on the probe listener: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s on the probe listener: %d %s", path, resp.StatusCode, body)
		}
	}
	if resp, err := http.Get(probes + "/v1/tasks"); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "serves only GET /healthz, /readyz and /metrics") {
			t.Errorf("GET /v1/tasks on the probe listener: %d %s", resp.StatusCode, body)
		}
	}
	if out, stderr, code := runCLI(t, "", "ready", "--server", probes); code != 0 || out != "ready\n" {
		t.Errorf("ready on the probe listener: exit %d, %q %q", code, out, stderr)
	}

	// The command line, with the CA and a client certificate, by flags or
	// by the environment; without a certificate it is refused.
	if out, stderr, code := runCLI(t, "", "ready", "--server", a.API, "--cacert", caFile, "--cert", clientCertFile, "--key", clientKeyFile); code != 0 || out != "ready\n" {
		t.Errorf("ready over mutual TLS: exit %d, %q %q", code, out, stderr)
	}
	t.Setenv("SHARDCRON_CACERT", caFile)
	if _, _, code := runCLI(t, "", "ready", "--server", a.API); code == 0 {
		t.Error("ready without a client certificate succeeded")
	}
	t.Setenv("SHARDCRON_CERT", clientCertFile)
	t.Setenv("SHARDCRON_KEY", clientKeyFile)
	if out, stderr, code := runCLI(t, "", "nodes", "--server", a.API); code != 0 || !strings.Contains(out, "https://") {
		t.Errorf("nodes over mutual TLS, files from the environment: exit %d, %q %q", code, out, stderr)
	}

	// Each node asks the other for its report over https, with its own
	// certificate as the client certificate.
	var last string
	etcdtest.WaitFor(t, 30*time.Second, func() bool {
		resp, err := good.Get(a.API + "/v1/nodes")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var ns struct {
			Nodes []struct {
				ID      string `json:"id"`
				APIAddr string `json:"api_addr"`
				Error   string `json:"error"`
			} `json:"nodes"`
		}
		if json.NewDecoder(resp.Body).Decode(&ns) != nil {
			return false
		}
		b, _ := json.Marshal(ns)
		last = string(b)
		ok := 0
		for _, n := range ns.Nodes {
			if n.Error == "" && strings.HasPrefix(n.APIAddr, "https://") {
				ok++
			}
		}
		return ok == 2
	})
	if !strings.Contains(last, "https://") {
		t.Fatalf("/v1/nodes: %s", last)
	}

	// A renewed certificate, taken at SIGHUP.
	serial := func() int64 {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(a.API, "https://"), &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}})
		if err != nil {
			return -1
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if got := serial(); got != 10 {
		t.Fatalf("serial %d before the reload, want 10", got)
	}
	certPEM, keyPEM := ca.issue(t, 42)
	writeFile(t, keyFiles[0], keyPEM)
	writeFile(t, certFiles[0], certPEM)
	if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return serial() == 42 })
	// The file watcher may take the new files first; the signal's reload
	// is logged when the node handles it.
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(a.log(), "SIGHUP: TLS certificate reloaded") })
	// Renewed again, without a signal: the node sees the files change.
	certPEM, keyPEM = ca.issue(t, 43)
	writeFile(t, keyFiles[0], keyPEM)
	writeFile(t, certFiles[0], certPEM)
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return serial() == 43 })
	for _, p := range nodes {
		if code := p.stop(); code != 0 {
			t.Errorf("SIGTERM: exit %d", code)
		}
	}
}

// TestServer_TLSFlagErrors: incomplete or unreadable TLS flags stop the
// start with a message naming the flag, printed once; or its variable,
// when it came from there: the files' errors said --tls-cert, --tls-ca
// and so on whichever way they were given.
func TestServer_TLSFlagErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	writeFile(t, bad, []byte("not a certificate"))
	ca := newTestCA(t)
	caFile, serverOnly, serverOnlyKey := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	writeFile(t, caFile, ca.pem)
	certPEM, keyPEM := ca.issueFor(t, 2, x509.ExtKeyUsageServerAuth)
	writeFile(t, serverOnly, certPEM)
	writeFile(t, serverOnlyKey, keyPEM)
	none := filepath.Join(dir, "none.pem")
	both, bothKey := filepath.Join(dir, "both.pem"), filepath.Join(dir, "both-key.pem") // serverAuth and clientAuth
	certPEM, keyPEM = ca.issue(t, 3)
	writeFile(t, both, certPEM)
	writeFile(t, bothKey, keyPEM)
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--tls-cert", bad}, nil, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-client-ca", bad}, nil, "--tls-client-ca needs --tls-cert"},
		{[]string{"--tls-cert", bad, "--tls-key", bad}, nil, "--tls-cert " + bad + ", --tls-key " + bad + ": "},
		{[]string{"--tls-cert", bad}, map[string]string{"SHARDCRON_TLS_KEY": bad}, "--tls-cert " + bad + ", SHARDCRON_TLS_KEY " + bad + ": "},
		{nil, map[string]string{"SHARDCRON_TLS_CERT": bad, "SHARDCRON_TLS_KEY": bad}, "SHARDCRON_TLS_CERT " + bad + ", SHARDCRON_TLS_KEY " + bad + ": "},
		{[]string{"--tls-ca", none}, nil, "--tls-ca: open " + none},
		{nil, map[string]string{"SHARDCRON_TLS_CA": none}, "SHARDCRON_TLS_CA: open " + none},
		{[]string{"--etcd-cacert", none}, nil, "check --etcd-cacert, --etcd-cert and --etcd-key"},
		{nil, map[string]string{"SHARDCRON_ETCD_CACERT": none}, "check SHARDCRON_ETCD_CACERT, --etcd-cert and --etcd-key"},
		{[]string{"--tls-cert", serverOnly, "--tls-key", serverOnlyKey, "--tls-client-ca", caFile}, nil,
			"--tls-cert " + serverOnly + ": its extended key usage lacks client authentication (clientAuth), which --tls-client-ca needs"},
		{[]string{"--tls-cert", serverOnly, "--tls-key", serverOnlyKey}, map[string]string{"SHARDCRON_TLS_CLIENT_CA": caFile},
			"--tls-cert " + serverOnly + ": its extended key usage lacks client authentication (clientAuth), which SHARDCRON_TLS_CLIENT_CA needs"},
		{[]string{"--tls-cert", both, "--tls-key", bothKey, "--tls-client-ca", none}, nil, "--tls-client-ca: open " + none},
		{[]string{"--tls-cert", both, "--tls-key", bothKey}, map[string]string{"SHARDCRON_TLS_CLIENT_CA": bad},
			"SHARDCRON_TLS_CLIENT_CA " + bad + ": no PEM certificate in it"},
	} {
		t.Run(c.want, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			_, stderr, code := runCLI(t, "", append([]string{"server", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--etcd", "http://127.0.0.1:1", "--start-timeout", "1s"}, c.args...)...)
			if code == 0 || !strings.Contains(stderr, c.want) {
				t.Errorf("%v %v: exit %d, stderr %q; want %q", c.env, c.args, code, stderr, c.want)
			}
			// The error is printed once, not logged as well.
			if n := strings.Count(stderr, c.want); n > 1 {
				t.Errorf("%v %v: %q printed %d times:\n%s", c.env, c.args, c.want, n, stderr)
			}
		})
	}
}

// With --tls-client-ca the node presents its --tls-cert to the other nodes:
// a certificate whose extended key usage excludes clientAuth is refused at
// start, and at a reload, which keeps the previous certificate (SIGHUP
// logs why). Without --tls-client-ca it serves as it is.
func TestTLSFiles_ClientAuthUsage(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeFile(t, caFile, ca.pem)
	write := func(serial int64, usages ...x509.ExtKeyUsage) {
		certPEM, keyPEM := ca.issueFor(t, serial, usages...)
		writeFile(t, keyFile, keyPEM)
		writeFile(t, certFile, certPEM)
	}
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for _, c := range []struct {
		usages []x509.ExtKeyUsage
		ok     bool
	}{
		{nil, true},
		{[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, true},
		{[]x509.ExtKeyUsage{x509.ExtKeyUsageAny}, true},
		{[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, false},
		{[]x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}, false},
	} {
		write(1, c.usages...)
		_, err := loadTLS(certFile, keyFile, caFile, nil, log)
		if (err == nil) != c.ok || err != nil && !strings.Contains(err.Error(), "--tls-cert "+certFile) {
			t.Errorf("usages %v with --tls-client-ca: %v, want ok=%v and an error naming --tls-cert", c.usages, err, c.ok)
		}
		if _, err := loadTLS(certFile, keyFile, "", nil, log); err != nil {
			t.Errorf("usages %v without --tls-client-ca: %v", c.usages, err)
		}
	}

	write(7, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	tf, err := loadTLS(certFile, keyFile, caFile, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	serial := func() int64 {
		tf.mu.RLock()
		defer tf.mu.RUnlock()
		return tf.cert.Leaf.SerialNumber.Int64()
	}
	write(8, x509.ExtKeyUsageServerAuth)
	failSIGHUP(t, tf, log, &logs)
	if !strings.Contains(logs.String(), "clientAuth") {
		t.Errorf("the SIGHUP error does not say why:\n%s", logs.String())
	}
	if got := serial(); got != 7 {
		t.Errorf("serial %d after a refused reload, want the previous certificate's, 7", got)
	}
}

// A reload at SIGHUP that fails names the files as they were given, as
// the start does: it said --tls-cert and --tls-key of files given by
// SHARDCRON_TLS_CERT and SHARDCRON_TLS_KEY.
func TestTLSFiles_ReloadErrorNamedAsGiven(t *testing.T) {
	ca := newTestCA(t)
	for _, c := range []struct {
		given envFlags
		want  string // before the files' names
	}{
		{nil, "--tls-cert %s, --tls-key %s: "},
		{envFlags{"tls-cert": true, "tls-key": true}, "SHARDCRON_TLS_CERT %s, SHARDCRON_TLS_KEY %s: "},
	} {
		dir := t.TempDir()
		certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		certPEM, keyPEM := ca.issue(t, 1)
		writeFile(t, certFile, certPEM)
		writeFile(t, keyFile, keyPEM)
		var logs logbuf.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		tf, err := loadTLS(certFile, keyFile, "", c.given, log)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, certFile, []byte("not a certificate"))
		failSIGHUP(t, tf, log, &logs)
		if want := fmt.Sprintf(c.want, certFile, keyFile); !strings.Contains(logs.String(), want) {
			t.Errorf("given %v: the SIGHUP error does not name the files so, %q:\n%s", c.given, want, logs.String())
		}
	}
}

// failSIGHUP sends tf one SIGHUP through watchSIGHUP and returns once the
// reload's failure is logged in logs.
func failSIGHUP(t *testing.T, tf *tlsFiles, log *slog.Logger, logs *logbuf.Buffer) {
	t.Helper()
	hup, stop := make(chan os.Signal, 1), make(chan struct{})
	done := watchSIGHUP(hup, tf, log, stop)
	hup <- syscall.SIGHUP
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), "SIGHUP: TLS files not reloaded") })
	close(stop)
	<-done
}
