package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// badgerLogger routes Badger's logger to log/slog. Badger logs at INFO for
// every table opened, compaction and memtable flush, which is noise for a
// daemon: its Infof and Debugf go to slog at Debug, its Warningf and Errorf
// to Warn and Error, but for its advice on the cache's size (cacheAdvice).
// Messages are formatted only when the level is enabled.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) log(level slog.Level, format string, args []any) {
	ctx := context.Background()
	if !b.l.Enabled(ctx, level) {
		return
	}
	msg := strings.TrimRight(fmt.Sprintf(format, args...), "\n")
	b.l.Log(ctx, level, msg, "component", "badger")
}

func (b badgerLogger) Errorf(f string, v ...any) { b.log(slog.LevelError, f, v) }

func (b badgerLogger) Warningf(f string, v ...any) {
	level := slog.LevelWarn
	if cacheAdvice(f) {
		level = slog.LevelDebug
	}
	b.log(level, f, v)
}

func (b badgerLogger) Infof(f string, v ...any)  { b.log(slog.LevelDebug, f, v) }
func (b badgerLogger) Debugf(f string, v ...any) { b.log(slog.LevelDebug, f, v) }

// cacheAdvice reports whether format is one of the lines Badger writes,
// every minute, when its block cache's hit ratio is low: the cache is
// small on purpose (Config.BlockCacheSize), no operator can act on them,
// and at Warn they filled every node's log.
func cacheAdvice(format string) bool {
	return strings.Contains(format, "might be too small") || strings.HasPrefix(format, "Cache life expectancy")
}
