package store_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/shardcron/shardcron/store"
	"github.com/shardcron/shardcron/task"
)

func Example() {
	dir, _ := os.MkdirTemp("", "store-example")
	defer os.RemoveAll(dir)
	s, err := store.Open(store.DefaultConfig(dir))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	// After a full read of partition 7 at etcd revision 100 (a created at
	// 90), then a watch event at 101 (b created).
	_ = s.Reset(7, 100, []store.KV{{ID: "a", Value: []byte(`{"id":"a"}`), Created: 90}})
	_ = s.Apply(7, 101, []store.KV{{ID: "b", Value: []byte(`{"id":"b"}`), Created: 101}}, nil)

	// On restart: tasks from the cache, then watch from rev+1.
	rev, _ := s.Partition(7, func(id string, value []byte, created int64) error {
		fmt.Printf("%s %s created at %d\n", id, value, created)
		return nil
	})
	fmt.Println("watch from", rev+1)

	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s.Record(task.Execution{TaskID: "a", ScheduledAt: at, Attempt: 1, Node: "n1", Status: task.ExecutionFailed, Error: "HTTP 503"})
	s.Record(task.Execution{TaskID: "a", ScheduledAt: at, Attempt: 2, Node: "n1", Status: task.ExecutionOK})
	_ = s.Flush(context.Background())
	h, _ := s.History("a", 10)
	for _, e := range h {
		fmt.Println(e.ScheduledAt.Format(time.RFC3339), e.Attempt, e.Status, e.Error != "")
	}
	// Output:
	// a {"id":"a"} created at 90
	// b {"id":"b"} created at 101
	// watch from 102
	// 2030-01-01T00:00:00Z 2 ok false
	// 2030-01-01T00:00:00Z 1 failed true
}
