package engine

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/shardcron/shardcron/engine/executor"
	"github.com/shardcron/shardcron/engine/schedule"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

// BenchmarkLoadDef measures turning one stored task into what the loop
// takes (decode, intern the schedule, share the profile): the CPU a node
// spends per task when it acquires a partition. value=json is a task as
// etcd holds it (a range read, or a cache written before shapes);
// value=shape is the same task cached as its shape (shape.go), as a warm
// restart reads a fleet of tasks that share their firing fields.
func BenchmarkLoadDef(b *testing.B) {
	hc, err := executor.NewClient(executor.DefaultClientConfig())
	if err != nil {
		b.Fatal(err)
	}
	e := &Engine{cfg: DefaultConfig("bench").withDefaults(), scheds: schedule.NewTable(), execs: &executors{shared: executor.Shared{HTTP: hc}}}
	now := e.cfg.Clock.Now().UTC()
	ids := make([]string, 1024)
	vals := make([][]byte, len(ids))
	for i := range vals {
		ids[i] = fmt.Sprintf("bench/%010d", i)
		t := &task.Task{ID: ids[i], Schedule: "*/5 * * * * *",
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
	shaped := make([][]byte, len(vals))
	for i, v := range vals {
		t, err := registry.DecodeFiring(ids[i], v)
		if err != nil {
			b.Fatal(err)
		}
		if shaped[i], err = encodeShape(&t); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct {
		name string
		vals [][]byte
	}{{"json", vals}, {"shape", shaped}} {
		b.Run("value="+bc.name, func(b *testing.B) {
			d := e.decoder()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := d.def(ids[i%len(ids)], bc.vals[i%len(ids)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
