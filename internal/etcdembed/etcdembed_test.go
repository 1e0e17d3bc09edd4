package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A damaged database is a clear error from Start, not a panic on etcd's
// goroutine; an undamaged one starts again.
func TestStart_DamagedDatabaseIsAnError(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(t.Context(), Config{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Start(t.Context(), Config{Dir: dir, Fast: true})
	if err != nil {
		t.Fatalf("a second start on the same directory: %v", err)
	}
	s.Close()

	db := filepath.Join(dir, "member", "snap", "db")
	f, err := os.OpenFile(db, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 2*os.Getpagesize()), 0); err != nil { // both meta pages
		t.Fatal(err)
	}
	f.Close()
	s, err = Start(t.Context(), Config{Dir: dir, Fast: true})
	if err == nil {
		s.Close()
		t.Fatal("Start on a damaged database succeeded")
	}
	if !strings.Contains(err.Error(), db) || !strings.Contains(err.Error(), "cannot be read") {
		t.Errorf("error %q does not name the database and what is wrong", err)
	}
}

// An empty database (a first start cut short) is etcd's to initialise; one
// another process holds is in use, not damaged.
func TestCheckBackend_EmptyAndInUse(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "member", "snap", "db")
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkBackend(dir); err != nil {
		t.Errorf("an empty database: %v", err)
	}
	held, err := bbolt.Open(db, 0o600, nil) // initialises it, and holds its lock
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := checkBackend(dir); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Errorf("a database held elsewhere: %v, want in use", err)
	}
}

// damagedWAL returns the directory of a stopped member that wrote some
// keys and whose write-ahead log was then cut to its first 1000 bytes:
// etcd repairs the log, which now ends before what the database holds,
// and the member's publish of itself, proposed at an index the database
// already applied, is skipped as applied. Each retry moves one index on,
// so the 100 puts keep it from serving for minutes.
func damagedWAL(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s, err := Start(t.Context(), Config{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := cli.Put(t.Context(), fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	cli.Close()
	s.Close()
	wal := filepath.Join(dir, "member", "wal", "0000000000000000-0000000000000000.wal")
	if err := os.Truncate(wal, 1000); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A member that never becomes ready makes Start give up after
// StartTimeout with an error naming the directory; it hung in etcd's
// Close, which waits for a member that never became ready.
func TestStart_NeverReadyGivesUp(t *testing.T) {
	dir := damagedWAL(t)
	done := make(chan error, 1)
	go func() {
		s, err := Start(t.Context(), Config{Dir: dir, Fast: true, StartTimeout: 2 * time.Second})
		if s != nil {
			s.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "did not become ready within 2s") || !strings.Contains(err.Error(), dir) {
			t.Fatalf("Start = %v, want an error that it did not become ready, naming %s", err, dir)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Start still waiting 60s after a start timeout of 2s")
	}
}

// Start gives up when its context ends, with an error that wraps the
// context's.
func TestStart_ContextEndsTheWait(t *testing.T) {
	dir := damagedWAL(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		s, err := Start(ctx, Config{Dir: dir, Fast: true, StartTimeout: time.Hour})
		if s != nil {
			s.Close()
		}
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Start = %v, want context.Canceled", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Start still waiting 60s after its context ended")
	}
}
