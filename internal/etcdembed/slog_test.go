package etcdembed

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/soheilhy/cmux"
	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcderrors "go.etcd.io/etcd/server/v3/etcdserver/errors"
	"go.etcd.io/etcd/server/v3/lease"
	"go.uber.org/zap"

	"github.com/shardcron/shardcron/internal/logbuf"
	"github.com/shardcron/shardcron/internal/lograte"
)

// The server's warnings and errors reach the node's log with their fields;
// its info lines do not.
func TestSlogCore_WarningsJoinTheNodeLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	z := zap.New(&slogCore{log: log.With("component", "etcd"), min: zap.WarnLevel}).Named("raft").With(zap.String("member", "m0"))
	z.Info("became leader")
	z.Warn("apply request took too long", zap.Duration("took", 1500_000_000), zap.Int("ops", 3))
	z.Error("failed to write", zap.Error(errTest("disk full")))

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want the warning and the error only:\n%s", len(lines), buf.String())
	}
	var warn, fail map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &warn); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &fail); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"level": "WARN", "msg": "apply request took too long", "component": "etcd",
		"logger": "raft", "member": "m0", "ops": float64(3)} {
		if warn[k] != want {
			t.Errorf("warning's %s = %v, want %v (%s)", k, warn[k], want, lines[0])
		}
	}
	if fail["level"] != "ERROR" || fail["error"] != "disk full" {
		t.Errorf("error line %s", lines[1])
	}
}

// A field's long text is cut, saying how long it was: a slow request is
// printed whole by etcd.
func TestSlogCore_LongFieldsAreCut(t *testing.T) {
	var buf bytes.Buffer
	z := zap.New(&slogCore{log: slog.New(slog.NewJSONHandler(&buf, nil)), min: zap.WarnLevel})
	z.Warn("apply request took too long", zap.String("request", strings.Repeat("key:\"/tasks/1/a\" ", 1000)), zap.String("short", "kept"))
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	req, _ := line["request"].(string)
	if len(req) > maxFieldLen+64 || !strings.HasSuffix(req, "… (17000 bytes in all)") || line["short"] != "kept" {
		t.Errorf("fields %.80q… (%d bytes) and %v, want the request cut to %d bytes with its length", req, len(req), line["short"], maxFieldLen)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

// Once the server is closing, its closed listeners' errors are debug
// lines; an error of another kind stays an error.
func TestSlogCore_ClosedListenersAtCloseAreDebug(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	closing := new(atomic.Bool)
	z := zap.New(&slogCore{log: log, min: zap.WarnLevel, closing: closing})
	accept := &net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}

	z.Error("setting up serving from embedded etcd failed.", zap.Error(accept)) // not closing yet
	closing.Store(true)
	z.Error("setting up serving from embedded etcd failed.", zap.Error(accept))
	z.With(zap.Error(http.ErrServerClosed)).Warn("stopping insecure grpc server due to error")
	z.Error("setting up serving from embedded etcd failed.", zap.Error(cmux.ErrServerClosed))
	z.Warn("failed to update cluster version", zap.Error(etcderrors.ErrCanceled))
	z.Error("failed to save", zap.Error(errTest("disk full")))

	levels := levelsOf(t, buf.String())
	if want := []string{"ERROR", "DEBUG", "DEBUG", "DEBUG", "DEBUG", "ERROR"}; !slices.Equal(levels, want) {
		t.Errorf("levels %v, want %v:\n%s", levels, want, buf.String())
	}
}

// levelsOf returns the level of each line of a JSON log.
func levelsOf(t *testing.T, log string) []string {
	t.Helper()
	var levels []string
	for line := range strings.SplitSeq(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		levels = append(levels, m["level"].(string))
	}
	return levels
}

// startLogged starts a server that logs at info into the buffer it
// returns.
func startLogged(t *testing.T) (*Server, *logbuf.Buffer) {
	t.Helper()
	buf := new(logbuf.Buffer)
	log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := Start(t.Context(), Config{Dir: t.TempDir(), Logger: log, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	return s, buf
}

// A server logs neither of the warnings about the setup Start chose at its
// start, and warns of requests and applies only past slowRequest.
func TestServer_StartLogsNoSetupWarning(t *testing.T) {
	s, buf := startLogged(t)
	defer s.Close()
	for msg := range ourSetup {
		if strings.Contains(buf.String(), msg) {
			t.Errorf("the start warned about the setup Start chose: %q", msg)
		}
	}
	if c := s.etcd.Config(); c.WarningUnaryRequestDuration != slowRequest || c.WarningApplyDuration != slowRequest {
		t.Errorf("etcd warns of requests past %v and applies past %v, want %v", c.WarningUnaryRequestDuration, c.WarningApplyDuration, slowRequest)
	}
}

// A server that closes cleanly logs no warning and no error while it
// closes.
func TestServer_CleanCloseLogsNoError(t *testing.T) {
	s, buf := startLogged(t)
	// Started: the storage version is written once the member leads (a
	// close before that logs the write's failure, rightly).
	for deadline := time.Now().Add(time.Minute); s.etcd.Server.StorageVersion() == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the storage version was never written")
		}
	}
	started := len(buf.String())
	s.Close()
	if out := buf.String()[started:]; out != "" {
		t.Errorf("a clean close logged:\n%s", out)
	}
}

// A lease revoked by its holder as etcd expires it (a node rejoining after
// a fence revokes its old lease) is not a warning: the second revoke finds
// it gone, as both wanted. etcd warned twice for each.
func TestSlogCore_LeaseRevokedTwiceIsDebug(t *testing.T) {
	var buf logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := Start(t.Context(), Config{Dir: t.TempDir(), Logger: log, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// Leases of 1 s revoked from 0.8 to 1.6 s after their grant: some of
	// the revokes meet etcd's, which runs every 500 ms.
	var wg sync.WaitGroup
	for i := range 200 {
		g, err := cli.Grant(t.Context(), 1)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			time.Sleep(800*time.Millisecond + time.Duration(i)*4*time.Millisecond)
			_, _ = cli.Revoke(t.Context(), g.ID)
		})
	}
	wg.Wait()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ls, err := cli.Leases(t.Context())
		if err == nil && len(ls.Leases) == 0 {
			break // etcd's own revokes of those left are applied
		}
		if time.Now().After(deadline) {
			t.Fatalf("leases left after 30 s: %v, %v", ls, err)
		}
	}
	var met int
	for line := range strings.SplitSeq(buf.String(), "\n") {
		if strings.Contains(line, "lease not found") {
			if !strings.Contains(line, "level=DEBUG") {
				t.Errorf("a lease revoked twice was logged above debug: %s", line)
			}
			met++
		}
	}
	if met == 0 {
		t.Skip("no revoke met etcd's expiry this run: nothing to check")
	}

	var dbg logbuf.Buffer
	z := zap.New(&slogCore{log: slog.New(slog.NewJSONHandler(&dbg, &slog.HandlerOptions{Level: slog.LevelDebug})), min: zap.WarnLevel})
	z.Warn("failed to revoke lease", zap.Error(lease.ErrLeaseNotFound))
	z.Warn("failed to apply request", zap.String("request", "header:<ID:1 > lease_revoke:<id:0000000000000001>"), zap.Error(lease.ErrLeaseNotFound))
	z.Warn("failed to apply request", zap.Error(errors.New("etcdserver: too many operations in txn request")))
	z.Warn("failed to apply request", zap.String("request", "header:<ID:2 > put:<key:\"k\" value_size:1 lease:1>"), zap.Error(lease.ErrLeaseNotFound))
	if levels := levelsOf(t, dbg.String()); !slices.Equal(levels, []string{"DEBUG", "DEBUG", "WARN", "WARN"}) {
		t.Errorf("levels %v, want DEBUG for the revokes of a lease not found, WARN for the others:\n%s", levels, dbg.String())
	}
}

// A write under a lease etcd no longer has (a client that lost its
// session writing on: a fenced node's late put) stays a warning: only a
// revoke that finds its lease gone is nothing to do.
func TestSlogCore_PutOnExpiredLeaseWarns(t *testing.T) {
	s, buf := startLogged(t)
	defer s.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	g, err := cli.Grant(t.Context(), 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(t.Context(), g.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), "k", "v", clientv3.WithLease(g.ID)); err == nil {
		t.Fatal("a put under a revoked lease succeeded")
	}
	if out := buf.String(); !strings.Contains(out, "failed to apply request") || !strings.Contains(out, "lease not found") {
		t.Errorf("a put under a revoked lease was not a warning:\n%s", out)
	}
}

// etcd's purge of old WAL files, finding one the WAL still holds, logs a
// debug line, not a warning: it removes the file at a later round. So does
// a publication refused while etcd applies its log. Another failure to
// lock a file stays a warning.
func TestSlogCore_RetriedStepsAreDebug(t *testing.T) {
	var buf logbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	z := zap.New(&slogCore{log: log, min: zap.WarnLevel})
	dir := t.TempDir()
	for _, name := range []string{"0.wal", "1.wal", "2.wal"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	held, err := fileutil.LockFile(filepath.Join(dir, "0.wal"), os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	stop := make(chan struct{})
	done, _ := fileutil.PurgeFileWithDoneNotify(z, dir, "wal", 1, 10*time.Millisecond, stop)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(buf.String(), "failed to lock file"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the purge never met the held file")
		}
	}
	close(stop)
	<-done
	z.Warn("failed to publish local member to cluster through raft", zap.Error(etcderrors.ErrTooManyRequests))
	z.Warn("failed to lock file", zap.Error(os.ErrPermission))

	levels := levelsOf(t, buf.String())
	if len(levels) < 2 || slices.ContainsFunc(levels[:len(levels)-1], func(l string) bool { return l != "DEBUG" }) || levels[len(levels)-1] != "WARN" {
		t.Errorf("levels %v, want DEBUG for the held file and the publication, WARN for the other:\n%s", levels, buf.String())
	}
}

// etcd's slow-request warnings pass one a slowEvery for each message,
// the next saying how many were held back; other warnings all pass.
func TestSlogCore_SlowRequestWarningsAreThrottled(t *testing.T) {
	var buf bytes.Buffer
	z := zap.New(&slogCore{log: slog.New(slog.NewTextHandler(&buf, nil)), min: zap.WarnLevel, slow: &lograte.Limiter{Every: slowEvery}})
	for range 50 {
		z.Warn("apply request took too long", zap.String("request", "txn"))
		z.Warn("request stats", zap.String("request", "range"))
		z.Warn("something else")
	}
	out := buf.String()
	for msg, want := range map[string]int{`msg="apply request took too long"`: 1, `msg="request stats"`: 1, `msg="something else"`: 50} {
		if n := strings.Count(out, msg); n != want {
			t.Errorf("%d lines of %s, want %d", n, msg, want)
		}
	}

}
