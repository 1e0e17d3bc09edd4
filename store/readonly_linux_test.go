//go:build linux

package store

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/shardcron/shardcron/internal/tmpfs"
)

// TestOpen_ReadOnlyFilesystem: a data directory on a filesystem mounted
// read-only is an *OpenError that does not match ErrCorrupt (the server
// would try to set it aside), names the directory, and leaves every file
// as it was; once writable again it opens with what it held.
func TestOpen_ReadOnlyFilesystem(t *testing.T) {
	fs := tmpfs.Mount(t, 64<<20)
	cfg := testConfig(t)
	cfg.Dir = filepath.Join(fs, "cache")
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(3, 42, []KV{{ID: "a", Value: []byte("A")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	before := listing(t, cfg.Dir)
	if err := syscall.Mount("", fs, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot remount read-only: %v", err)
	}
	err = refusedOpen(t, cfg, "on a read-only filesystem")
	// Moving the directory away cannot be done there, nor does it help.
	if msg := err.Error(); !strings.Contains(msg, "mount it read-write") || strings.Contains(msg, "moving it away") {
		t.Fatalf("Open = %v, want the advice to mount the filesystem read-write, not to move the directory", err)
	}
	if after := listing(t, cfg.Dir); after != before {
		t.Fatalf("files changed:\n%s\nwant\n%s", after, before)
	}
	// Nor can a new directory be made there, which holds nothing to damage.
	made := cfg
	made.Dir = filepath.Join(fs, "new")
	err = refusedOpen(t, made, "of a new directory on a read-only filesystem")
	if msg := err.Error(); !strings.Contains(msg, "cannot create data directory "+made.Dir) ||
		!strings.Contains(msg, "mount it read-write") || strings.Contains(msg, "nothing in it") {
		t.Fatalf("Open of a new directory = %v, want that it cannot be created and the advice to mount the filesystem read-write", err)
	}
	if err := syscall.Mount("", fs, "", syscall.MS_REMOUNT, ""); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, cfg)
	if rev, got := scan(t, s, 3); rev != 42 || got != "a=A" {
		t.Fatalf("once writable: revision %d, tasks %q; want 42 and a=A", rev, got)
	}
}

// listing is the names and sizes of dir's files, one a line.
func listing(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out += fmt.Sprintf("%s %d %v\n", e.Name(), fi.Size(), fi.ModTime())
	}
	return out
}
