package store

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/internal/logbuf"
)

// Badger's advice on its block cache, every minute at a low hit ratio,
// goes to Debug: the cache is small on purpose. Its other warnings stay.
func TestBadgerLogger_CacheAdviceIsDebug(t *testing.T) {
	var buf logbuf.Buffer
	b := badgerLogger{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	// Badger's own formats (db.go, monitorCache).
	b.Warningf("%s might be too small. Metrics: %s\n", "Block cache", "hit: 1 miss: 9")
	b.Warningf("Cache life expectancy (in seconds): %+v\n", "{Count:1}")
	b.Warningf("Truncate Needed. File %s size: %d Endoffset: %d\n", "000001.vlog", 10, 5)
	out := buf.String()
	if strings.Contains(out, "too small") || strings.Contains(out, "life expectancy") {
		t.Errorf("the cache advice was logged at Warn:\n%s", out)
	}
	if !strings.Contains(out, "Truncate Needed") {
		t.Errorf("another warning was not logged at Warn:\n%s", out)
	}
}
