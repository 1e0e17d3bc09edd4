package etcdembed

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

// A damaged database is a clear error from Start, not a panic on etcd's
// goroutine; an undamaged one starts again.
func TestStart_DamagedDatabaseIsAnError(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(Config{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Start(Config{Dir: dir, Fast: true})
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
	s, err = Start(Config{Dir: dir, Fast: true})
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
