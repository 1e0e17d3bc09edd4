package etcdembed

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if _, err := f.WriteAt(make([]byte, 8192), 0); err != nil { // both meta pages
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
