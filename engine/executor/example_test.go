package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/shardcron/shardcron/engine/executor"
)

func ExampleNewHandler() {
	var handlers executor.Handlers
	handlers.Handle("billing.invoice", func(ctx context.Context, f executor.Fire) error {
		var p struct{ Customer int }
		if err := json.Unmarshal(f.Payload, &p); err != nil {
			return err
		}
		fmt.Printf("invoice customer %d, key %s, attempt %d\n", p.Customer, f.IdempotencyKey(), f.Attempt)
		return nil
	})

	e := executor.NewHandler(&handlers, "billing.invoice", json.RawMessage(`{"customer":42}`))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the task's timeout
	defer cancel()
	err := e.Execute(ctx, &executor.Fire{
		TaskID:      "billing/invoice-42",
		ScheduledAt: time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC),
		Attempt:     1,
		Node:        "node-a",
		Fence:       7,
	})
	fmt.Println("err:", err)

	err = executor.NewHandler(&handlers, "missing", nil).Execute(ctx, &executor.Fire{TaskID: "t"})
	fmt.Println("err:", err)
	// Output:
	// invoice customer 42, key billing/invoice-42@1774746000000, attempt 1
	// err: <nil>
	// err: handler "missing" is not registered on this node
}
