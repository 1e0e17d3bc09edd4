package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// tlsFiles serves the API's certificate and, for mutual TLS, the CA of
// client certificates, from files that SIGHUP reloads: a renewed
// certificate is taken without a restart, by new connections only.
type tlsFiles struct {
	certFile, keyFile, clientCAFile string

	mu       sync.RWMutex // guards cert and clientCAs
	cert     *tls.Certificate
	clientCA *x509.CertPool // nil: no client certificate asked for
}

// loadTLS reads the files once; an error is one to stop the start with.
func loadTLS(certFile, keyFile, clientCAFile string) (*tlsFiles, error) {
	t := &tlsFiles{certFile: certFile, keyFile: keyFile, clientCAFile: clientCAFile}
	if err := t.reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// reload reads the files again; on error the previous certificate stays.
func (t *tlsFiles) reload() error {
	cert, err := tls.LoadX509KeyPair(t.certFile, t.keyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert %s, --tls-key %s: %w", t.certFile, t.keyFile, err)
	}
	var pool *x509.CertPool
	if t.clientCAFile != "" {
		if pool, err = readCAs("--tls-client-ca", t.clientCAFile); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.cert, t.clientCA = &cert, pool
	t.mu.Unlock()
	return nil
}

// readCAs reads a PEM file of CA certificates.
func readCAs(flag, file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", flag, file)
	}
	return pool, nil
}

// serverConfig is the API's TLS configuration: each handshake takes the
// certificate and client CA loaded last.
func (t *tlsFiles) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
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

// watchSIGHUP reloads the files at each SIGHUP until stop is closed,
// logging the outcome; done is closed when it has returned.
func (t *tlsFiles) watchSIGHUP(stop <-chan struct{}, log *slog.Logger) (done <-chan struct{}) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	d := make(chan struct{})
	go func() {
		defer close(d)
		defer signal.Stop(hup)
		for {
			select {
			case <-stop:
				return
			case <-hup:
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
// certificates verified with caFile (the system's roots when empty), and
// this node's certificate presented when they ask for one.
func peerTLS(caFile string, own *tlsFiles) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := readCAs("--tls-ca", caFile)
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
		return errors.New("--tls-cert and --tls-key go together")
	case f.tlsClientCA != "" && f.tlsCert == "":
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first")
	}
	return nil
}
