package clustertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// mainPackage is the package BuildBinary builds.
const mainPackage = "github.com/shardcron/shardcron/cmd/shardcron"

// BuildBinary builds the shardcron command into a new temporary directory
// and returns its path and a function that removes the directory. Call it
// once per test binary, from TestMain, and pass the path in Options.Binary.
// It runs the go command of the PATH in the current directory, which must
// lie inside the module.
func BuildBinary() (path string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "shardcron-clustertest-")
	if err != nil {
		return "", nil, fmt.Errorf("build shardcron: %w", err)
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	path = filepath.Join(dir, "shardcron")
	cmd := exec.Command("go", "build", "-o", path, mainPackage)
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("build shardcron: %w\n%s", err, out)
	}
	return path, cleanup, nil
}
