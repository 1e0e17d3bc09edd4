package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/task"
)

// bulkHelp is the part of the help of pause, resume, trigger and delete
// that explains selectors.
const bulkHelp = `
With --prefix, --label or --all instead of an ID, the command acts on every
task they choose (all labels must match) and prints how many it changed;
--dry-run only counts. A bulk delete (task delete) needs --yes: without
it, it only counts and exits 1 (0 when no task matches). Tasks are
changed in etcd transactions of up to 128 tasks, not all at once: if the
command fails midway, running it again finishes the job. --timeout
bounds the whole action: raise it for tens of thousands of tasks (a
pause of 50 000 tasks took longer than the default 30s on 2 cores). A
command cut by --timeout says that the node may have changed some of the
tasks.
`

// bulkFlags choose the tasks of a bulk action instead of a task ID.
type bulkFlags struct {
	prefix prefixFlag
	labels labelFlag
	all    bool
	dryRun bool
	yes    bool // delete only
}

func (b *bulkFlags) register(c *command, action task.BulkAction) {
	c.fs.Var(&b.prefix, "prefix", "act on every task whose id starts with `P` (instead of an ID)")
	c.fs.Var(&b.labels, "label", "act on every task with label `K=V` (repeatable: all must match)")
	c.fs.BoolVar(&b.all, "all", false, "act on every task of the cluster")
	c.fs.BoolVar(&b.dryRun, "dry-run", false, "with a selector: count the tasks and change nothing")
	if action == task.BulkDelete {
		c.fs.BoolVar(&b.yes, "yes", false, "confirm a bulk delete (without it, a bulk delete only counts)")
	}
}

func (b *bulkFlags) selected() bool { return b.prefix != "" || len(b.labels) > 0 || b.all }

// onTaskOrBulk is onTask for a command that also takes a selector: with
// --prefix, --label or --all it runs the bulk action instead of one.
//
// oneOnly names the command's flags that apply to one task only: given
// with a selector they are a usage error.
func onTaskOrBulk(c *command, args []string, action task.BulkAction, one func(ctx context.Context, cf *clientFlags, id string) int, oneOnly ...string) int {
	var cf clientFlags
	var b bulkFlags
	b.register(c, action)
	cf.register(c)
	pos, code, done := c.parseClient(args, &cf)
	if done {
		return code
	}
	if c.given("prefix") && b.prefix == "" {
		return c.usageError("--prefix is empty: give the start of the ids, or --all for every task")
	}
	if !b.selected() {
		if b.dryRun || b.yes {
			return c.usageError("--dry-run and --yes go with a selector: --prefix, --label or --all")
		}
		return withTaskID(c, &cf, pos, one)
	}
	if len(pos) > 0 {
		return c.usageError("give a task ID or a selector (--prefix, --label, --all), not both; got %q", pos[0])
	}
	for _, name := range oneOnly {
		if f := c.fs.Lookup(name); f != nil && f.Value.String() != f.DefValue {
			return c.usageError("--%s applies to one task (an ID), not to a selector", name)
		}
	}
	if b.all && (b.prefix != "" || len(b.labels) > 0) {
		return c.usageError("--all chooses every task: leave out --prefix and --label, or leave out --all")
	}
	sel := task.Selector{Prefix: string(b.prefix), Labels: b.labels, All: b.all, DryRun: b.dryRun}
	if f := c.fs.Lookup("note"); f != nil {
		sel.Note = f.Value.String() // a pause's, for every task it pauses
	}
	confirmed := action != task.BulkDelete || b.yes || b.dryRun
	if !confirmed {
		sel.DryRun = true
	}
	ctx, cancel := cf.ctx()
	defer cancel()
	res, err := cf.client().Bulk(ctx, action, sel)
	if err != nil {
		var ae *client.Error
		if sel.DryRun || errors.As(err, &ae) || neverSent(err) {
			// An answer of the node says what was done; a request that
			// never reached it changed nothing.
			return cf.fail(c, "", err)
		}
		// No answer: the node stops the action when the request is cut
		// (at --timeout, say), keeping the transactions it wrote.
		fmt.Fprintf(c.stderr, "%s\nthe node may have %s some of the tasks before the request was cut (it stops the action then, keeping whole transactions of up to 128 tasks): run the command again, with a larger --timeout, to finish the job (--dry-run counts what is left)\n",
			describeError(&cf, "", err), bulkPast[action])
		return exitError
	}
	switch {
	case !confirmed && res.Changed > 0:
		fmt.Fprintf(c.stderr, "%s: would delete %d %s%s; nothing was deleted: add --yes to delete them\n",
			c.name, res.Changed, plural(res.Changed, "task", "tasks"), sampleText(res))
		return exitError
	case !confirmed:
		res.DryRun = false // nothing to confirm: deleting no task is done
	}
	return printResult(c, &cf, res, func(w io.Writer) error { return writeBulk(w, res) })
}

// neverSent says whether err is a connection to the node that was never
// made (refused, a host that does not resolve, a dial cut by --timeout, a
// proxy that could not be reached or would not connect, a certificate the
// command does not trust): the request did not reach a node, so nothing
// was changed.
func neverSent(err error) bool {
	var oe *net.OpError
	var ce *tls.CertificateVerificationError
	return errors.As(err, &oe) && (oe.Op == "dial" || oe.Op == "proxyconnect") || errors.As(err, &ce)
}

var bulkPast = map[task.BulkAction]string{
	task.BulkPause: "paused", task.BulkResume: "resumed", task.BulkDelete: "deleted", task.BulkTrigger: "triggered",
}

// writeBulk prints a bulk result: "paused 550 of 550 matched tasks".
func writeBulk(w io.Writer, res *task.BulkResult) error {
	var b strings.Builder
	if res.DryRun {
		fmt.Fprintf(&b, "dry run: would have %s %d of %d matched tasks", bulkPast[res.Action], res.Changed, res.Matched)
	} else {
		fmt.Fprintf(&b, "%s %d of %d matched tasks", bulkPast[res.Action], res.Changed, res.Matched)
	}
	if res.Unchanged > 0 {
		fmt.Fprintf(&b, "; %d already were", res.Unchanged)
	}
	if res.Skipped > 0 {
		fmt.Fprintf(&b, "; %d changed meanwhile and no longer matched", res.Skipped)
	}
	b.WriteString(sampleText(res))
	_, err := fmt.Fprintln(w, b.String())
	return err
}

// sampleText names the first matched tasks: " (e.g. a, b, c, ...)".
func sampleText(res *task.BulkResult) string {
	if len(res.Sample) == 0 {
		return ""
	}
	more := ""
	if res.Matched > len(res.Sample) {
		more = ", ..."
	}
	return " (e.g. " + strings.Join(res.Sample, ", ") + more + ")"
}
