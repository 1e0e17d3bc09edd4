package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardcron/shardcron/internal/etcdtest"
)

// TestServer_EtcdTLSAndAuth runs a node against an etcd that serves only
// clients with a certificate of its CA (certificates made here) and that
// has authentication on: with --etcd-cacert, --etcd-cert, --etcd-key,
// --etcd-user and --etcd-password-file the node starts, registers and
// writes tasks; missing any of them, or with a wrong password, it exits
// non-zero with an error that says what failed, at once: no retry mends
// them.
func TestServer_EtcdTLSAndAuth(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	file := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, b)
		return p
	}
	caFile := file("ca.pem", ca.pem)
	serverCert, serverKey := ca.issue(t, 2)
	clientCert, clientKey := ca.issue(t, 3)
	other := newTestCA(t) // a CA etcd does not trust
	strangerCert, strangerKey := other.issue(t, 4)
	const password = "etcd-pass-1"
	c := etcdtest.StartCluster(t, etcdtest.Options{
		ClientTLS: &transport.TLSInfo{CertFile: file("etcd.pem", serverCert), KeyFile: file("etcd-key.pem", serverKey),
			TrustedCAFile: caFile, ClientCertAuth: true},
		RootPassword: password,
	})
	endpoint := c.Endpoints[0]
	if !strings.HasPrefix(endpoint, "https://127.0.0.1:") {
		t.Fatalf("etcd serves %s, want https", endpoint)
	}
	tlsFlags := []string{"--etcd-cacert", caFile, "--etcd-cert", file("client.pem", clientCert),
		"--etcd-key", file("client-key.pem", clientKey)}
	authFlags := []string{"--etcd-user", "root", "--etcd-password-file", file("password", []byte(password+"\n"))}
	node := func(extra ...[]string) []string {
		args := []string{"--data-dir", t.TempDir(), "--etcd", endpoint, "--partitions", "16", "--start-timeout", "5s"}
		for _, e := range extra {
			args = append(args, e...)
		}
		return args
	}

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			want []string // in the error the node exits with
		}{
			{"no TLS flags", node(authFlags), []string{"etcd at " + endpoint, "x509: certificate signed by unknown authority",
				"--etcd-cacert must name the CA"}},
			{"plain http", append(node(authFlags, tlsFlags), "--etcd", "http://"+c.Addr()),
				[]string{"etcd at http://" + c.Addr(), "it serves TLS: use an https:// endpoint"}},
			{"no client certificate", node(authFlags, []string{"--etcd-cacert", caFile}),
				[]string{"etcd at " + endpoint, "remote error: tls: certificate required", "give --etcd-cert and --etcd-key"}},
			{"certificate of another CA", node(authFlags, []string{"--etcd-cacert", caFile,
				"--etcd-cert", file("stranger.pem", strangerCert), "--etcd-key", file("stranger-key.pem", strangerKey)}),
				[]string{"etcd at " + endpoint, "remote error: tls: unknown certificate authority", "give --etcd-cert and --etcd-key"}},
			{"etcd's CA not given", node(authFlags, tlsFlags[2:]), []string{"etcd at " + endpoint,
				"x509: certificate signed by unknown authority", "--etcd-cacert must name the CA"}},
			{"no user: the certificate's", node(tlsFlags), []string{"etcd at " + endpoint, "permission denied",
				`etcd takes the user from the client certificate's common name "node"`,
				"grant that user a role with readwrite on the keys under --etcd-prefix"}},
			{"wrong password", node(tlsFlags, []string{"--etcd-user", "root", "--etcd-password-file", file("wrong", []byte("nope\n"))}),
				[]string{"etcd at " + endpoint, "authentication failed", "check --etcd-user and --etcd-password"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel() // each waits out its --start-timeout
				p := startServer(t, false, tc.args...)
				if code := p.waitExit(60 * time.Second); code == 0 {
					t.Fatalf("exited 0\n%s", p.log())
				}
				last := lastError(p.log())
				for _, w := range tc.want {
					if !strings.Contains(last, w) {
						t.Fatalf("error %q does not contain %q\n%s", last, w, p.log())
					}
				}
				// Each is what no retry mends: the node gave up at its
				// first failure, not after --start-timeout's retries.
				if strings.Contains(p.log(), `"attempt":2`) {
					t.Errorf("retried what cannot heal by waiting\n%s", p.log())
				}
				t.Logf("error: %s", last)
			})
		}
	})

	t.Run("accepted", func(t *testing.T) {
		p := startServer(t, true, node(tlsFlags, authFlags)...)
		p.waitReady(t)
		putTaskHTTP(t, p.API, "over-tls", map[string]any{"schedule": "@daily", "executor": map[string]any{"type": "noop"}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.Client.Get(ctx, "/shardcron/tasks/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || resp.Count != 1 {
			t.Fatalf("tasks in etcd: %v, %v; want 1", resp, err)
		}
		if code := p.stop(); code != 0 {
			t.Fatalf("SIGTERM: exit code %d\n%s", code, p.log())
		}
	})
}

// A node given --etcd-user waits for an etcd that does not answer yet as
// any node does, until --start-timeout, and a signal stops it meanwhile:
// it exited 1 after 5 s, the etcd client's wait for its token as it was
// made (clientv3.New), whatever --start-timeout said, and deaf to SIGTERM
// during those 5 s.
func TestServer_EtcdUserWaitsForEtcd(t *testing.T) {
	password := filepath.Join(t.TempDir(), "password")
	writeFile(t, password, []byte("pass\n"))
	p := startServer(t, false, "--data-dir", t.TempDir(), "--etcd", "http://"+etcdtest.RefusedAddr(t),
		"--etcd-user", "root", "--etcd-password-file", password, "--start-timeout", "10m")
	etcdtest.WaitFor(t, 60*time.Second, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("exited while waiting for etcd\n%s", p.log())
		default:
		}
		return strings.Contains(p.log(), `"attempt":2`)
	})
	if first := p.logged("waiting for etcd", "err"); !strings.Contains(first, "connection refused (is etcd running there? check --etcd)") {
		t.Errorf("the first warning says %q, not that etcd refuses connections", first)
	}
	if code := p.stop(); code != 0 || !strings.Contains(p.log(), "stopped during its start") {
		t.Fatalf("SIGTERM while waiting for etcd: exit %d, want 0\n%s", code, p.log())
	}
}

// lastError is the last line of a process's output that is not a JSON log
// line: the error it exited with.
func lastError(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.HasPrefix(lines[i], "{") {
			return lines[i]
		}
	}
	return ""
}

// A node whose etcd user may read and write only its cluster's keys (a
// role granted --etcd-prefix's keys, as a shared etcd grants each team
// its own) starts: the check that etcd answers read /shardcron-health,
// outside any other prefix, which etcd refused ("permission denied"),
// and the node, told to give --etcd-user, which it had, never started.
// A user refused the prefix is told its role is what to mend.
func TestServer_EtcdUserOfItsPrefixOnly(t *testing.T) {
	c := etcdtest.StartCluster(t, etcdtest.Options{RootPassword: "root-pass"})
	ctx := t.Context()
	const prefix = "/team-a/shardcron"
	for _, step := range []func() error{
		func() error { _, err := c.Client.RoleAdd(ctx, "team-a"); return err },
		func() error {
			_, err := c.Client.RoleGrantPermission(ctx, "team-a", prefix+"/", clientv3.GetPrefixRangeEnd(prefix+"/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := c.Client.UserAdd(ctx, "a", "a-pass"); return err },
		func() error { _, err := c.Client.UserGrantRole(ctx, "a", "team-a"); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	password := filepath.Join(t.TempDir(), "password")
	writeFile(t, password, []byte("a-pass\n"))
	p := startServer(t, true, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "4",
		"--etcd-prefix", prefix, "--etcd-user", "a", "--etcd-password-file", password, "--start-timeout", "20s")
	p.waitReady(t)
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d\n%s", code, p.log())
	}

	// Given another cluster's prefix, the user is refused, and the error
	// says its role is what to mend: it said to give --etcd-user.
	p = startServer(t, false, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "4",
		"--etcd-prefix", "/team-b/shardcron", "--etcd-user", "a", "--etcd-password-file", password, "--start-timeout", "1m")
	if code := p.waitExit(60 * time.Second); code != 1 {
		t.Fatalf("another team's prefix: exit %d, want 1\n%s", code, p.log())
	}
	if last := lastError(p.log()); !strings.Contains(last, `permission denied (etcd user "a" may not read this cluster's keys: grant it a role with readwrite on the keys under --etcd-prefix)`) {
		t.Errorf("another team's prefix: %s", last)
	}
}
