package engine

import (
	"fmt"
	"strings"
)

// keys is the etcd key layout of the runtime (docs/design.md): partition
// locks, checkpoints, watermarks and prepared records, under the cluster's
// prefix. The task, trigger and index keys are package registry's, which
// reads and writes them.
//
// Partitions are written as five zero-padded digits (P is at most 32768),
// as the registry writes them.
type keys struct{ prefix string } // without a trailing slash

func newKeys(prefix string) keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return keys{prefix: strings.TrimRight(prefix, "/")}
}

func (k keys) lock(p int) string       { return fmt.Sprintf("%s/locks/%05d", k.prefix, p) }
func (k keys) locks() string           { return k.prefix + "/locks/" }
func (k keys) checkpoint(p int) string { return fmt.Sprintf("%s/checkpoints/%05d", k.prefix, p) }
func (k keys) checkpoints() string     { return k.prefix + "/checkpoints/" }
func (k keys) watermark(node, session string) string {
	return k.prefix + "/watermarks/" + node + "/" + session
}
func (k keys) watermarks() string     { return k.prefix + "/watermarks/" }
func (k keys) preparedPrefix() string { return k.prefix + "/prepared/" }
func (k keys) prepared(node string) string {
	return k.prefix + "/prepared/" + node
}
