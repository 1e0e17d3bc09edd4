package registry

import (
	"strings"
	"testing"
)

// Keys that are not a partition's task, backfill or trigger keys do not
// parse as one.
func TestKeys_MalformedKeysDoNotParse(t *testing.T) {
	k := newKeys("/p")
	for _, key := range []string{"/p/tasks/", "/p/tasks/00001", "/p/tasks/00001x", "/p/tasks/0000x/a", "/p/tasks/000001/a", "/q/tasks/00001/a"} {
		if p, id, ok := k.parseTaskKey(key); ok {
			t.Errorf("parseTaskKey(%q) = %d, %q, ok", key, p, id)
		}
		bkey := strings.Replace(key, "/tasks/", "/backfills/", 1)
		if p, id, ok := k.parseBackfillKey(bkey); ok {
			t.Errorf("parseBackfillKey(%q) = %d, %q, ok", bkey, p, id)
		}
	}
	for _, key := range []string{"/p/triggers/00001", "/p/triggers/00001x5/a", "/p/triggers/0000x/5/a", "/p/triggers/00001/5", "/p/triggers/00001/x/a", "/q/triggers/00001/5/a"} {
		if p, at, id, ok := k.parseTriggerKey(key); ok {
			t.Errorf("parseTriggerKey(%q) = %d, %d, %q, ok", key, p, at, id)
		}
	}
	if p, id, ok := k.parseTaskKey("/p/tasks/00001/a/b"); !ok || p != 1 || id != "a/b" {
		t.Errorf("parseTaskKey of a task key: %d, %q, %v", p, id, ok)
	}
}
