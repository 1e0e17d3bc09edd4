package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
// another process holds is in use, not damaged; nor is a file where etcd's
// directory should be.
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
	// A file where etcd's directory should be is no damaged database: the
	// error said "cannot be read" and to restore a backup.
	file := filepath.Join(t.TempDir(), "etcd")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// It said "stat …/member/snap/db: not a directory" with no remedy.
	if err := checkBackend(file); err == nil || !strings.Contains(err.Error(), "directory "+file+" cannot be used") || !errors.Is(err, syscall.ENOTDIR) ||
		!strings.Contains(err.Error(), "move that file away") {
		t.Errorf("etcd's directory a file: %v, want that the directory cannot be used, not a directory, and to move the file", err)
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
	if err := os.Truncate(stoppedMember(t, dir), 1000); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stoppedMember starts a member in dir, puts 100 keys and stops it; it
// returns the path of its write-ahead log.
func stoppedMember(t *testing.T, dir string) string {
	t.Helper()
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
	return filepath.Join(dir, "member", "wal", "0000000000000000-0000000000000000.wal")
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

// A deadline of Start's context ends the wait as StartTimeout does, with
// the error that the member did not become ready, naming the directory,
// what to do, and the context's cause: a caller's one deadline over its
// start's waits (shardcron server's --start-timeout). It said only "start
// abandoned: context deadline exceeded".
func TestStart_ContextDeadlineIsAStartTimeout(t *testing.T) {
	dir := damagedWAL(t)
	cause := errors.New("the caller's deadline passed")
	ctx, cancel := context.WithTimeoutCause(t.Context(), 100*time.Millisecond, cause)
	defer cancel()
	s, err := Start(ctx, Config{Dir: dir, Fast: true, StartTimeout: time.Hour})
	if s != nil {
		s.Close()
	}
	if !errors.Is(err, cause) || !strings.Contains(err.Error(), "did not become ready: the caller's deadline passed") ||
		!strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "restore it from a backup") {
		t.Fatalf("Start = %v, want an error that it did not become ready, naming %s, its remedy and the context's cause", err, dir)
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

// A write-ahead log damaged in its records, or at its start, is an error
// from Start that names the log and what to do, as a damaged database is.
// Its records said only etcd's "walpb: crc mismatch" and where; its start
// crashed the node with a nil dereference in etcd's bootstrap, at every
// start (etcd set the file aside as .broken, and read none). Once per
// directory: the etcd that panicked still holds its database.
func TestStart_DamagedWALIsAnErrorWithItsRemedy(t *testing.T) {
	for _, at := range []int64{0, 4096} {
		t.Run(fmt.Sprintf("at=%d", at), func(t *testing.T) {
			dir := panickedDir(t)
			wal := stoppedMember(t, dir)
			f, err := os.OpenFile(wal, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte(strings.Repeat("garbage!", 1024)), at); err != nil {
				t.Fatal(err)
			}
			f.Close()
			s, err := Start(t.Context(), Config{Dir: dir, Fast: true, StartTimeout: 10 * time.Second})
			if err == nil {
				s.Close()
				t.Fatal("Start on a damaged write-ahead log succeeded")
			}
			if !strings.Contains(err.Error(), filepath.Dir(wal)) || !strings.Contains(err.Error(), "restore it from a backup, or move "+dir+" away") {
				t.Errorf("error %q does not name the log and what to do", err)
			}
		})
	}
}

// panickedDir is a directory for an etcd whose start may panic: its
// write-ahead log's file allocator, left running, creates a file in it
// after the panic. Removing it is tried again until that one is made (t's
// own TempDir fails the test the first time).
func panickedDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "etcdembed-panicked-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for err := os.RemoveAll(dir); err != nil; err = os.RemoveAll(dir) {
			if time.Now().After(deadline) {
				t.Errorf("remove %s: %v", dir, err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	return dir
}
