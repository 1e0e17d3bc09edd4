// Package buildinputs is for tests that build the shardcron binary with the
// go command: go test's cache does not see the files that build reads, and
// would replay a result cached for older code. The cache does see the
// files a test opens (their size and modification time), so a test that
// calls Open reruns whenever one of them changes.
package buildinputs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Open opens every file of the module the binary may be built from: its
// sources, the assets they embed, go.mod and go.sum (every file but tests,
// test data and dot directories). It finds the module's root above the
// working directory, and returns how many files it opened.
func Open() (int, error) {
	root, err := moduleRoot()
	if err != nil {
		return 0, err
	}
	paths, err := inputs(root)
	if err != nil {
		return 0, err
	}
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		if err := f.Close(); err != nil {
			return 0, err
		}
	}
	return len(paths), nil
}

// inputs lists the files under root that Open opens.
func inputs(root string) ([]string, error) {
	var paths []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !d.Type().IsRegular() || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		paths = append(paths, path)
		return nil
	})
	return paths, err
}

// moduleRoot is the nearest directory at or above the working directory
// that holds a go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("buildinputs: no go.mod above the working directory")
		}
		dir = parent
	}
}
