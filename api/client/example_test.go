package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/task"
)

// A client creates a task, reads it back with its state from the owning
// node, and tells a missing task from other errors. (Not run: it needs a
// node at 127.0.0.1:8080.)
func ExampleClient() {
	ctx := context.Background()
	c := client.NewClient("http://127.0.0.1:8080", "") // the token, if the node requires one

	t, err := c.PutTask(ctx, &task.Task{
		ID:       "billing/invoice-42",
		Schedule: "0 */5 * * * *",
		Executor: task.Executor{Type: task.ExecutorHTTP, URL: "http://127.0.0.5/hook"},
	}, 0)
	if err != nil {
		fmt.Println(err) // an *task.ValidationError, or an *client.Error from the node
		return
	}
	fmt.Println("stored version", t.Version, "in partition", *t.Partition)

	got, err := c.GetTask(ctx, "billing/invoice-42")
	var ae *client.Error
	switch {
	case errors.As(err, &ae) && ae.Status == http.StatusNotFound:
		fmt.Println("deleted meanwhile")
	case err != nil:
		fmt.Println(err)
	case got.State != nil:
		fmt.Println("owner", got.State.Owner, "next fire", got.State.NextFireAt)
	}
}
