package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/store"
)

// sink is an HTTP endpoint that counts fires by idempotency key.
type sink struct {
	*httptest.Server
	mu   sync.Mutex
	keys map[string]int
	last time.Time
}

func newSink(t *testing.T) *sink {
	s := &sink{keys: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.keys[r.Header.Get("Idempotency-Key")]++
		s.last = time.Now()
		s.mu.Unlock()
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *sink) count(prefix string) (fires, dups int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, n := range s.keys {
		if strings.HasPrefix(k, prefix) {
			fires++
			if n > 1 {
				dups++
			}
		}
	}
	return fires, dups
}

// gaps returns the whole seconds from the first fire of the keys with
// prefix ("<id>@") through until that have no fire: an every-second task
// that neither skipped nor stopped has none.
func (s *sink) gaps(prefix string, until time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[int64]bool{}
	first := int64(math.MaxInt64)
	for k := range s.keys {
		if ms, ok := strings.CutPrefix(k, prefix); ok {
			at, err := strconv.ParseInt(ms, 10, 64)
			if err != nil {
				return []string{"bad key " + k}
			}
			seen[at] = true
			first = min(first, at)
		}
	}
	var out []string
	for at := first; at <= until.UnixMilli(); at += 1000 {
		if !seen[at] {
			out = append(out, time.UnixMilli(at).UTC().Format(time.TimeOnly))
		}
	}
	return out
}

// putEverySecond puts task id, every second to s, through the node at api
// and waits for its first two fires.
func (s *sink) putEverySecond(t *testing.T, api, id string) {
	t.Helper()
	putTaskHTTP(t, api, id, map[string]any{
		"schedule": "* * * * * *", "executor": map[string]any{"type": "http", "url": s.URL},
	})
	etcdtest.WaitFor(t, 20*time.Second, func() bool { n, _ := s.count(id + "@"); return n >= 2 })
}

func putTaskHTTP(t *testing.T, api, id string, task map[string]any) {
	t.Helper()
	b, _ := json.Marshal(task)
	req, _ := http.NewRequest(http.MethodPut, api+"/v1/tasks/"+id, bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("PUT %s: %d %s", id, resp.StatusCode, body)
	}
}

func TestServer_FiresSurvivesRestartAndStopsOnSIGTERM(t *testing.T) {
	dir := t.TempDir()
	s := newSink(t)
	// The restart takes seconds of real time on a loaded machine: a
	// misfire threshold far above it has every missed second caught up.
	p := startServer(t, true, "--data-dir", dir, "--partitions", "16", "--misfire-threshold", "1m")
	p.waitReady(t)
	s.putEverySecond(t, p.API, "e2e-every-second")
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit code %d, want 0\n%s", code, p.log())
	}
	before, _ := s.count("e2e-every-second@")
	// Two seconds in which no node runs: the restarted node catches them up.
	stopped := time.Now()
	etcdtest.WaitFor(t, 10*time.Second, func() bool { return time.Since(stopped) > 2*time.Second })

	// The same data dir (and so the same embedded etcd) keeps the task.
	p2 := startServer(t, true, "--data-dir", dir, "--partitions", "16", "--misfire-threshold", "1m")
	p2.waitReady(t)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { n, _ := s.count("e2e-every-second@"); return n >= before+2 })
	// Every fire up to two seconds before the stop has been delivered by
	// the time a graceful stop returns.
	end := time.Now().Truncate(time.Second).Add(-2 * time.Second)
	if code := p2.stop(); code != 0 {
		t.Fatalf("second SIGTERM: exit code %d", code)
	}
	if _, dups := s.count("e2e-every-second@"); dups > 0 {
		t.Errorf("%d fires were delivered twice across a graceful restart", dups)
	}
	if g := s.gaps("e2e-every-second@", end); len(g) > 0 {
		t.Errorf("fires missing across a graceful restart, at %v", g)
	}
}

func TestServer_StartupErrors(t *testing.T) {
	t.Run("data dir locked", func(t *testing.T) {
		dir := t.TempDir()
		c := etcdtest.Start(t)
		startServer(t, true, "--data-dir", dir, "--etcd", c.Endpoints[0], "--partitions", "16")
		p := startServer(t, false, "--data-dir", dir, "--etcd", c.Endpoints[0], "--partitions", "16")
		if code := p.waitExit(30 * time.Second); code == 0 {
			t.Fatal("second server on a locked data dir exited 0")
		}
		if !strings.Contains(p.log(), "in use by another process") {
			t.Fatalf("no clear error:\n%s", p.log())
		}
	})
	t.Run("data dir cannot be created", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		p := startServer(t, false, "--data-dir", filepath.Join(file, "data"))
		if code := p.waitExit(30 * time.Second); code == 0 {
			t.Fatal("exited 0 with a data directory under a file")
		}
		// It said "data directory: mkdir <file>: not a directory" alone.
		if log := p.log(); !strings.Contains(log, "cannot create data directory "+filepath.Join(file, "data")) ||
			!strings.Contains(log, "mkdir "+file+": not a directory") || !strings.Contains(log, "choose another directory") {
			t.Fatalf("no clear error:\n%s", log)
		}
	})
	t.Run("etcd unreachable", func(t *testing.T) {
		addr := etcdtest.RefusedAddr(t) // a port nobody answers on
		parent := t.TempDir()
		p := startServer(t, false, "--data-dir", filepath.Join(parent, "new", "data"), "--etcd", "http://"+addr, "--start-timeout", "3s")
		if code := p.waitExit(30 * time.Second); code == 0 {
			t.Fatal("exited 0 without etcd")
		}
		if left, _ := os.ReadDir(parent); len(left) > 0 {
			t.Errorf("the failed start left %s in the data directory's parent", left[0].Name())
		}
		log := p.log()
		if !strings.Contains(log, "waiting for etcd") || !strings.Contains(log, "is unreachable (--start-timeout 3s passed)") ||
			!strings.Contains(log, "connection refused") || !strings.Contains(log, "check --etcd") {
			t.Fatalf("no retry log or no clear error:\n%s", log)
		}
	})
	// A port taken for --listen or --probe-listen says which flag chooses
	// another, as the embedded etcd's ports do: it said only "bind: address
	// already in use". One from the environment is named by its variable:
	// it said --listen, which the command line did not give.
	t.Run("API port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		taken := ln.Addr().String()
		for _, tc := range []struct {
			named string   // the flag or variable that gives the taken port
			args  []string // the rest of the command line
		}{
			{"--listen", nil},
			{"--probe-listen", []string{"--listen", "127.0.0.1:0"}},
			{"SHARDCRON_LISTEN", nil},
			{"SHARDCRON_PROBE_LISTEN", []string{"--listen", "127.0.0.1:0"}},
		} {
			t.Run(tc.named, func(t *testing.T) {
				parent := t.TempDir()
				args := append([]string{"server", "--data-dir", filepath.Join(parent, "data")}, tc.args...)
				if strings.HasPrefix(tc.named, "--") {
					args = append(args, tc.named, taken)
				} else {
					t.Setenv(tc.named, taken)
				}
				_, stderr, code := runCLI(t, "", args...)
				if code != 1 {
					t.Fatalf("exit %d, want 1: %s", code, stderr)
				}
				if left, _ := os.ReadDir(parent); len(left) > 0 {
					t.Errorf("the failed start left %s", left[0].Name())
				}
				if last := lastError(stderr); !strings.HasPrefix(last, "shardcron server: "+tc.named+" "+taken+": ") ||
					!strings.Contains(last, "address already in use") || !strings.Contains(last, "choose a free port with "+tc.named+")") {
					t.Errorf("no clear error: %s", last)
				}
			})
		}
	})
	t.Run("embedded etcd port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		dir := t.TempDir() // exists: the start makes cache and etcd in it
		keep := filepath.Join(dir, "keep")
		if err := os.WriteFile(keep, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		// The flag, then its variable, which the error names instead:
		// it said --etcd-listen, which the command line did not give.
		for _, tc := range []struct {
			env   []string
			args  []string
			named string
		}{
			{nil, []string{"--etcd-listen", ln.Addr().String()}, "choose free ports with --etcd-listen and --etcd-peer-listen,"},
			{[]string{"SHARDCRON_ETCD_LISTEN=" + ln.Addr().String()}, nil, "choose free ports with SHARDCRON_ETCD_LISTEN and --etcd-peer-listen,"},
		} {
			p := startServerEnv(t, tc.env, false, append([]string{"--data-dir", dir, "--etcd-peer-listen", "127.0.0.1:0"}, tc.args...)...)
			if code := p.waitExit(30 * time.Second); code == 0 {
				t.Fatal("exited 0 with the embedded etcd's port taken")
			}
			if left, _ := os.ReadDir(dir); len(left) != 1 || left[0].Name() != "keep" {
				t.Errorf("the failed start left the data directory holding %v, want only the file it held before", left)
			}
			if last := lastError(p.log()); !strings.Contains(last, "address already in use") || !strings.Contains(last, tc.named) {
				t.Errorf("no clear error, want %q:\n%s", tc.named, p.log())
			}
		}
	})
	t.Run("embedded etcd quota", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		for _, tc := range []struct {
			args []string
			want string
		}{
			{nil, "etcd_server_quota_backend_bytes 8.589934592e+09"}, // the default, 8 GiB
			{[]string{"--etcd-quota", "3GiB"}, "etcd_server_quota_backend_bytes 3.221225472e+09"},
		} {
			args := append([]string{"--data-dir", t.TempDir(), "--etcd-listen", addr, "--etcd-peer-listen", "127.0.0.1:0"}, tc.args...)
			p := startServer(t, true, args...)
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), tc.want) {
				t.Errorf("%v: the embedded etcd's metrics lack %q", tc.args, tc.want)
			}
			p.stop()
		}
	})
	t.Run("partitions mismatch", func(t *testing.T) {
		c := etcdtest.Start(t)
		p := startServer(t, true, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "16")
		p.stop()
		p2 := startServer(t, false, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "32")
		if code := p2.waitExit(30 * time.Second); code == 0 {
			t.Fatal("exited 0 with another partition count")
		}
		if !strings.Contains(p2.log(), "has 16 partitions, this node was started with 32") {
			t.Fatalf("no clear error:\n%s", p2.log())
		}
	})
	t.Run("duplicate node id", func(t *testing.T) {
		c := etcdtest.Start(t)
		startServer(t, true, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "16", "--node-id", "twin")
		p := startServer(t, false, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "16", "--node-id", "twin")
		if code := p.waitExit(60 * time.Second); code == 0 {
			t.Fatal("a second node with a live node's id exited 0")
		}
		if !strings.Contains(p.log(), `node id "twin" is held by a live node: give this node another --node-id`) {
			t.Fatalf("no clear error:\n%s", p.log())
		}
		// An id from the environment is named by its variable: it said
		// --node-id, which the command line did not give.
		p = startServerEnv(t, []string{"SHARDCRON_NODE_ID=twin"}, false, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "16")
		if code := p.waitExit(60 * time.Second); code == 0 {
			t.Fatal("a second node with a live node's id exited 0")
		}
		if !strings.Contains(p.log(), `node id "twin" is held by a live node: give this node another SHARDCRON_NODE_ID`) {
			t.Fatalf("no clear error:\n%s", p.log())
		}
	})
	// The join, which waits out the lease of a crashed node of the same
	// id, is bounded by the start's one deadline, as the wait for etcd
	// before it, and its error says so: it had a --start-timeout of its
	// own, after the others', and said only "context deadline exceeded".
	// It names the flags to mend: a --start-timeout under --lease-ttl
	// cannot outwait a crashed node's lease (not a usage error: it fails
	// only a start that follows a crash).
	// A --start-timeout from the environment is named by its variable,
	// as a refused value is: it said --start-timeout.
	t.Run("join past the start timeout", func(t *testing.T) {
		c := etcdtest.Start(t)
		holdNodeID(t, c.Client, "held", 600)
		for _, tc := range []struct {
			env   []string
			args  []string
			given string
		}{
			{nil, []string{"--start-timeout", "2s"}, "--start-timeout"},
			{[]string{"SHARDCRON_START_TIMEOUT=2s"}, nil, "SHARDCRON_START_TIMEOUT"},
		} {
			p := startServerEnv(t, tc.env, false, append([]string{"--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "4", "--node-id", "held"}, tc.args...)...)
			if code := p.waitExit(60 * time.Second); code != 1 {
				t.Fatalf("exit %d, want 1\n%s", code, p.log())
			}
			last := lastError(p.log())
			for _, w := range []string{"to be released: context deadline exceeded (" + tc.given + " 2s passed before the lease",
				"--lease-ttl, 2s here", "give " + tc.given + " more than --lease-ttl"} {
				if !strings.Contains(last, w) {
					t.Errorf("error %q does not contain %q", last, w)
				}
			}
		}
	})
	t.Run("bad flags", func(t *testing.T) {
		for _, args := range [][]string{
			{"--history", "sometimes"},
			{"--history-success-limit", "101"},
			{"--history-failure-limit", "-1"},
			{"--history-ttl", "500ms"}, // Badger expires in whole seconds: the store refuses it
			{"--log-format", "xml"},
			{"--partitions", "0"},
			{"--partitions", "65536"}, // past engine.MaxPartitions
			{"--workers", "-1"},
			{"--queue", "100", "--batch", "200"}, // a batch larger than the queue
			{"--stage", "0"},
			// Past their bounds: refused before etcd is dialed (unreachable
			// here, so that a node that would start exits 1, not out of
			// memory).
			{"--workers", "100000000", "--etcd", "http://127.0.0.1:1", "--start-timeout", "1s"},
			{"--queue", "1000000000", "--etcd", "http://127.0.0.1:1", "--start-timeout", "1s"},
			{"--stage", "99999999999999", "--etcd", "http://127.0.0.1:1", "--start-timeout", "1s"},
			{"--lease-ttl", "1500ms"}, // under etcd's 2 s minimum
			{"--lease-ttl", "2500ms"}, // not whole seconds
			{"--load", "1"},
			{"--load", "NaN"},
			{"--load", "+Inf"},
			{"--replication", "100000"},
			{"--tick", "1ns"},
			{"--tick", "1h"},
			{"--tick", "500ms"}, // past the watermark interval
			{"--tick", "10ms", "--misfire-threshold", "1ms"},
			{"--lead", "100ms"}, // dispatch would stall between watermark writes
			{"--lead", "2m"},
			{"--etcd-quota", "lots"},
			{"--etcd-quota", "64"}, // 64 bytes: the unit left out
			{"--etcd-quota", "1GiB", "--etcd", "http://127.0.0.1:1"}, // sizes the embedded etcd only
			{"--etcd", ","}, // names no endpoint: not the embedded etcd
			{"--etcd", " "},
			{"--etcd", "not a url"},
			{"--etcd", "http://"},
			{"--etcd", "ftp://127.0.0.1:2379"},
			{"--etcd", "http://127.0.0.1:99999"},
			{"--etcd", "127.0.0.1"}, // no port
			{"--listen", "127.0.0.1:99999"},
			{"--listen", "nohost"},
			{"--listen", ""},
			{"--probe-listen", "127.0.0.1:-1"},
			{"--etcd-listen", "127.0.0.1"},
			{"--etcd-peer-listen", "127.0.0.1:65536"},
			{"--etcd-prefix", "shardcron"}, // not /shardcron: another, empty cluster
			{"--etcd-prefix", ""},
			{"--node-id", "n1/x"},
			{"--node-id", "n 1"},
			{"--advertise", "nonsense"},
			{"--advertise", "127.0.0.1:0"},
			{"--data-dir", ""},
			{"extra"},
			{"--partitions", "abc"}, // the flag package's own error
			{"--no-such-flag"},
		} {
			// A usage error exits 2 at once, before it listens or opens
			// anything.
			all := append([]string{"server", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, args...)
			_, stderr, code := runCLI(t, "", all...)
			if code != 2 || stderr == "" {
				t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
			}
			if lines := strings.Count(stderr, "\n"); lines != 1 { // the reason, not the help after it
				t.Errorf("%v: %d lines on stderr, want 1:\n%s", args, lines, stderr)
			}
		}
		for _, tc := range []struct{ args, want string }{
			{"--data-dir=", "shardcron server: --data-dir is empty: give a directory, or leave it out for the default\n"},
			// as every other usage error says where to look
			{"extra", "shardcron server: unexpected argument \"extra\" (see shardcron server --help)\n"},
			{"--listen=127.0.0.1:99999", `shardcron server: --listen: "127.0.0.1:99999" is not an address to listen on`},
			{"--etcd-prefix=shardcron", `shardcron server: --etcd-prefix: "shardcron" must start with '/'`},
			{"--node-id=n1/x", `shardcron server: --node-id: "n1/x" contains '/'`},
			{"--advertise=nonsense", `shardcron server: --advertise: "nonsense" is not an address other nodes can reach`},
		} {
			if _, stderr, _ := runCLI(t, "", "server", tc.args); !strings.HasPrefix(stderr, tc.want) {
				t.Errorf("%s: stderr %q, want %q", tc.args, stderr, tc.want)
			}
		}
		// A --queue below --batch's default is no usage error: the batch
		// follows the queue unless given. (etcd is unreachable here: the
		// start fails later, with 1.)
		_, stderr, code := runCLI(t, "", "server", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--queue", "100",
			"--etcd", "http://127.0.0.1:1", "--start-timeout", "1s")
		if code == 2 || strings.Contains(stderr, "--batch") {
			t.Errorf("--queue 100 alone: exit %d, stderr %q", code, stderr)
		}
	})
}

// A node stopped while it waits for etcd, before it started, exits 0 as a
// node stopped after it started does: it was asked to stop. It exited 1
// with "context canceled", which a supervisor reads as a failure.
func TestServer_StopDuringStartExitsZero(t *testing.T) {
	p := startServer(t, false, "--data-dir", t.TempDir(), "--etcd", "http://127.0.0.1:1") // nothing listens on port 1
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(p.log(), "waiting for etcd") })
	if code := p.stop(); code != 0 || strings.Contains(p.log(), "context canceled") || !strings.Contains(p.log(), "stopped during its start") {
		t.Fatalf("SIGTERM while waiting for etcd: exit %d, want 0 without an error, logged\n%s", code, p.log())
	}
	// So does one stopped while it waits for the lease of a crashed node
	// of its id: it exited 0 with nothing logged.
	c := etcdtest.Start(t)
	holdNodeID(t, c.Client, "reborn", 30)
	p = startServer(t, false, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "4", "--node-id", "reborn")
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(p.log(), "node id is held by another lease") })
	// The JSON log writes the wait as the text log does, "31s": it was
	// "wait":31000000000, nanoseconds, as every duration of a JSON line.
	if w := p.logged("membership: node id is held by another lease; waiting for it to expire", "wait"); w == "" {
		t.Errorf("the wait for the old lease is not logged as a duration string\n%s", p.log())
	} else if _, err := time.ParseDuration(w); err != nil {
		t.Errorf("the wait for the old lease: %v", err)
	}
	if code := p.stop(); code != 0 || !strings.Contains(p.log(), "stopped during its start") {
		t.Fatalf("SIGTERM while waiting for a crashed node's lease: exit %d, want 0, logged\n%s", code, p.log())
	}
}

// The open probes of a starting node say what it waits for, not where
// etcd is: the started node's open answers name no address, and the log
// has the endpoints for the operator.
func TestServer_StartingNamesNoEtcdEndpoint(t *testing.T) {
	p := startServer(t, false, "--data-dir", t.TempDir(), "--etcd", "http://127.0.0.1:1", "--probe-listen", "127.0.0.1:0") // nothing listens on port 1
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(p.log(), "waiting for etcd") })
	probes := p.logged("shardcron node starting: the API answers 503 until it has started", "probes")
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(probes + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "waiting for etcd") || strings.Contains(string(body), "127.0.0.1:1") {
			t.Errorf("%s while waiting for etcd: %s, want the wait without the endpoint", path, body)
		}
	}
	if code := p.stop(); code != 0 {
		t.Errorf("SIGTERM while waiting for etcd: exit %d", code)
	}
}

// holdNodeID writes the node key of id as a crashed node of that id left
// it, held by a lease of ttl seconds, and returns the lease.
func holdNodeID(t *testing.T, cli *clientv3.Client, id string, ttl int64) clientv3.LeaseID {
	t.Helper()
	lease, err := cli.Grant(t.Context(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), "/shardcron/nodes/"+id, "{}", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	return lease.ID
}

// A node answers its probes while it starts: /healthz 200, /readyz 503
// saying what it waits for, the API 503 with Retry-After. After a kill -9
// a node restarted with its id waits up to the lease TTL for its old
// session's lease, and nothing answered then: a liveness probe timed out
// and had the node restarted again.
func TestServer_AnswersWhileStarting(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := t.Context()
	// The lease of a crashed node of the same id, kept alive until the
	// answers are checked.
	lease := holdNodeID(t, c.Client, "reborn", 5)
	alive, err := c.Client.KeepAlive(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range alive {
		}
	}()
	p := startServer(t, false, "--data-dir", t.TempDir(), "--etcd", c.Endpoints[0], "--partitions", "4",
		"--node-id", "reborn", "--probe-listen", "127.0.0.1:0")
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(p.log(), "node id is held by another lease") })
	api := p.logged("shardcron node starting: the API answers 503 until it has started", "api")
	if api == "" {
		t.Fatalf("no starting log line with the API address\n%s", p.log())
	}
	probes := p.logged("shardcron node starting: the API answers 503 until it has started", "probes")
	get := func(url string) (int, http.Header, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s while starting: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body)
	}
	for _, base := range []string{api, probes} {
		if code, _, body := get(base + "/healthz"); code != http.StatusOK || !strings.Contains(body, `"status":"starting"`) {
			t.Errorf("%s/healthz while starting: %d %s, want 200 starting", base, code, body)
		}
		if code, _, body := get(base + "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "joining the cluster") {
			t.Errorf("%s/readyz while starting: %d %s, want 503 naming the wait", base, code, body)
		}
	}
	if code, h, body := get(api + "/v1/tasks"); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(body, `"error":"the node is starting`) {
		t.Errorf("/v1/tasks while starting: %d %v %s, want 503 with Retry-After", code, h, body)
	}
	if code, _, _ := get(probes + "/v1/tasks"); code != http.StatusNotFound {
		t.Errorf("the probe listener served /v1/tasks while starting: %d, want 404", code)
	}

	if _, err := c.Client.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	p.API = api
	p.waitReady(t)
	if code, _, body := get(api + "/healthz"); code != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/healthz once started: %d %s", code, body)
	}
}

// A node whose embedded etcd never becomes ready gives up after
// --start-timeout with exit 1 and says why, and a SIGTERM during that wait
// stops it with exit 0. It hung in etcd's Close, deaf to both.
//
// The etcd is made so by a write-ahead log cut short: it replays fewer
// entries than its database holds, and its member's publish, proposed at
// an index the database already applied, is skipped as applied; each of
// its retries (every 7 s) moves one index on, so the 300 puts here keep
// it from serving for half an hour.
func TestServer_EtcdNeverReady(t *testing.T) {
	dir := t.TempDir()
	p := startServer(t, true, "--data-dir", filepath.Join(dir, "node"), "--partitions", "4")
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.logged("started the embedded etcd", "endpoint")}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if _, err := cli.Put(t.Context(), fmt.Sprintf("/filler/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	cli.Close()
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d\n%s", code, p.log())
	}
	// damaged returns a copy of the stopped node's directory with its
	// write-ahead log cut to 1000 bytes.
	damaged := func(t *testing.T) string {
		d := filepath.Join(t.TempDir(), "node")
		if out, err := exec.Command("cp", "-a", filepath.Join(dir, "node"), d).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		if err := os.Truncate(filepath.Join(d, "etcd", "member", "wal", "0000000000000000-0000000000000000.wal"), 1000); err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Run("start timeout", func(t *testing.T) {
		p := startServer(t, false, "--data-dir", damaged(t), "--start-timeout", "3s")
		if code := p.waitExit(60 * time.Second); code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		if !strings.Contains(p.log(), "did not become ready: --start-timeout 3s passed") {
			t.Fatalf("no clear error:\n%s", p.log())
		}
	})
	t.Run("SIGTERM", func(t *testing.T) {
		p := startServer(t, false, "--data-dir", damaged(t), "--start-timeout", "10m")
		etcdtest.WaitFor(t, 60*time.Second, func() bool { return strings.Contains(p.log(), "failed to publish local member") })
		if code := p.stop(); code != 0 {
			t.Fatalf("SIGTERM while the embedded etcd starts: exit %d, want 0\n%s", code, p.log())
		}
	})
}

// A SIGHUP to a node without TLS is logged and ignored: the node keeps
// serving and stops cleanly later. It killed the node (exit 129), with no
// hand-over: only a node with --tls-cert caught SIGHUP.
func TestServer_SIGHUPWithoutTLSIsIgnored(t *testing.T) {
	p := startServer(t, true, "--data-dir", t.TempDir(), "--partitions", "4")
	p.waitReady(t)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(p.log(), "SIGHUP: nothing to reload") })
	p.waitReady(t)
	if code := p.stop(); code != 0 || !strings.Contains(p.log(), "shardcron node stopped") {
		t.Fatalf("SIGTERM after a SIGHUP: exit %d, want 0 after a clean stop\n%s", code, p.log())
	}
}

// A node's last line says what its process fired and misfired in all:
// /metrics stops answering with the API, before the drain's last fires,
// whose misfires a reader of it (the cluster tests' count) never saw.
func TestServer_StoppedLineSaysTheTotals(t *testing.T) {
	p := startServer(t, true, "--data-dir", t.TempDir(), "--partitions", "4")
	p.waitReady(t)
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d, want 0\n%s", code, p.log())
	}
	for line := range strings.Lines(p.log()) {
		if strings.Contains(line, `"msg":"shardcron node stopped"`) {
			if !strings.Contains(line, `"fires":0,"misfires":0`) {
				t.Fatalf("the stopped line lacks the totals: %s", line)
			}
			return
		}
	}
	t.Fatalf("no stopped line:\n%s", p.log())
}

// A second SIGTERM during the stop cuts the drain short: the execution
// still running is canceled (its request's context ends) and the node
// exits 0 without waiting out --drain-timeout. The second signal was
// ignored, and the node waited the whole drain.
func TestServer_SecondSignalCutsTheDrain(t *testing.T) {
	started, canceled := make(chan struct{}, 1), make(chan struct{}, 1)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-r.Context().Done() // answers never: the execution runs until canceled
		select {
		case canceled <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(hook.Close) // after the node's: Close waits for the request the node holds
	p := startServer(t, true, "--data-dir", t.TempDir(), "--partitions", "4", "--drain-timeout", "10m")
	p.waitReady(t)
	putTaskHTTP(t, p.API, "slow", map[string]any{
		"schedule": "* * * * * *", "timeout": "1h", "concurrency": "forbid",
		"executor": map[string]any{"type": "http", "url": hook.URL},
	})
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatalf("the task never called its hook\n%s", p.log())
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(p.log(), "shutting down") })
	// The first line says why, how long the drain may take, and how to
	// cut it short: nothing else is logged while it waits.
	if want := `a second signal cuts the waits short","cause":"terminated signal received","drain_timeout":"10m0s"`; !strings.Contains(p.log(), want) {
		t.Errorf("the shutdown's line does not say %s:\n%s", want, p.log())
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	select {
	case <-canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the running execution's request was not canceled")
	}
	if !strings.Contains(p.log(), "a second signal") {
		t.Errorf("the second signal is not logged:\n%s", p.log())
	}
}

// TestServer_HistoryFlagsReachStore: the history flags end up in the
// store's configuration, and out-of-range limits are refused by name.
func TestServer_HistoryFlagsReachStore(t *testing.T) {
	parse := func(args ...string) (*serverFlags, error) {
		var f serverFlags
		fs := flag.NewFlagSet("server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.register(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &f, f.check()
	}
	f, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if c := f.storeConfig(nil); c.HistorySuccessLimit != store.DefaultSuccessLimit || c.HistoryFailureLimit != store.DefaultFailureLimit ||
		c.HistoryTTL != store.DefaultHistoryTTL || c.History != store.HistoryAll {
		t.Errorf("defaults: %+v", c)
	}
	f, err = parse("--history-success-limit", "3", "--history-failure-limit", "0", "--history-ttl", "2h", "--history", "failures")
	if err != nil {
		t.Fatal(err)
	}
	c := f.storeConfig(nil)
	if c.HistorySuccessLimit != 3 || c.HistoryFailureLimit != 0 || c.HistoryTTL != 2*time.Hour || c.History != store.HistoryFailures {
		t.Errorf("flags not in the store's config: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("store config from valid flags: %v", err)
	}
	for _, args := range [][]string{{"--history-success-limit", "101"}, {"--history-failure-limit", "-1"}} {
		if _, err := parse(args...); err == nil || !strings.Contains(err.Error(), args[0]+" must be between 0 and 100") {
			t.Errorf("%v: %v", args, err)
		}
	}
	// Every value the flag check lets through, the store takes: one it
	// refuses would stop the start later, exit 1, naming a Config field.
	for _, ttl := range []string{"1ns", "500ms", "1s"} {
		f, err := parse("--history-ttl", ttl)
		if err != nil {
			if !strings.Contains(err.Error(), "--history-ttl") {
				t.Errorf("--history-ttl %s: %v, want an error naming the flag", ttl, err)
			}
			continue
		}
		if err := f.storeConfig(nil).Validate(); err != nil {
			t.Errorf("--history-ttl %s passes the flag check, but the store refuses it: %v", ttl, err)
		}
	}
}

// TestServer_DurationFlagsRefusedByName: a duration out of its range is
// refused naming that flag and the value given; one message named all
// three timeouts, whichever was wrong.
func TestServer_DurationFlagsRefusedByName(t *testing.T) {
	for _, args := range [][]string{
		{"--start-timeout", "0s"}, {"--drain-timeout", "-1s"}, {"--shutdown-timeout", "-1s"}, {"--history-ttl", "0s"},
		{"--release-run-wait", "0s"}, {"--release-run-wait", "11s"},
		// Past a day: a typo (30h for 30s) the node took without a word.
		{"--drain-timeout", "30h0m0s"}, {"--shutdown-timeout", "25h0m0s"},
	} {
		var f serverFlags
		fs := flag.NewFlagSet("server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		err := f.check()
		if err == nil || !strings.HasPrefix(err.Error(), args[0]+" must") || !strings.Contains(err.Error(), "got "+args[1]) {
			t.Errorf("%v: %v, want an error about %s that gives %s", args, err, args[0], args[1])
		}
		if strings.HasSuffix(args[0], "-timeout") && strings.HasSuffix(args[1], "h0m0s") &&
			(err == nil || !strings.Contains(err.Error(), "within 0-24h0m0s")) {
			t.Errorf("%v: %v, want the bound, 0-24h", args, err)
		}
	}
}

// TestServer_HelpExplainsFlags: --help lists every flag 'server' takes,
// and docs/api.md names each one.
func TestServer_HelpExplainsFlags(t *testing.T) {
	help, stderr, code := runCLI(t, "", "server", "--help")
	// On stdout, as every other command's help: it went to stderr, and
	// 'shardcron server --help | grep lease' found nothing.
	if code != 0 || stderr != "" {
		t.Fatalf("--help exit %d, stderr %q: want 0 and the help on stdout", code, stderr)
	}
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	var f serverFlags
	f.register(fs)
	n := 0
	fs.VisitAll(func(fl *flag.Flag) {
		n++
		// With two dashes, as docs/api.md and every other command's help
		// write them: it listed "-lease-ttl".
		if !strings.Contains(help, "\n  --"+fl.Name+" ") && !strings.Contains(help, "\n  --"+fl.Name+"\n") {
			t.Errorf("--help does not list --%s", fl.Name)
		}
		if !strings.Contains(string(doc), "`--"+fl.Name+"`") {
			t.Errorf("docs/api.md does not name the server flag --%s", fl.Name)
		}
	})
	if n < 30 {
		t.Errorf("only %d server flags registered", n)
	}
}

// TestCLI_AgainstRunningServer drives the built binary's client commands
// against a running node, as a user would.
func TestCLI_AgainstRunningServer(t *testing.T) {
	s := newSink(t)
	p := startServer(t, true, "--data-dir", t.TempDir(), "--partitions", "16", "--node-id", "cli-node")
	p.waitReady(t)
	cli := func(stdin string, args ...string) (string, string, int) {
		return runCLI(t, stdin, append(args, "--server", p.API)...)
	}
	mustOK := func(stdout, stderr string, code int) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d: %s%s", code, stdout, stderr)
		}
		return stdout
	}

	mustOK(cli("", "task", "put", "--id", "cli/every-second", "--schedule", "* * * * * *", "--url", s.URL, "--label", "team=e2e"))
	if out := mustOK(cli("", "task", "get", "cli/every-second", "--output", "json")); !strings.Contains(out, `"id": "cli/every-second"`) && !strings.Contains(out, `"id":"cli/every-second"`) {
		t.Fatalf("get --output json: %s", out)
	}
	if out := mustOK(cli("", "task", "list", "--label", "team=e2e")); !strings.Contains(out, "cli/every-second") {
		t.Fatalf("list: %s", out)
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool { n, _ := s.count("cli/every-second@"); return n >= 2 })
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		out, _, code := cli("", "task", "history", "cli/every-second")
		return code == 0 && strings.Contains(out, "ok")
	})
	mustOK(cli("", "task", "pause", "cli/every-second"))
	mustOK(cli("", "task", "resume", "cli/every-second"))
	mustOK(cli("", "task", "trigger", "cli/every-second"))

	lines := `{"id": "cli/imported-1", "schedule": "@hourly", "executor": {"type": "noop"}}
{"id": "cli/broken", "schedule": "61 * * * *", "executor": {"type": "noop"}}
{"id": "cli/imported-2", "schedule": "@daily", "executor": {"type": "noop"}}
`
	out, stderr, code := cli(lines, "import", "-", "--quiet")
	if code != 1 || !strings.Contains(stderr+out, "line 2") || !strings.Contains(out, "imported 2 tasks, 1 error") {
		t.Fatalf("import with a bad line: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	if out, _, code := cli(lines, "import", "-", "--quiet"); code != 1 || !strings.Contains(out, "imported 2 tasks") {
		t.Fatalf("importing the same lines twice: exit %d: %s", code, out)
	}
	if out := mustOK(cli("", "nodes")); !strings.Contains(out, "cli-node") {
		t.Fatalf("nodes: %s", out)
	}
	if out := mustOK(cli("", "ready")); out != "ready\n" {
		t.Fatalf("ready: %q", out)
	}
	if out := mustOK(cli("", "ready", "--output", "json")); strings.Join(strings.Fields(out), "") != `{"status":"ready"}` {
		t.Fatalf("ready --output json: %q", out)
	}
	// get | edit | put -f honours the version read: a change made in
	// between is not overwritten, unless --force.
	read := mustOK(cli("", "task", "get", "cli/every-second", "--output", "json"))
	edited := strings.Replace(read, `"paused": false`, `"paused": true`, 1)
	edited = strings.Replace(edited, `"paused":false`, `"paused":true`, 1)
	mustOK(cli("", "task", "put", "--id", "cli/every-second", "--schedule", "*/2 * * * * *", "--url", s.URL))
	if _, stderr, code := cli(edited, "task", "put", "-f", "-"); code != 1 || !strings.Contains(stderr, "changed since it was read") {
		t.Fatalf("put -f of a stale version: exit %d: %s", code, stderr)
	}
	if out := mustOK(cli("", "task", "get", "cli/every-second", "--output", "json")); !strings.Contains(out, `*/2 * * * * *`) {
		t.Fatalf("a stale put -f overwrote the change: %s", out)
	}
	mustOK(cli(edited, "task", "put", "-f", "-", "--force"))
	if _, stderr, code := cli(edited, "task", "put", "-f", "-", "--force", "--if-match", "3"); code != 2 || !strings.Contains(stderr, "--force and --if-match") {
		t.Fatalf("--force with --if-match: exit %d: %s", code, stderr)
	}
	// A task no live node can run is refused, with what to do.
	if _, stderr, code := cli("", "task", "put", "--id", "cli/exec", "--schedule", "@daily", "--command", "/bin/true"); code != 1 ||
		!strings.Contains(stderr, "no live node runs the exec executor") || !strings.Contains(stderr, "--allow-exec") {
		t.Fatalf("exec task without --allow-exec: exit %d: %s", code, stderr)
	}
	mustOK(cli("", "task", "delete", "cli/every-second"))
	if _, stderr, code := cli("", "task", "get", "cli/every-second"); code != 1 || !strings.Contains(stderr, "not found") {
		t.Fatalf("get after delete: exit %d: %s", code, stderr)
	}
	if out, _, code := runCLI(t, "", "version"); code != 0 || !strings.HasPrefix(out, "shardcron ") {
		t.Fatalf("version: exit %d: %s", code, out)
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
}

// TestServer_HistoryFlags checks that --history and --history-ttl reach the
// store: with "failures", a fire that succeeds leaves no record and one
// that fails does; with a 2 s TTL, the failures' records are gone within
// seconds once the task stops firing.
func TestServer_HistoryFlags(t *testing.T) {
	s := newSink(t)
	p := startServer(t, true, "--data-dir", t.TempDir(), "--partitions", "16", "--history", "failures", "--history-ttl", "2s")
	p.waitReady(t)
	every := func(url string) map[string]any {
		return map[string]any{"schedule": "* * * * * *", "executor": map[string]any{"type": "http", "url": url}}
	}
	putTaskHTTP(t, p.API, "hist-ok", every(s.URL))
	putTaskHTTP(t, p.API, "hist-bad", every("http://"+etcdtest.RefusedAddr(t)))
	records := func(id string) int {
		t.Helper()
		resp, err := http.Get(p.API + "/v1/tasks/" + id + "/history")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var h struct {
			Executions []json.RawMessage `json:"executions"`
		}
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&h) != nil {
			t.Fatalf("history of %s: %s", id, resp.Status)
		}
		return len(h.Executions)
	}
	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		n, _ := s.count("hist-ok@")
		return n >= 2 && records("hist-bad") > 0
	})
	if n := records("hist-ok"); n != 0 {
		t.Errorf("--history failures kept %d records of fires that succeeded", n)
	}
	req, _ := http.NewRequest(http.MethodPost, p.API+"/v1/tasks/hist-bad/pause", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	etcdtest.WaitFor(t, 15*time.Second, func() bool { return records("hist-bad") == 0 })
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
}

// TestServer_ExecOffByDefault puts an exec task on a node started without
// --allow-exec, the only live node: the PUT is refused with an error that
// names the flag, nothing is written, and the command never runs. (A node
// without --allow-exec that owns an exec task accepted because another
// node runs it fails its fires: engine's TestEngine_ExecNeedsAllowExec.)
func TestServer_ExecOffByDefault(t *testing.T) {
	p := startServer(t, true, "--data-dir", t.TempDir(), "--partitions", "16")
	p.waitReady(t)
	touch, err := exec.LookPath("touch")
	if err != nil {
		t.Skip("no touch command")
	}
	mark := filepath.Join(t.TempDir(), "ran")
	b, _ := json.Marshal(map[string]any{
		"schedule": "* * * * * *", "executor": map[string]any{"type": "exec", "command": []string{touch, mark}},
	})
	req, _ := http.NewRequest(http.MethodPut, p.API+"/v1/tasks/exec-off", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "--allow-exec") {
		t.Fatalf("PUT of an exec task with no node running --allow-exec: %d %s", resp.StatusCode, body)
	}
	if _, stderr, code := runCLI(t, "", "task", "get", "exec-off", "--server", p.API); code != 1 || !strings.Contains(stderr, "not found") {
		t.Fatalf("the refused task was written: exit %d %s", code, stderr)
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Error("the command ran on a node started without --allow-exec")
	}
}

// TestServer_CorruptCacheIsRebuilt: a node whose Badger cache was damaged
// while it was down sets the directory aside, says so in its log, reloads
// its tasks from etcd and keeps firing.
func TestServer_CorruptCacheIsRebuilt(t *testing.T) {
	dir := t.TempDir()
	s := newSink(t)
	args := []string{"--data-dir", dir, "--partitions", "16", "--misfire-threshold", "1m"}
	p := startServer(t, true, args...)
	p.waitReady(t)
	s.putEverySecond(t, p.API, "corrupt-every-second")
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit code %d\n%s", code, p.log())
	}
	cache := filepath.Join(dir, "cache")
	garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 16)
	if err := os.WriteFile(filepath.Join(cache, "MANIFEST"), garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := s.count("corrupt-every-second@")

	p2 := startServer(t, true, args...)
	p2.waitReady(t)
	etcdtest.WaitFor(t, 20*time.Second, func() bool { n, _ := s.count("corrupt-every-second@"); return n >= before+2 })
	log := p2.log()
	for _, want := range []string{"the Badger cache is corrupt", `"dir":"` + cache + `"`,
		`"moved_to":"` + cache + store.AsideSuffix + `"`, "execution history it held is lost", "lost_history_bytes"} {
		if !strings.Contains(log, want) {
			t.Fatalf("log does not contain %s:\n%s", want, log)
		}
	}
	if b, err := os.ReadFile(filepath.Join(cache+store.AsideSuffix, "MANIFEST")); err != nil || !bytes.Equal(b, garbage) {
		t.Fatalf("the corrupt directory was not kept aside: %v", err)
	}
	if code := p2.stop(); code != 0 {
		t.Fatalf("second SIGTERM: exit code %d", code)
	}
	if _, dups := s.count("corrupt-every-second@"); dups > 0 {
		t.Errorf("%d fires delivered twice across the rebuild", dups)
	}
}

// checkEndpoints takes every form of endpoint the etcd client does and
// refuses one it cannot dial.
func TestCheckEndpoints(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:2379", "etcd-0.etcd:2379", "http://127.0.0.1:2379", "https://etcd:2379/",
		"unix:etcd.sock", "unix:///run/etcd.sock", "unixs:etcd.sock", "a:1, b:2", "[::1]:2379"} {
		if err := checkEndpoints(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{",", "unix:", "unix://", "http://", "http://a", "ftp://a:1", "a", "a:0", "a:65536", ":2379", "http://a:1/path",
		"http://a:1?x=1", "http://a:1#x"} {
		if err := checkEndpoints(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// A user and password in an endpoint were taken, then ignored by the
	// etcd client, and the password printed in the error of a node that
	// could not reach etcd: they are refused, without the password.
	for _, bad := range []string{"http://root:s3cret@a:2379", "https://root:s3cret@a:2379/path", "http://root:s3cret@a:2379/%zz"} {
		err := checkEndpoints(bad)
		if err == nil || !strings.Contains(err.Error(), "--etcd-user") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v, want an error naming --etcd-user, without the password", bad, err)
		}
	}
}

func TestCheckAdvertise(t *testing.T) {
	for _, ok := range []struct {
		v   string
		tls bool
	}{{"", false}, {"127.0.0.1:8080", false}, {"node1.example.com:8080", true}, {"[::1]:8080", false},
		{"http://127.0.0.2:8080", false}, {"https://node1:443", true}, {"https://node1:8443/", true}} {
		if err := checkAdvertise(ok.v, ok.tls); err != nil {
			t.Errorf("%q (TLS %v): %v", ok.v, ok.tls, err)
		}
	}
	for _, bad := range []string{"nonsense", "127.0.0.1", "127.0.0.1:0", "a:65536", ":8080", "a:port",
		"http://", "http://a", "https://a:0", "ftp://a:21", "http://a:1/path", "http://u:p@a:1", "http://a:1?x=1",
		"https://a:1"} { // a node without TLS
		if err := checkAdvertise(bad, false); err == nil || !strings.HasPrefix(err.Error(), "--advertise: ") {
			t.Errorf("%q: %v, want an error naming --advertise", bad, err)
		}
	}
	// A node with TLS advertised as http: peers would speak plain HTTP to it.
	if err := checkAdvertise("http://127.0.0.2:8080", true); err == nil || !strings.Contains(err.Error(), "serves https") {
		t.Errorf("http with TLS: %v, want an error", err)
	}
}

// The environment's values: an empty boolean is false (systemd's
// EnvironmentFile writes SHARDCRON_ALLOW_EXEC= for an unset one); a bad
// value names its variable and what it must look like.
func TestApplyEnv(t *testing.T) {
	parse := func(env map[string]string, args ...string) (*serverFlags, error) {
		fs := flag.NewFlagSet("server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f serverFlags
		f.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		var err error
		f.fromEnv, err = applyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		return &f, err
	}
	for _, v := range []string{"", "false", "0"} {
		f, err := parse(map[string]string{"SHARDCRON_ALLOW_EXEC": v})
		if err != nil || f.allowExec {
			t.Errorf("SHARDCRON_ALLOW_EXEC=%q: allow-exec %v, %v; want false", v, f.allowExec, err)
		}
	}
	if f, err := parse(map[string]string{"SHARDCRON_ALLOW_EXEC": "true"}); err != nil || !f.allowExec {
		t.Errorf("SHARDCRON_ALLOW_EXEC=true: allow-exec %v, %v", f.allowExec, err)
	}
	if f, err := parse(map[string]string{"SHARDCRON_ALLOW_EXEC": ""}, "--allow-exec"); err != nil || !f.allowExec {
		t.Errorf("--allow-exec with SHARDCRON_ALLOW_EXEC empty: allow-exec %v, %v; the command line wins", f.allowExec, err)
	}
	for _, c := range []struct{ name, value, want string }{
		{"SHARDCRON_LEASE_TTL", "abc", `SHARDCRON_LEASE_TTL="abc": not a duration (e.g. 10s`},
		{"SHARDCRON_LEASE_TTL", "", `SHARDCRON_LEASE_TTL="": not a duration`},
		{"SHARDCRON_PARTITIONS", "many", `SHARDCRON_PARTITIONS="many": not a whole number`},
		{"SHARDCRON_LOAD", "x", `SHARDCRON_LOAD="x": not a number`},
		{"SHARDCRON_ALLOW_EXEC", "yes", `SHARDCRON_ALLOW_EXEC="yes": not a boolean (true or false`},
		{"SHARDCRON_ETCD_QUOTA", "lots", `SHARDCRON_ETCD_QUOTA="lots": not a size such as 8GiB`},
	} {
		_, err := parse(map[string]string{c.name: c.value})
		if err == nil || !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "parse error") {
			t.Errorf("%s=%q: %v, want %q", c.name, c.value, err, c.want)
		}
	}
	tokenX := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenX, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A value the flag takes but the node refuses names the variable it
	// came from, whichever flag it is: only an empty SHARDCRON_DATA_DIR
	// did, every other was reported as its flag, which the command line
	// did not give. A flag named further on is the remedy, left as it is.
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"SHARDCRON_DATA_DIR": ""}, nil, "SHARDCRON_DATA_DIR is empty: give a directory, or leave it out for the default"},
		{map[string]string{"SHARDCRON_DATA_DIR": "/x"}, []string{"--data-dir="}, "--data-dir is empty: give a directory"},
		{map[string]string{"SHARDCRON_LISTEN": "x"}, nil, `SHARDCRON_LISTEN: "x" is not an address to listen on`},
		{map[string]string{"SHARDCRON_STAGE": "0"}, nil, "SHARDCRON_STAGE must be between 1 and"},
		// A value it is checked against names that as given too: --queue,
		// which no one gave, was named for SHARDCRON_QUEUE's.
		{map[string]string{"SHARDCRON_QUEUE": "10", "SHARDCRON_BATCH": "20"}, nil, "SHARDCRON_BATCH must be between 1 and SHARDCRON_QUEUE (10), got 20"},
		{map[string]string{"SHARDCRON_QUEUE": "10"}, []string{"--batch=20"}, "--batch must be between 1 and SHARDCRON_QUEUE (10), got 20"},
		{map[string]string{"SHARDCRON_TICK": "100ms"}, []string{"--misfire-threshold=10ms"}, "--misfire-threshold must be at least SHARDCRON_TICK (100ms)"},
		{map[string]string{"SHARDCRON_AUTH_TOKEN": "x", "SHARDCRON_READ_TOKEN": "x"}, nil, "SHARDCRON_READ_TOKEN must differ from SHARDCRON_AUTH_TOKEN"},
		// An empty variable beside the secret's file: the value is the
		// file's, and was refused as SHARDCRON_READ_TOKEN's. A secret read
		// from its file is named by that flag, not by the one not given.
		{map[string]string{"SHARDCRON_AUTH_TOKEN": "x", "SHARDCRON_READ_TOKEN": ""}, []string{"--read-token-file=" + tokenX}, "--read-token-file must differ from SHARDCRON_AUTH_TOKEN"},
		{nil, []string{"--auth-token-file=" + tokenX, "--read-token=x"}, "--read-token must differ from --auth-token-file"},
		{map[string]string{"SHARDCRON_READ_TOKEN_FILE": tokenX}, []string{"--auth-token=x"}, "SHARDCRON_READ_TOKEN_FILE must differ from --auth-token"},
		{map[string]string{"SHARDCRON_TLS_CLIENT_CA": "/ca.pem"}, nil, "SHARDCRON_TLS_CLIENT_CA needs --tls-cert and --tls-key"},
		{map[string]string{"SHARDCRON_PARTITIONS": "0"}, nil, "SHARDCRON_PARTITIONS must be between 1 and"},
		{map[string]string{"SHARDCRON_HISTORY_FAILURE_LIMIT": "-1"}, nil, "SHARDCRON_HISTORY_FAILURE_LIMIT must be between 0 and"},
		// A refusal that does not open with the value it refuses names
		// that value as given too: the message was read for the flag at
		// its start, --tls-cert, which no one gave.
		{map[string]string{"SHARDCRON_TLS_KEY": "/key.pem"}, nil, "--tls-cert and SHARDCRON_TLS_KEY go together"},
		{map[string]string{"SHARDCRON_TLS_CERT": "/cert.pem"}, nil, "SHARDCRON_TLS_CERT and --tls-key go together"},
		{nil, []string{"--tls-key=/key.pem"}, "--tls-cert and --tls-key go together"},
		// --etcd from the environment is not --etcd-prefix.
		{map[string]string{"SHARDCRON_ETCD": "127.0.0.1:2379"}, []string{"--etcd-prefix=p"}, `--etcd-prefix: "p" must start with '/'`},
	} {
		f, err := parse(c.env, c.args...)
		if err != nil {
			t.Fatal(err)
		}
		if err = f.readSecrets(); err == nil {
			err = f.check()
		}
		if err != nil {
			err = f.fromEnv.asGiven(err)
		}
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v %v: %v, want %q", c.env, c.args, err, c.want)
		}
	}
	f, err := parse(map[string]string{"SHARDCRON_ETCD": "127.0.0.1:2379"}, "--etcd-quota=8GiB")
	if err != nil {
		t.Fatal(err)
	}
	f.etcdQuotaSet = true // as runServer finds it
	if err, want := f.check(), "--etcd-quota sizes the embedded etcd, which SHARDCRON_ETCD replaces"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("SHARDCRON_ETCD with --etcd-quota: %v, want %q", err, want)
	}
}

func TestServer_BadEnvIsUsageError(t *testing.T) {
	t.Setenv("SHARDCRON_LEASE_TTL", "abc")
	_, stderr, code := runCLI(t, "", "server", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	if want := "shardcron server: SHARDCRON_LEASE_TTL=\"abc\": not a duration (e.g. 10s, 1m30s)\n"; code != 2 || stderr != want {
		t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
	}
	// A secret's file is refused by the variable that named it, as a
	// value check refuses is (TestApplyEnv).
	t.Setenv("SHARDCRON_LEASE_TTL", "10s")
	t.Setenv("SHARDCRON_AUTH_TOKEN_FILE", filepath.Join(t.TempDir(), "none"))
	_, stderr, code = runCLI(t, "", "server", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	if want := "shardcron server: SHARDCRON_AUTH_TOKEN_FILE: open "; code != 2 || !strings.HasPrefix(stderr, want) {
		t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
	}
	// The logger's flags are refused as the others are: they said
	// --log-level, which the command line did not give.
	t.Setenv("SHARDCRON_AUTH_TOKEN_FILE", "") // empty: no file
	t.Setenv("SHARDCRON_LOG_LEVEL", "verbose")
	_, stderr, code = runCLI(t, "", "server", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	if want := "shardcron server: SHARDCRON_LOG_LEVEL: \"verbose\" is not debug, info, warn or error\n"; code != 2 || stderr != want {
		t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
	}
	_, stderr, code = runCLI(t, "", "server", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-level", "info", "--log-format", "xml")
	if want := "shardcron server: --log-format: \"xml\" is not text or json\n"; code != 2 || stderr != want {
		t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
	}
}

// A secret given both directly and as a file is refused naming each where
// it came from, once: the message named both variables whichever way the
// two came, and a variable set beside the other's flag twice
// (SHARDCRON_AUTH_TOKEN and --auth-token-file ... or in SHARDCRON_AUTH_TOKEN
// and SHARDCRON_AUTH_TOKEN_FILE).
func TestServer_SecretBothSetNamesWhereEachCameFrom(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token") // not read: the refusal comes first
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--auth-token", "x", "--auth-token-file", file}, "--auth-token and --auth-token-file are both set: give one"},
		{map[string]string{"SHARDCRON_AUTH_TOKEN": "x", "SHARDCRON_AUTH_TOKEN_FILE": file}, nil,
			"SHARDCRON_AUTH_TOKEN and SHARDCRON_AUTH_TOKEN_FILE are both set: give one"},
		{map[string]string{"SHARDCRON_AUTH_TOKEN": "x"}, []string{"--auth-token-file", file},
			"SHARDCRON_AUTH_TOKEN and --auth-token-file are both set: give one"},
		{map[string]string{"SHARDCRON_ETCD_PASSWORD_FILE": file}, []string{"--etcd-password", "x"},
			"--etcd-password and SHARDCRON_ETCD_PASSWORD_FILE are both set: give one"},
	} {
		t.Run(c.want, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			args := append([]string{"server", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, c.args...)
			_, stderr, code := runCLI(t, "", args...)
			if want := "shardcron server: " + c.want + "\n"; code != 2 || stderr != want {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
			}
		})
	}
}

// stopWatch is a log destination that, as the "shardcron node stopped"
// line is written (synchronously, on the node's goroutine), records which
// of paths are still locked (flock) by the node.
type stopWatch struct {
	paths []string
	mu    sync.Mutex // guards the fields below
	log   bytes.Buffer
	seen  bool
	held  []string
}

func (w *stopWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log.Write(p)
	if bytes.Contains(p, []byte(`"shardcron node stopped"`)) {
		w.seen = true
		for _, path := range w.paths {
			if flocked(path) {
				w.held = append(w.held, path)
			}
		}
	}
	return len(p), nil
}

func (w *stopWatch) logged(msg string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Contains(w.log.Bytes(), []byte(`"msg":"`+msg+`"`))
}

// flocked says whether another open file holds an exclusive flock on
// path, as the store holds its directory and bbolt etcd's database.
func flocked(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// TestServer_StoppedIsLoggedOnceTheDataDirectoryIsFree: "shardcron node
// stopped" is the node's last word, written once its cache and its
// embedded etcd are closed, not before Badger's last flush, which took
// seconds under load while the process went on after the line.
func TestServer_StoppedIsLoggedOnceTheDataDirectoryIsFree(t *testing.T) {
	dir := t.TempDir()
	var f serverFlags
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.register(fs)
	if err := fs.Parse([]string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--partitions", "16", "--lease-ttl", "2s"}); err != nil {
		t.Fatal(err)
	}
	if err := f.check(); err != nil {
		t.Fatal(err)
	}
	w := &stopWatch{paths: []string{filepath.Join(dir, "cache"), filepath.Join(dir, "etcd", "member", "snap", "db")}}
	log, err := newLogger(w, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- serve(ctx, &f, make(chan os.Signal), log) }()
	etcdtest.WaitFor(t, 60*time.Second, func() bool { return w.logged("shardcron node started") })
	for _, path := range w.paths {
		if !flocked(path) {
			t.Fatalf("%s is not locked by the running node: the check cannot tell", path)
		}
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the node did not stop within 60s")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.seen {
		t.Fatalf("no \"shardcron node stopped\" line:\n%s", w.log.String())
	}
	if len(w.held) > 0 {
		t.Errorf("\"shardcron node stopped\" was logged while the node still held %v", w.held)
	}
}

// A node whose API listens beyond loopback without a token, or on every
// interface without --advertise, says so at its start: it started
// silently, open to anyone who reached it, or advertising an address its
// peers dial as their own (a cluster's asks of the node answered by the
// asker).
func TestListenWarnings(t *testing.T) {
	for _, tc := range []struct {
		addr, advertise, token string
		want                   []string // a word of each warning, in order
	}{
		{"127.0.0.1:8080", "", "", nil},
		{"[::1]:8080", "", "", nil},
		{"[::]:8080", "", "", []string{"--advertise", "--auth-token"}},
		{"0.0.0.0:8080", "", "t", []string{"--advertise"}},
		{"0.0.0.0:8080", "node-1:8080", "", []string{"--auth-token"}},
		{"10.0.0.5:8080", "", "", []string{"--auth-token"}},
		{"10.0.0.5:8080", "", "t", nil},
	} {
		ws := listenWarnings(tc.addr, &serverFlags{advertise: tc.advertise, authToken: tc.token})
		if len(ws) != len(tc.want) {
			t.Errorf("%s, advertise %q, token %q: warnings %q, want %d", tc.addr, tc.advertise, tc.token, ws, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(ws[i], w) || !strings.Contains(ws[i], tc.addr) {
				t.Errorf("%s: warning %q does not name %s and the address", tc.addr, ws[i], w)
			}
		}
	}
}

// Each attempt to reach etcd and each pause between them ends at
// --start-timeout's deadline: checked only between them, --start-timeout
// 3s gave up after 5 s. An attempt's deadline outlived the wait (its 2 s
// from the start, the wait given up after the 1 s pause), and an attempt
// began after the deadline, the pause having outlasted it. The deadline
// is the start's, passed in, which the explanations of the failures
// share, and the error names its cause: each phase of a start had a
// --start-timeout of its own.
func TestWaitForEtcd_AttemptsAndPausesEndAtTheDeadline(t *testing.T) {
	var deadlines, explained []time.Time
	var lateStarts int
	get := func(ctx context.Context) error {
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("an attempt without a deadline")
		}
		deadlines = append(deadlines, dl)
		if ctx.Err() != nil {
			lateStarts++
		}
		return errors.New("connection refused")
	}
	explain := func(ctx context.Context, err error) error {
		dl, _ := ctx.Deadline()
		explained = append(explained, dl)
		return err
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), 10*time.Millisecond, errors.New("--start-timeout 10ms passed"))
	defer cancel()
	deadline, _ := ctx.Deadline()
	err := waitForEtcd(ctx, get, []string{"127.0.0.1:1"}, explain, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "etcd at 127.0.0.1:1 is unreachable (--start-timeout 10ms passed): connection refused") {
		t.Errorf("err = %v, want the endpoint unreachable, the deadline's cause and the attempt's error", err)
	}
	for i, dl := range deadlines {
		if dl.After(deadline) {
			t.Errorf("attempt %d's deadline is %v past the start's", i+1, dl.Sub(deadline))
		}
	}
	if lateStarts > 0 {
		t.Errorf("%d of %d attempts began after the overall deadline: a pause outlasted it", lateStarts, len(deadlines))
	}
	if len(explained) == 0 {
		t.Error("the error was not explained")
	}
	for i, dl := range explained {
		if !dl.Equal(deadline) {
			t.Errorf("explanation %d had the deadline %v, not the start's, %v", i+1, dl, deadline)
		}
	}
}
