package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/soheilhy/cmux"
	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	etcderrors "go.etcd.io/etcd/server/v3/etcdserver/errors"
	"go.etcd.io/etcd/server/v3/lease"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"

	"github.com/shardcron/shardcron/internal/lograte"
)

// slogCore is a zap core that writes to a slog.Logger, so that the
// embedded server's warnings and errors join the node's own log (with its
// format and destination) instead of a file nobody rotates.
//
// Once the server is closing, the errors of its listeners and servers
// being closed (every serving goroutine logs one as it returns, some at
// error level) are debug lines: they are the close itself, and a node
// that stops cleanly must not end its log with errors. So are the
// warnings about the setup this package chooses (ourSetup), which a node
// that starts cleanly must not begin its log with, and the warnings of
// steps etcd retries by itself (retried).
type slogCore struct {
	log     *slog.Logger
	min     zapcore.Level
	fields  []zapcore.Field
	closing *atomic.Bool     // set by Server.Close; nil: never
	slow    *lograte.Limiter // etcd's slow-request warnings, by message; nil: all pass
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, min: c.min, fields: append(c.fields[:len(c.fields):len(c.fields)], fields...), closing: c.closing, slow: c.slow}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	level := slogLevel(e.Level)
	if c.closing != nil && c.closing.Load() && (hasError(c.fields, closed) || hasError(fields, closed)) ||
		ourSetup[e.Message] || isRetried(e.Message, fields) {
		level = slog.LevelDebug
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields)+2)
	if slowRequests[e.Message] && c.slow != nil && level >= slog.LevelWarn {
		pass, held := c.slow.Pass(e.Message, e.Time)
		if !pass {
			return nil
		}
		if held > 0 {
			attrs = append(attrs, slog.Int("held_back", held))
		}
	}
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	for k, v := range enc.Fields {
		if s, ok := v.(string); ok && len(s) > maxFieldLen {
			v = fmt.Sprintf("%s… (%d bytes in all)", strings.ToValidUTF8(s[:maxFieldLen], ""), len(s))
		}
		attrs = append(attrs, slog.Any(k, v))
	}
	c.log.LogAttrs(context.Background(), level, e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

// slowRequests are etcd's warnings of a slow request, one per request: an
// etcd stall of a second, on a node whose partitions each have a lock,
// a checkpoint and a watermark in flight, gave 188 lines in that second.
// One of each a slowEvery passes, with the count of those held back.
var slowRequests = map[string]bool{"apply request took too long": true, "request stats": true}

const slowEvery = 10 * time.Second

// maxFieldLen cuts a field's text: etcd's warning of a slow request
// prints the request whole, and a batch of an import names 128 tasks, 17
// KB a line, hundreds of them while a large import runs.
const maxFieldLen = 512

// ourSetup are the warnings etcd gives at every start about settings Start
// chooses, which its user can neither change nor need to: without auth the
// simple token signs nothing, and one port for gRPC and HTTP is what a
// single embedded member wants.
var ourSetup = map[string]bool{
	"simple token is not cryptographically signed":                                         true,
	"Running http and grpc server on single port. This is not recommended for production.": true,
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l >= zapcore.WarnLevel:
		return slog.LevelWarn
	case l >= zapcore.InfoLevel:
		return slog.LevelInfo
	default:
		return slog.LevelDebug
	}
}

// retried are etcd's warnings of steps it retries by itself or that end
// as they were meant to, by message, with what of their fields makes them
// no fault and nothing to do:
//   - its purge of old WAL files finds one the WAL still holds (until a
//     snapshot releases it): under a heavy import, every 30 s; a later
//     round removes it;
//   - at a restart, while it applies its log, its member's publication is
//     refused and retried at once, a hundred lines in 2 ms; Start waits for
//     it to succeed, within its timeout;
//   - a lease revoked twice, by its holder and by etcd as it expires (a
//     node that rejoins after a fence revokes its old session's lease,
//     which has often just expired): the second finds it gone, as both
//     wanted, and each of the two messages says so. "failed to apply
//     request" with that error is also a put or a txn under a lease etcd
//     no longer has (a fenced node's late put): that stays a warning.
var retried = map[string]func([]zapcore.Field) bool{
	"failed to lock file": erred(fileutil.ErrLocked),
	"failed to publish local member to cluster through raft": erred(etcderrors.ErrTooManyRequests),
	"failed to revoke lease":                                 erred(lease.ErrLeaseNotFound),
	"failed to apply request": func(fields []zapcore.Field) bool {
		return revokes(fields) && erred(lease.ErrLeaseNotFound)(fields)
	},
}

// erred returns whether fields carry the error want.
func erred(want error) func([]zapcore.Field) bool {
	return func(fields []zapcore.Field) bool {
		return hasError(fields, func(err error) bool { return errors.Is(err, want) })
	}
}

// isRetried reports whether a line is one of retried.
func isRetried(msg string, fields []zapcore.Field) bool {
	harmless, ok := retried[msg]
	return ok && harmless(fields)
}

// revokes reports whether fields name a lease revoke as their request
// (etcd prints it "header:<...> lease_revoke:<id:...>").
func revokes(fields []zapcore.Field) bool {
	for _, f := range fields {
		if f.Key == "request" && f.Type == zapcore.StringType {
			_, req, _ := strings.Cut(f.String, "> ")
			return strings.HasPrefix(req, "lease_revoke:<")
		}
	}
	return false
}

// closed reports whether err is the error of a listener or server that was
// closed, or of a request the close cut short (the cluster version's
// update, which etcd sends once its member leads, is still in flight when
// a node stops right after it started).
func closed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) ||
		errors.Is(err, cmux.ErrServerClosed) || errors.Is(err, cmux.ErrListenerClosed) ||
		errors.Is(err, grpc.ErrServerStopped) || errors.Is(err, etcderrors.ErrCanceled) ||
		errors.Is(err, etcderrors.ErrStopped)
}

// hasError reports whether fields carry an error for which is is true.
func hasError(fields []zapcore.Field, is func(error) bool) bool {
	for _, f := range fields {
		if err, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType && is(err) {
			return true
		}
	}
	return false
}
