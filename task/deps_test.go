package task

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps_Leaf fails when package task links Badger, the etcd server or
// the engine: clients of the task model (the API's client, the CLI) must be
// able to use it without the runtime.
func TestDeps_Leaf(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		for _, banned := range []string{
			"github.com/dgraph-io/badger",
			"go.etcd.io/etcd/server",
			"go.etcd.io/etcd/client",
			"github.com/shardcron/shardcron/engine",
			"github.com/shardcron/shardcron/store",
		} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				if dep == "github.com/shardcron/shardcron/engine/schedule" || dep == "github.com/shardcron/shardcron/engine/executor" {
					continue
				}
				t.Errorf("package task depends on %s", dep)
			}
		}
	}
}
