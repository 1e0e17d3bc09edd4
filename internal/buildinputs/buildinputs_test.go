package buildinputs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestOpen_FindsTheModule(t *testing.T) {
	n, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	// At least this package's source and go.mod.
	if n < 2 {
		t.Fatalf("opened %d files", n)
	}
}

func TestOpen_NoModule(t *testing.T) {
	dir := t.TempDir()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			t.Skipf("%s holds a go.mod", d)
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	t.Chdir(dir)
	if _, err := Open(); err == nil {
		t.Fatal("no error outside a module")
	}
}
