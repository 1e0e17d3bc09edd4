package etcdembed

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
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

type errTest string

func (e errTest) Error() string { return string(e) }
