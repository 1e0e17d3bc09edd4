// Package etcdembed starts a single-member etcd inside the process: the
// node's single-machine default (cmd/shardcron), the benchmark harness
// (bench) and the test fixture (internal/etcdtest) all start it here.
//
// It listens on loopback unless told otherwise and waits until the server
// serves before returning. It guarantees nothing about durability beyond
// what Config asks for: Fast trades fsync and election time for speed and
// is for tests and benchmarks only.
package etcdembed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/bbolt"
	bberrors "go.etcd.io/bbolt/errors"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/protobuf/proto"

	"github.com/shardcron/shardcron/internal/lograte"
)

// Config says where and how the server runs.
type Config struct {
	// Name is the member's name (default "shardcron").
	Name string
	// Dir holds the data. Required.
	Dir string
	// Logger receives the server's warnings and errors, under
	// component=etcd; it takes precedence over LogFile.
	Logger *slog.Logger
	// LogFile receives the server's log at LogLevel (default: discarded).
	LogFile string
	// LogLevel is zap's level name (default "error").
	LogLevel string
	// ClientAddr and PeerAddr are host:port to listen on (default
	// "127.0.0.1:0": the kernel picks a free loopback port).
	ClientAddr, PeerAddr string
	// CompactionRetention, when positive, compacts history older than it
	// periodically.
	CompactionRetention time.Duration
	// QuotaBytes is the backend quota (default etcd's 2 GiB).
	QuotaBytes int64
	// Fast skips fsync and uses a 10 ms raft tick, so the member elects
	// itself in a few ticks: it loses data on a machine crash. For tests
	// and benchmarks.
	Fast bool
	// StartTimeout bounds the wait for the server to serve (default 30s).
	StartTimeout time.Duration
	// StopWait bounds the wait for a server that did not start to stop
	// (default 10s): past it Start returns its error anyway and leaves
	// the server's goroutines behind. etcd's Close can block for good on
	// a member that never became ready.
	StopWait time.Duration
}

// Server is a running embedded etcd.
type Server struct {
	// Endpoint is the client URL it listens on ("http://127.0.0.1:port").
	Endpoint string
	etcd     *embed.Etcd
	closing  *atomic.Bool // tells the log that the close has begun
}

// slowRequest is how slow a request or its apply must be for etcd to warn
// of it. etcd's own thresholds (300 and 100 ms) suit a server with cores of
// its own: sharing the node's, a bulk action or an import over a million
// tasks takes longer than that for thousands of requests (2 102 and 315
// warnings in ten minutes of them at 1 M tasks), all in the node's log.
// Past a second a request is still worth one.
const slowRequest = time.Second

// Start starts the server and waits until it serves, at most
// cfg.StartTimeout from its call. It gives up when ctx ends, with an error
// that wraps ctx's; a deadline of ctx ends the wait as StartTimeout does,
// with the error that the server did not become ready and ctx's cause
// (context.WithDeadlineCause): a caller whose start has several waits
// bounds them all by one deadline. A server that did not start is stopped
// before Start returns, or, if it has not stopped within cfg.StopWait,
// left behind still stopping: the caller then should exit soon rather
// than start another in the same directory.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("etcdembed: Dir is required")
	}
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	if ec.Name == "" {
		ec.Name = "shardcron"
	}
	ec.Dir = cfg.Dir
	cu := url.URL{Scheme: "http", Host: orLoopback(cfg.ClientAddr)}
	pu := url.URL{Scheme: "http", Host: orLoopback(cfg.PeerAddr)}
	// With port 0 the advertised URLs keep port 0: nothing dials them in a
	// one-member cluster once the grpc gateway (which dials its own
	// advertised address) is off.
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.EnableGRPCGateway = false
	if cfg.CompactionRetention > 0 {
		ec.AutoCompactionMode = "periodic"
		ec.AutoCompactionRetention = cfg.CompactionRetention.String()
	}
	if cfg.QuotaBytes > 0 {
		ec.QuotaBackendBytes = cfg.QuotaBytes
	}
	ec.WarningUnaryRequestDuration, ec.WarningApplyDuration = slowRequest, slowRequest
	if cfg.Fast {
		ec.UnsafeNoFsync = true
		ec.SnapshotCount = 10000
		ec.TickMs, ec.ElectionMs = 10, 100
	}
	ec.LogLevel = cfg.LogLevel
	if ec.LogLevel == "" {
		ec.LogLevel = "error"
	}
	closing := new(atomic.Bool)
	switch {
	case cfg.Logger != nil:
		core := &slogCore{log: cfg.Logger.With("component", "etcd"), min: zapcore.WarnLevel, closing: closing, slow: &lograte.Limiter{Every: slowEvery}}
		ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(core))
	case cfg.LogFile != "":
		ec.LogOutputs = []string{cfg.LogFile}
	default:
		ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	}
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	// From the call: opening the backend and replaying the write-ahead
	// log, before the server can serve, are part of the wait.
	bound, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := checkBackend(ec.Dir); err != nil {
		return nil, err
	}
	e, err := startEtcd(ec)
	if err != nil {
		err = fmt.Errorf("start embedded etcd in %s (client %s, peer %s): %w", cfg.Dir, cu.Host, pu.Host, err)
		if walDamaged(err) {
			err = fmt.Errorf("%w (its write-ahead log in %s looks damaged: restore it from a backup, or move %s away to start an empty etcd)",
				err, filepath.Join(cfg.Dir, "member", "wal"), cfg.Dir)
		}
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return &Server{Endpoint: "http://" + e.Clients[0].Addr().String(), etcd: e, closing: closing}, nil
	case err = <-e.Err():
		err = fmt.Errorf("embedded etcd in %s: %w", cfg.Dir, err)
	case <-bound.Done():
		remedy := fmt.Sprintf("its log above says why; a member that never publishes itself may have a damaged write-ahead log in %s: "+
			"restore it from a backup, or move %s away to start an empty etcd", filepath.Join(cfg.Dir, "member", "wal"), cfg.Dir)
		switch {
		case ctx.Err() == nil:
			err = fmt.Errorf("embedded etcd in %s did not become ready within %v (%s)", cfg.Dir, timeout, remedy)
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			err = fmt.Errorf("embedded etcd in %s did not become ready: %w (%s)", cfg.Dir, context.Cause(ctx), remedy)
		default:
			err = fmt.Errorf("embedded etcd in %s: start abandoned: %w", cfg.Dir, ctx.Err())
		}
	}
	closing.Store(true)
	if wait := cmp.Or(cfg.StopWait, 10*time.Second); !stopUnready(e, wait) {
		err = fmt.Errorf("%w; it did not stop within %v either", err, wait)
	}
	return nil, err
}

// walDamaged reports whether err, of etcd's start, comes from reading its
// write-ahead log: a record whose checksum fails, one cut short, one that
// does not decode (a protobuf error), or a panic (startEtcd).
func walDamaged(err error) bool {
	return errors.Is(err, walpb.ErrCRCMismatch) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, proto.Error) || errors.Is(err, errPanicked)
}

// errPanicked is what a panic of etcd's start is returned as.
var errPanicked = errors.New("etcd panicked at its start")

// startEtcd is embed.StartEtcd, a panic of its start an error: etcd panics
// on a write-ahead log whose first records are garbage (it sets the file
// aside as .broken, then dereferences the log it did not read, at every
// start), a node's crash with etcd's stack trace instead of a message. The
// listeners it opened before are left to the process's exit, which the
// caller is then expected to make soon.
func startEtcd(ec *embed.Config) (e *embed.Etcd, err error) {
	defer func() {
		if r := recover(); r != nil {
			e, err = nil, fmt.Errorf("%w: %v", errPanicked, r)
		}
	}()
	return embed.StartEtcd(ec)
}

// stopUnready stops a server that did not become ready, waiting at most
// wait; it reports whether the server stopped. etcd's Close alone blocks
// for good on such a server: it waits for the client servers to hand
// themselves over, which they do once the server is ready or stopping,
// and it stops the server only after that. Stopping the server first
// (as HardStop does, without the leadership transfer of Stop) lets them
// return. Should the stop block anyway, its goroutine is left behind.
func stopUnready(e *embed.Etcd, wait time.Duration) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Server.HardStop()
		e.Close()
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// checkBackend opens etcd's database in dir read-only, if there is one,
// and returns a clear error if that fails: etcd opens it on a goroutine of
// its own and panics there when it cannot (a damaged file), a crash with a
// stack trace instead of a message. bbolt checks the file's meta pages
// when it opens it; damage deeper in the file is etcd's to find. An empty
// file (a first start cut short) is etcd's to initialise.
func checkBackend(dir string) error {
	path := filepath.Join(dir, "member", "snap", "db")
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || err == nil && fi.Size() == 0:
		return nil
	case errors.Is(err, syscall.ENOTDIR):
		// Not the database's damage: neither a backup nor an empty etcd
		// is the remedy.
		return fmt.Errorf("the embedded etcd's directory %s cannot be used: %w "+
			"(a file stands where a directory of its path must be: move that file away)", dir, err)
	case err != nil:
		return fmt.Errorf("the embedded etcd's directory %s cannot be used: %w", dir, err)
	}
	err = openReadOnly(path)
	switch {
	case errors.Is(err, bberrors.ErrTimeout):
		return fmt.Errorf("the embedded etcd's database %s is in use by another process (is another shardcron server running with %s?)", path, dir)
	case err != nil:
		return fmt.Errorf("the embedded etcd's database %s cannot be read: %w "+
			"(restore it from a backup, or move %s away to start an empty etcd)", path, err, dir)
	}
	return nil
}

// openReadOnly opens and closes the bbolt database at path, a panic of
// bbolt's an error.
func openReadOnly(path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return err
	}
	return db.Close()
}

func orLoopback(addr string) string {
	if addr == "" {
		return "127.0.0.1:0"
	}
	return addr
}

// Addr is the client address ("127.0.0.1:port").
func (s *Server) Addr() string { return s.etcd.Clients[0].Addr().String() }

// Logger is the server's logger, for clients that should log alike.
func (s *Server) Logger() *zap.Logger { return s.etcd.GetLogger() }

// Close stops the server and waits for it.
func (s *Server) Close() {
	s.closing.Store(true)
	s.etcd.Close()
}
