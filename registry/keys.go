package registry

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/shardcron/shardcron/membership"
)

// keys is the etcd key layout of docs/design.md's task definitions,
// triggers, backfills and index, under the cluster's prefix. (The runtime's locks,
// checkpoints, watermarks and prepared records are package engine's.)
//
// Partitions are written as five zero-padded digits (P is at most 65536), so
// the keys of one partition form one contiguous range, and consecutive
// partitions are adjacent ranges.
type keys struct{ prefix string } // without a trailing slash

func newKeys(prefix string) keys {
	if prefix == "" {
		prefix = membership.DefaultPrefix
	}
	return keys{prefix: strings.TrimRight(prefix, "/")}
}

func (k keys) cluster() string              { return k.prefix + "/cluster" }
func (k keys) tasks() string                { return k.prefix + "/tasks/" }
func (k keys) partition(p int) string       { return fmt.Sprintf("%s/tasks/%05d/", k.prefix, p) }
func (k keys) task(p int, id string) string { return k.partition(p) + id }
func (k keys) triggers() string             { return k.prefix + "/triggers/" }
func (k keys) triggerPrefix(p int) string   { return fmt.Sprintf("%s/triggers/%05d/", k.prefix, p) }
func (k keys) backfills() string            { return k.prefix + "/backfills/" }
func (k keys) backfillPrefix(p int) string {
	return fmt.Sprintf("%s/backfills/%05d/", k.prefix, p)
}
func (k keys) backfill(p int, id string) string { return k.backfillPrefix(p) + id }

// parseBackfillKey splits a backfill key into its partition and task id.
func (k keys) parseBackfillKey(key string) (p int, id string, ok bool) {
	return parsePartitionKey(key, k.backfills())
}

func (k keys) trigger(p int, id string, at int64) string {
	return fmt.Sprintf("%s/triggers/%05d/%d/%s", k.prefix, p, at, id)
}

// parseTaskKey splits a task key into its partition and task id.
func (k keys) parseTaskKey(key string) (p int, id string, ok bool) {
	return parsePartitionKey(key, k.tasks())
}

// parsePartitionKey splits a key "<under><ppppp>/<id>" into its partition
// and id.
func parsePartitionKey(key, under string) (p int, id string, ok bool) {
	rest, found := strings.CutPrefix(key, under)
	if !found || len(rest) < 7 || rest[5] != '/' {
		return 0, "", false
	}
	p, err := strconv.Atoi(rest[:5])
	if err != nil {
		return 0, "", false
	}
	return p, rest[6:], true
}

// parseTriggerKey splits a trigger key into partition, time and task id.
func (k keys) parseTriggerKey(key string) (p int, at int64, id string, ok bool) {
	rest, found := strings.CutPrefix(key, k.triggers())
	if !found || len(rest) < 7 || rest[5] != '/' {
		return 0, 0, "", false
	}
	p, err := strconv.Atoi(rest[:5])
	if err != nil {
		return 0, 0, "", false
	}
	atStr, id, found := strings.Cut(rest[6:], "/")
	if !found {
		return 0, 0, "", false
	}
	at, err = strconv.ParseInt(atStr, 10, 64)
	if err != nil {
		return 0, 0, "", false
	}
	return p, at, id, true
}
