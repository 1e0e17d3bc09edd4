package registry

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/shardcron/shardcron/task"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func putTask(t *testing.T, r *Registry, tsk *task.Task) *task.Task {
	t.Helper()
	got, err := r.Put(context.Background(), tsk, PutOptions{})
	if err != nil {
		t.Fatalf("put %s: %v", tsk.ID, err)
	}
	return got
}
