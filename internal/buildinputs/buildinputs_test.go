package buildinputs

import (
	"os"
	"path/filepath"
	"testing"
)

// Open, from a directory inside a module, opens what a build reads from
// the whole module and nothing else.
func TestOpen_OpensWhatABuildReads(t *testing.T) {
	root := t.TempDir()
	read := []string{"go.mod", "go.sum", "main.go", "sub/b.go", "sub/page.html"}
	skipped := []string{"main_test.go", "sub/testdata/case.json", ".git/HEAD", "sub/.cache/x"}
	for _, name := range append(read, skipped...) {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(filepath.Join(root, "sub"))
	n, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	if n != len(read) {
		t.Fatalf("opened %d files, want the %d a build reads: %v", n, len(read), read)
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
