package main

import (
	"fmt"
	"io"
)

const readyHelp = `Usage: shardcron ready [flags]

Asks the node at --server whether it is ready (GET /readyz: it owns the
partitions the ring gives it and is not fenced). Prints "ready" (with
--output json: {"status": "ready"}, as /readyz answers) and exits 0 if so;
prints the node's reason on stderr and exits 1 otherwise. Meant for
container health checks, where no curl is at hand.

Example:
  shardcron ready --server http://127.0.0.1:8080 --timeout 3s
`

// runReady runs 'shardcron ready': args are the arguments after "ready".
func runReady(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron ready", readyHelp, stdout, stderr)
	var cf clientFlags
	cf.register(c)
	if code, done := c.parseClientOnly(args, &cf); done {
		return code
	}
	ctx, cancel := cf.ctx()
	defer cancel()
	if err := cf.client().Ready(ctx); err != nil {
		return cf.fail(c, "", err)
	}
	out := struct {
		Status string `json:"status"`
	}{"ready"}
	return printResult(c, &cf, out, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, out.Status)
		return err
	})
}
