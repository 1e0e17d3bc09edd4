package engine

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/task"
)

// BenchmarkLoadDef measures turning one stored task into what the loop
// takes (decode, intern the schedule, share the profile): the CPU a node
// spends per task when it acquires a partition.
func BenchmarkLoadDef(b *testing.B) {
	hc, err := executor.NewClient(executor.DefaultClientConfig())
	if err != nil {
		b.Fatal(err)
	}
	e := &Engine{cfg: DefaultConfig("bench").withDefaults(), scheds: schedule.NewTable(), execs: &executors{shared: executor.Shared{HTTP: hc}}}
	now := e.cfg.Clock.Now().UTC()
	vals := make([][]byte, 1024)
	for i := range vals {
		t := &task.Task{ID: fmt.Sprintf("bench/%010d", i), Schedule: "*/5 * * * * *",
			Executor: task.Executor{Type: task.ExecutorHTTP, URL: "http://127.0.0.5/hook"}, Labels: map[string]string{"team": "a"}}
		if err := t.Validate(); err != nil {
			b.Fatal(err)
		}
		t.CreatedAt, t.UpdatedAt = now, now // as the registry stores it
		v, err := json.Marshal(t)
		if err != nil {
			b.Fatal(err)
		}
		vals[i] = v
	}
	d := e.decoder()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := d.def(fmt.Sprintf("bench/%010d", i%1024), vals[i%1024]); err != nil {
			b.Fatal(err)
		}
	}
}
