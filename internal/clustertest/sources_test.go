package clustertest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSourcesOpened opens every file the shardcron binary may be built
// from: the module's sources, the assets they embed, go.mod and go.sum
// (every file but tests, test data and dot directories). TestMain builds the binary with the go command, whose reads go
// test's cache does not see: without this, a change to the engine left
// the chaos tests replaying a result cached for the code before it. The
// cache does see the files a test opens (their size and modification
// time), so a change to any of them runs the package again.
func TestSourcesOpened(t *testing.T) {
	root := filepath.Join("..", "..") // the module, from internal/clustertest
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root: %v", err)
	}
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !d.Type().IsRegular() || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		n++
		return f.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("found no file in the module")
	}
}
