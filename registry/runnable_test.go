package registry

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/task"
)

// A task whose executor and notify url only some live nodes allow gets
// both warnings, joined; one no live node runs is refused on the field
// that names what is missing: the handler's name, or the executor's type.
func TestRunners_CheckJoinsWarningsAndNamesTheField(t *testing.T) {
	only2, err := executor.ParseHostAllow([]string{"127.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	rs := Runners{Nodes: 2, HTTPAllow: []*executor.HostAllow{only2, nil}}
	tsk := &task.Task{
		Executor: task.Executor{Type: task.ExecutorHTTP, URL: "http://127.0.0.1:9/"},
		Notify:   &task.Notify{URL: "http://127.0.0.1:9/alerts"},
	}
	w, _ := rs.checkExecutor(tsk)
	nw, _ := rs.checkNotify(tsk)
	got, err := rs.Check(tsk)
	if err != nil || w == "" || nw == "" || got != w+"; "+nw {
		t.Errorf("Check = %q, %v; want both warnings joined: %q and %q", got, err, w, nw)
	}
	tsk.Notify = nil
	if got, err := rs.Check(tsk); err != nil || got != w {
		t.Errorf("Check without a notify url = %q, %v; want the executor's warning alone: %q", got, err, w)
	}

	alone := Runners{Nodes: 1}
	for _, tc := range []struct {
		ex    task.Executor
		field string
	}{
		{task.Executor{Type: task.ExecutorHandler, Name: "h"}, "executor.name"},
		{task.Executor{Type: task.ExecutorExec, Command: []string{"/bin/true"}}, "executor.type"},
	} {
		_, err := alone.Check(&task.Task{Executor: tc.ex})
		var ve *task.ValidationError
		if !errors.As(err, &ve) || ve.Field != tc.field || !strings.Contains(err.Error(), "(of 1 live node)") {
			t.Errorf("%s on a node that does not run it: %v; want a *ValidationError on %s", tc.ex.Type, err, tc.field)
		}
	}
}
