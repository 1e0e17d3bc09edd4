//go:build unix

package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// openChildEnv, when set to a directory, turns the test binary into a
// process that opens it with corruptDir's settings and prints what Open
// returned (see TestMain): TestOpen_UnreadableFileIsNotCorrupt runs it
// as another user when the tests run as root, whom no mode stops.
const openChildEnv = "STORE_OPEN_CHILD_DIR"

// openChild opens dir, prints "corrupt <err>", "error <err>" or "ok", and
// exits.
func openChild(dir string) {
	cfg := DefaultConfig(dir)
	cfg.MemTableSize = 1 << 20
	cfg.ValueThreshold = 1 << 10
	cfg.Logger = nil
	s, err := Open(cfg)
	switch {
	case errors.Is(err, ErrCorrupt):
		fmt.Println("corrupt", err)
	case err != nil:
		fmt.Println("error", err)
	default:
		s.Close()
		fmt.Println("ok")
	}
	os.Exit(0)
}

// openAsOther opens dir in a process of a user other than the files'
// owner when the tests run as root (as nobody, the directory, if there is
// one, given to it), else in this one, and returns what openChild prints.
func openAsOther(t *testing.T, dir string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		cfg := DefaultConfig(dir)
		cfg.MemTableSize = 1 << 20
		cfg.ValueThreshold = 1 << 10
		s, err := Open(cfg)
		switch {
		case errors.Is(err, ErrCorrupt):
			return "corrupt " + err.Error()
		case err != nil:
			return "error " + err.Error()
		}
		s.Close()
		return "ok"
	}
	const nobody = 65534
	// The test binary, where nobody may run it.
	bin := filepath.Join(t.TempDir(), "store.test")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, self, bin, 0o755)
	for d := filepath.Dir(dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	// nobody owns the directory and its files, but for those the test
	// made unreadable (mode 0): root keeps those.
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if fi, err := d.Info(); err == nil && fi.Mode().Perm() == 0 {
			return nil
		}
		return os.Chown(path, nobody, nobody)
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), openChildEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpen_UnreadableFileIsNotCorrupt: a file of the directory that the
// node may not read (left by a start as another user, say), or the
// directory itself, is an *OpenError naming the cause, not ErrCorrupt,
// which would make the server set the directory aside, its history with
// it (docs/design.md: permissions stop the node; moving the directory is
// the operator's call). Its advice is to fix the permissions: it said
// that moving the directory away is safe, which loses the history for
// nothing.
func TestOpen_UnreadableFileIsNotCorrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process when run as root")
	}
	for _, pattern := range []string{"KEYREGISTRY", "*.vlog", "*.sst", "MANIFEST", "."} {
		t.Run(pattern, func(t *testing.T) {
			cfg := corruptDir(t)
			files, err := filepath.Glob(filepath.Join(cfg.Dir, pattern))
			if err != nil || len(files) == 0 {
				t.Fatalf("no %s in %s (%v)", pattern, cfg.Dir, err)
			}
			if err := os.Chmod(files[0], 0); err != nil {
				t.Fatal(err)
			}
			if pattern == "." {
				// Else a user but root may not remove the test's directory.
				t.Cleanup(func() { _ = os.Chmod(cfg.Dir, 0o700) })
			}
			got := openAsOther(t, cfg.Dir)
			t.Logf("Open: %s", got)
			if !strings.HasPrefix(got, "error ") || !strings.Contains(got, "permission denied") ||
				!strings.Contains(got, cfg.Dir) {
				t.Fatalf("Open with %s unreadable: %s; want an error, not ErrCorrupt, naming the directory and the permission", filepath.Base(files[0]), got)
			}
			if !strings.Contains(got, "fix the permissions or the owner") || strings.Contains(got, "moving it away") {
				t.Fatalf("Open with %s unreadable: %s; want the advice to fix the permissions, not to move the directory", filepath.Base(files[0]), got)
			}
		})
	}
}

// TestOpen_DirectoryThatCannotBeCreated: a directory Open cannot make (a
// file stands in its path, its parent refuses the node's user) is an
// *OpenError that says it could not be created, why, and what to do: it
// said "cannot open", and advised that moving it away is safe, or to fix
// the permissions of a directory that did not exist.
func TestOpen_DirectoryThatCannotBeCreated(t *testing.T) {
	t.Run("file in its path", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t)
		cfg.Dir = filepath.Join(file, "data")
		err := refusedOpen(t, cfg, "under a file")
		if msg := err.Error(); !strings.Contains(msg, "cannot create data directory "+cfg.Dir) || !strings.Contains(msg, file+": not a directory") ||
			!strings.Contains(msg, "choose another directory") || strings.Contains(msg, "moving it away") {
			t.Fatalf("Open = %v, want that it cannot create %s as %s is a file, and to choose another directory", err, cfg.Dir, file)
		}
	})
	t.Run("parent not writable", func(t *testing.T) {
		if testing.Short() {
			t.Skip("spawns a process when run as root")
		}
		parent := filepath.Join(t.TempDir(), "parent")
		if err := os.Mkdir(parent, 0o555); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(parent, "data")
		got := openAsOther(t, dir)
		t.Logf("Open: %s", got)
		if !strings.HasPrefix(got, "error ") || !strings.Contains(got, "cannot create data directory "+dir) ||
			!strings.Contains(got, "mkdir "+dir+": permission denied") {
			t.Fatalf("Open under a parent it may not write: %s; want an error that it cannot create %s, permission denied", got, dir)
		}
		if !strings.Contains(got, "fix the permissions or the owner of "+parent) || strings.Contains(got, "moving it away") {
			t.Fatalf("Open under a parent it may not write: %s; want the advice to fix the permissions of %s", got, parent)
		}
	})
}
