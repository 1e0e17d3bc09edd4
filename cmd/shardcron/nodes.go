package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/shardcron/shardcron/api/client"
)

const nodesHelp = `Usage: shardcron nodes [flags]

Lists the cluster's live nodes, as the node at --server sees them: address,
version, start time, partitions, tasks held and fire rate (fires per
second over about the last 10 s).

PARTITIONS is the count the ring assigns to the node; while partitions
move it shows owned/assigned. STATE is ready (owns its partitions),
starting, fenced (cut off from etcd: it fires nothing until it rejoins),
leaving (stopping: it hands its partitions over; its API stops first, so
its figures may be missing) or no answer (the node's own figures are
missing).

Example:
  shardcron nodes
  shardcron nodes --server http://node-1.internal:8080 --output json
`

// runNodes runs 'shardcron nodes': args are the arguments after "nodes".
func runNodes(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron nodes", nodesHelp, stdout, stderr)
	var cf clientFlags
	cf.register(c)
	if code, done := c.parseClientOnly(args, &cf); done {
		return code
	}
	ctx, cancel := cf.ctx()
	defer cancel()
	nodes, err := cf.client().Nodes(ctx)
	if err != nil {
		return cf.fail(c, "", err)
	}
	if nodes == nil {
		nodes = []client.Node{}
	}
	out := struct {
		Nodes []client.Node `json:"nodes"`
	}{nodes}
	return printResult(c, &cf, out, func(w io.Writer) error { return writeNodesTable(w, nodes) })
}

// writeNodesTable prints one row per node.
func writeNodesTable(w io.Writer, nodes []client.Node) error {
	tw := newTable(w)
	row(tw, "ID", "ADDR", "VERSION", "STARTED", "PARTITIONS", "TASKS", "FIRES/S", "STATE")
	for _, n := range nodes {
		parts := strconv.Itoa(n.Partitions)
		if n.Owned != nil && len(n.Owned) != n.Partitions {
			parts = fmt.Sprintf("%d/%d", len(n.Owned), n.Partitions)
		}
		tasks, rate := strconv.Itoa(n.Tasks), fmt.Sprintf("%.1f", n.FireRate)
		state := "ready"
		if n.Error != "" {
			tasks, rate = "-", "-"
		}
		switch {
		case n.Leaving:
			state = "leaving"
		case n.Error != "":
			state = "no answer"
		case n.Fenced:
			state = "fenced"
		case !n.Ready:
			state = "starting"
		}
		row(tw, n.ID, dash(n.APIAddr), dash(n.Version), formatTime(n.StartedAt), parts, tasks, rate, state)
	}
	return tw.Flush()
}
