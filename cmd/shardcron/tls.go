package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// tlsFiles serves the API's certificate and, for mutual TLS, the CA of
// client certificates, from files reloaded at SIGHUP and when they change
// (checked at most once per fileCheckInterval, at a handshake): a renewed
// certificate is taken without a restart, by new connections only.
type tlsFiles struct {
	certFile, keyFile, clientCAFile string
	given                           envFlags // the flags the environment gave: errors name the three files by their variables when it gave them
	log                             *slog.Logger

	mu       sync.RWMutex // guards cert, clientCA and stamp
	cert     *tls.Certificate
	clientCA *x509.CertPool // nil: no client certificate asked for
	stamp    string         // the files' sizes and modification times at the last load attempt

	lastCheck atomic.Int64 // unix nanoseconds of the last look at the files
}

// fileCheckInterval is how often, at most, a handshake looks whether the
// files changed: one stat per file.
const fileCheckInterval = time.Second

// loadTLS reads the files once; an error is one to stop the start with.
// given names the flags that their variables gave (serverFlags.fromEnv).
func loadTLS(certFile, keyFile, clientCAFile string, given envFlags, log *slog.Logger) (*tlsFiles, error) {
	t := &tlsFiles{certFile: certFile, keyFile: keyFile, clientCAFile: clientCAFile, given: given, log: log}
	if err := t.reload(); err != nil {
		return nil, err
	}
	t.lastCheck.Store(time.Now().UnixNano())
	return t, nil
}

// stampFiles describes the files' sizes and modification times.
func (t *tlsFiles) stampFiles() string {
	var b strings.Builder
	for _, f := range []string{t.certFile, t.keyFile, t.clientCAFile} {
		if f == "" {
			continue
		}
		if fi, err := os.Stat(f); err == nil {
			fmt.Fprintf(&b, "%d@%d;", fi.Size(), fi.ModTime().UnixNano())
		} else {
			b.WriteString("missing;")
		}
	}
	return b.String()
}

// reloadIfChanged reloads the files when they changed since the last load
// attempt; at most once per fileCheckInterval, on whichever handshake
// comes first.
func (t *tlsFiles) reloadIfChanged() {
	now := time.Now().UnixNano()
	last := t.lastCheck.Load()
	if now-last < int64(fileCheckInterval) || !t.lastCheck.CompareAndSwap(last, now) {
		return
	}
	stamp := t.stampFiles()
	t.mu.RLock()
	same := stamp == t.stamp
	t.mu.RUnlock()
	if same {
		return
	}
	if err := t.reload(); err != nil {
		t.log.Error("TLS files changed but did not load; the previous certificate stays in use", "err", err)
		return
	}
	t.log.Info("TLS certificate reloaded: its files changed", "cert", t.certFile)
}

// reload reads the files again; on error the previous certificate stays.
func (t *tlsFiles) reload() error {
	stamp := t.stampFiles()
	defer func() {
		// A failed load is not retried until the files change again.
		t.mu.Lock()
		t.stamp = stamp
		t.mu.Unlock()
	}()
	cert, err := tls.LoadX509KeyPair(t.certFile, t.keyFile)
	if err != nil {
		return fmt.Errorf("%s %s, %s %s: %w", t.given.givenAs("tls-cert"), t.certFile, t.given.givenAs("tls-key"), t.keyFile, err)
	}
	var pool *x509.CertPool
	if t.clientCAFile != "" {
		if err := t.checkClientAuth(cert.Leaf); err != nil {
			return err
		}
		if pool, err = readCAs(t.given.givenAs("tls-client-ca"), t.clientCAFile); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.cert, t.clientCA = &cert, pool
	t.mu.Unlock()
	// At each load: a renewed key may come with a mode the first had not.
	if w := looseSecretFile(t.given.givenAs("tls-key"), t.keyFile); w != "" {
		t.log.Warn(w)
	}
	return nil
}

// checkClientAuth refuses a certificate, leaf of --tls-cert, that cannot
// be a client's: under mutual TLS a node presents it to the other nodes, which
// refuse one whose extended key usage excludes client authentication
// (every call between nodes would then fail at the handshake, seen as a
// "broken pipe"). No extended key usage at all allows every use; one of
// only unknown usages allows none, as crypto/x509 verifies it.
func (t *tlsFiles) checkClientAuth(leaf *x509.Certificate) error {
	if leaf == nil || len(leaf.ExtKeyUsage) == 0 && len(leaf.UnknownExtKeyUsage) == 0 {
		return nil
	}
	for _, u := range leaf.ExtKeyUsage {
		if u == x509.ExtKeyUsageAny || u == x509.ExtKeyUsageClientAuth {
			return nil
		}
	}
	ca := t.given.givenAs("tls-client-ca")
	return fmt.Errorf("%s %s: its extended key usage lacks client authentication (clientAuth), "+
		"which %s needs: a node presents this certificate to the other nodes, and they would refuse it; "+
		"issue it with both serverAuth and clientAuth, or without %s", t.given.givenAs("tls-cert"), t.certFile, ca, ca)
}

// readCAs reads a PEM file of CA certificates; its errors name the file
// by given, its flag as the operator gave it (givenAs).
func readCAs(given, file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", given, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", given, file)
	}
	return pool, nil
}

// serverConfig is the API's TLS configuration: each handshake takes the
// certificate and client CA loaded last.
func (t *tlsFiles) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			t.reloadIfChanged()
			t.mu.RLock()
			defer t.mu.RUnlock()
			c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*t.cert},
				NextProtos: []string{"h2", "http/1.1"}}
			if t.clientCA != nil {
				c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, t.clientCA
			}
			return c, nil
		},
	}
}

// clientCertificate presents the node's own certificate to other nodes,
// which ask for one when they serve mutual TLS.
func (t *tlsFiles) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.cert, nil
}

// watchSIGHUP handles the SIGHUPs hup delivers until stop is closed: each
// reloads the TLS files when the node serves TLS (t not nil), and is only
// logged otherwise, as there is nothing to reload: a SIGHUP never stops a
// node. done is closed when it has returned.
func watchSIGHUP(hup <-chan os.Signal, t *tlsFiles, log *slog.Logger, stop <-chan struct{}) (done <-chan struct{}) {
	d := make(chan struct{})
	go func() {
		defer close(d)
		for {
			select {
			case <-stop:
				return
			case <-hup:
				if t == nil {
					log.Info("SIGHUP: nothing to reload (the node serves no TLS: --tls-cert is not set); ignored")
					continue
				}
				if err := t.reload(); err != nil {
					log.Error("SIGHUP: TLS files not reloaded; the previous certificate stays in use", "err", err)
					continue
				}
				log.Info("SIGHUP: TLS certificate reloaded", "cert", t.certFile)
			}
		}
	}()
	return d
}

// peerTLS is the TLS configuration of requests to other nodes: their
// certificates verified with caFile (the system's roots when empty), which
// caGiven names as given (givenAs), and this node's certificate presented
// when they ask for one.
func peerTLS(caFile, caGiven string, own *tlsFiles) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := readCAs(caGiven, caFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if own != nil {
		c.GetClientCertificate = own.clientCertificate
	}
	return c, nil
}

// checkTLSFlags refuses incomplete TLS flags.
func (f *serverFlags) checkTLSFlags() error {
	switch {
	case (f.tlsCert == "") != (f.tlsKey == ""):
		return errors.New(f.fromEnv.givenAs("tls-cert") + " and " + f.fromEnv.givenAs("tls-key") + " go together")
	case f.tlsClientCA != "" && f.tlsCert == "":
		return refuse("tls-client-ca", " needs --tls-cert and --tls-key: mutual TLS is TLS first")
	}
	return nil
}
