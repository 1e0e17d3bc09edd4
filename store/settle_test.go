package store

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// levels reads the levels of the closed store in cfg.Dir, opening it
// read-only so that no compaction runs.
func levels(t *testing.T, cfg Config) []badger.LevelInfo {
	t.Helper()
	db, err := badger.Open(cfg.badgerOptions().WithReadOnly(true))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return db.Levels()
}

// A store closed with level 0 one table short of a compaction flushes its
// memtable into it as it closes: unless Close lets Badger compact, the
// next Open starts with that compaction due. Each open, write and close
// below adds one table to level 0, and nothing compacts before the fifth.
// A hurried Close does not open Badger again at all: it did, and closing
// it waited for a compaction its compactors had begun meanwhile.
func TestClose_SettlesTheCompactionsDue(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		hurry   bool
		settled bool
	}{
		{"settled", DefaultSettleTimeout, false, true},
		{"hurried", DefaultSettleTimeout, true, false},
		{"disabled", 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.SettleTimeout = tc.timeout
			var logged bytes.Buffer
			cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logged, t.Output()), &slog.HandlerOptions{Level: slog.LevelInfo}))
			l0 := cfg.badgerOptions().NumLevelZeroTables
			for p := range uint32(l0) {
				s, err := Open(cfg)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Reset(p, 1, kvs("a=1", "b=2")); err != nil {
					t.Fatal(err)
				}
				if tc.hurry {
					s.Hurry()
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if reopened := strings.Contains(logged.String(), "before closing, so that the next start need not"); reopened != tc.settled {
				t.Errorf("Badger opened again to settle: %v, want %v", reopened, tc.settled)
			}
			lv := levels(t, cfg)
			if due := compactionDue(lv, l0); due == tc.settled {
				t.Errorf("after %d closes, level 0 holds %d tables (a compaction due: %v), want due %v", l0, lv[0].NumTables, due, !tc.settled)
			}
		})
	}
}
