package buildinputs

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Open, from a directory inside a module, opens what a build reads from
// the whole module and nothing else.
func TestOpen_OpensWhatABuildReads(t *testing.T) {
	root := t.TempDir()
	read := []string{"go.mod", "go.sum", "main.go", "sub/b.go", "sub/page.html"}
	skipped := []string{"main_test.go", "sub/testdata/case.json", ".git/HEAD", "sub/.cache/x"}
	for _, name := range append(slices.Clone(read), skipped...) {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := inputs(root)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range read {
		want = append(want, filepath.Join(root, name))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("inputs %v, want %v", got, want)
	}
	t.Chdir(filepath.Join(root, "sub"))
	if n, err := Open(); err != nil || n != len(read) {
		t.Errorf("Open from a subdirectory: %d files, %v; want the module's %d", n, err, len(read))
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
