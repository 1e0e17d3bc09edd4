package membership

import "strings"

// DefaultPrefix is the etcd key prefix used when none is configured.
const DefaultPrefix = "/shardcron"

// nodesPrefix is the key prefix under which nodes register. An empty prefix
// means DefaultPrefix; a trailing slash is ignored.
func nodesPrefix(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return strings.TrimRight(prefix, "/") + "/nodes/"
}

func nodeKey(prefix, id string) string { return nodesPrefix(prefix) + id }
