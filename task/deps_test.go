package task

import (
	"testing"

	"github.com/shardcron/shardcron/internal/depcheck"
)

// TestDeps_Leaf fails when package task links Badger, the etcd server or
// the engine: clients of the task model (the API's client, the CLI) must be
// able to use it without the runtime.
func TestDeps_Leaf(t *testing.T) {
	depcheck.Refuse(t, []string{
		"github.com/dgraph-io/badger",
		"go.etcd.io/etcd/server",
		"go.etcd.io/etcd/client",
		"github.com/shardcron/shardcron/engine",
		"github.com/shardcron/shardcron/store",
	}, []string{
		"github.com/shardcron/shardcron/engine/schedule",
		"github.com/shardcron/shardcron/engine/executor",
	})
}
