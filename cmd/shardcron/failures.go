package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/shardcron/shardcron/api"
	"github.com/shardcron/shardcron/task"
)

// --- task failures ----------------------------------------------------------

const taskFailuresHelp = `Usage: shardcron task failures [--limit N] [flags]

Shows the cluster's latest failed or timed-out attempts, newest first (by
scheduled time), one row per attempt, from every node: each node keeps
its last 1000 in memory since it started. A node that does not answer is
named in a warning on stderr ("partial" in JSON).

Example:
  shardcron task failures --limit 50
`

func taskFailures(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task failures", taskFailuresHelp, stdout, stderr)
	var cf clientFlags
	var limit int
	c.fs.IntVar(&limit, "limit", defaultHistoryLimit, fmt.Sprintf("show the `N` latest failures (1-%d)", api.MaxFailuresLimit))
	cf.register(c)
	if code, done := c.parseClientOnly(args, &cf); done {
		return code
	}
	if limit < 1 || limit > api.MaxFailuresLimit {
		return c.usageError("--limit: %d is not from 1 to %d", limit, api.MaxFailuresLimit)
	}
	ctx, cancel := cf.ctx()
	defer cancel()
	fs, partial, err := cf.client().Failures(ctx, limit)
	if err != nil {
		return cf.fail(c, "", err)
	}
	if fs == nil {
		fs = []task.Execution{}
	}
	warnPartial(stderr, "failures", partial)
	out := struct {
		Failures []task.Execution `json:"failures"`
		Partial  []string         `json:"partial,omitempty"`
	}{fs, partial}
	none := "no failed attempts since the nodes started"
	if len(partial) > 0 {
		none = "no failed attempts on the nodes that answered, since they started"
	}
	return printResult(c, &cf, out, orNone(len(fs), none,
		func(w io.Writer) error { return writeFailuresTable(w, fs) }))
}

// writeFailuresTable prints failed attempts of any task, newest first.
func writeFailuresTable(w io.Writer, execs []task.Execution) error {
	tw := newTable(w)
	row(tw, "SCHEDULED", "TASK", "ATTEMPT", "STATUS", "NODE", "ERROR")
	for _, e := range execs {
		row(tw, formatTime(e.ScheduledAt), e.TaskID, strconv.Itoa(e.Attempt), dash(e.Status), dash(e.Node),
			dash(truncate(e.Error, maxErrorWidth)))
	}
	return tw.Flush()
}
