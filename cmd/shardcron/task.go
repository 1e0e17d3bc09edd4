package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardcron/shardcron/api"
	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/registry"
	"github.com/shardcron/shardcron/task"
)

const taskHelp = `Usage: shardcron task SUBCOMMAND [flags] [ARGS]

Creates, reads and changes tasks through a node's HTTP API.

Subcommands:
  put       create or replace a task, from a JSON file (-f) or from flags
  get       show one task and its owner's state
  list      list tasks, by id prefix, labels and status (failing, paused, stale)
  export    write tasks as JSON Lines that 'shardcron import' reads back
  delete    delete a task, or every task of a prefix or labels
  pause     stop a task from firing, keeping its definition (or many: --label, --prefix)
  resume    let a paused task fire again (or many)
  trigger   fire a task once now, outside its schedule (or many)
  backfill  run every scheduled time of a task in a past range once
  history   show a task's execution records, newest first
  failures  show the cluster's latest failed attempts, newest first

Run 'shardcron task SUBCOMMAND --help' for a subcommand's flags.

Example:
  shardcron task put --id backup/db --schedule '0 3 * * *' --url http://127.0.0.1:9000/backup
  shardcron task list --prefix backup/
`

// runTask runs 'shardcron task ...': args are the arguments after "task".
// It returns the exit code: 0 done, 1 the request failed, 2 a usage error.
func runTask(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, "shardcron task: missing subcommand\n\n%s", taskHelp)
		return exitUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "put":
		return taskPut(rest, stdin, stdout, stderr)
	case "get":
		return taskGet(rest, stdout, stderr)
	case "list", "ls":
		return taskList(rest, stdout, stderr)
	case "export":
		return taskExport(rest, stdout, stderr)
	case "delete", "rm":
		return taskDelete(rest, stdout, stderr)
	case "pause":
		return taskSetPaused(rest, true, stdout, stderr)
	case "resume":
		return taskSetPaused(rest, false, stdout, stderr)
	case "trigger":
		return taskTrigger(rest, stdout, stderr)
	case "backfill":
		return taskBackfill(rest, stdout, stderr)
	case "history":
		return taskHistory(rest, stdout, stderr)
	case "failures":
		return taskFailures(rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" && !strings.HasPrefix(rest[0], "-") {
			return runTask([]string{rest[0], "--help"}, stdin, stdout, stderr)
		}
		fmt.Fprint(stdout, taskHelp)
		return exitOK
	}
	fmt.Fprintf(stderr, "shardcron task: unknown subcommand %q\n\n%s", sub, taskHelp)
	return exitUsage
}

// taskID checks the positional arguments of a subcommand that takes
// exactly one task id.
func taskID(c *command, pos []string) (string, int, bool) {
	switch {
	case len(pos) == 0:
		return "", c.usageError("missing the task ID"), false
	case len(pos) > 1:
		return "", c.tooManyArgs("task ID", pos), false
	case pos[0] == "":
		return "", c.usageError("the task ID is empty"), false
	}
	return pos[0], 0, true
}

// subject names a task in error messages: `task "billing/invoice-42"`.
func subject(id string) string { return "task " + strconv.Quote(id) }

// onTask runs a subcommand that takes one task id and the client flags
// (registered after c's own): it parses args, then calls do with the id and
// the context of the one request do makes, and returns do's exit code.
func onTask(c *command, args []string, do func(ctx context.Context, cf *clientFlags, id string) int) int {
	var cf clientFlags
	cf.register(c)
	pos, code, done := c.parseClient(args, &cf)
	if done {
		return code
	}
	return withTaskID(c, &cf, pos, do)
}

// withTaskID checks that pos is one task id and calls do with it.
func withTaskID(c *command, cf *clientFlags, pos []string, do func(ctx context.Context, cf *clientFlags, id string) int) int {
	id, code, ok := taskID(c, pos)
	if !ok {
		return code
	}
	ctx, cancel := cf.ctx()
	defer cancel()
	return do(ctx, cf, id)
}

// printResult prints a command's result: v as JSON with --output json,
// else what table prints.
func printResult(c *command, cf *clientFlags, v any, table func(io.Writer) error) int {
	var err error
	if cf.output == outputJSON {
		err = writeJSON(c.stdout, v)
	} else {
		err = table(c.stdout)
	}
	if err != nil {
		fmt.Fprintf(c.stderr, "shardcron: write output: %v\n", err)
		return exitError
	}
	return exitOK
}

// --- task put ---------------------------------------------------------------

const taskPutHelp = `Usage: shardcron task put -f FILE [--if-match VERSION | --force] [--dry-run] [flags]
       shardcron task put --id ID --schedule SPEC EXECUTOR [--dry-run] [flags]

Creates a task, or replaces the task with the same id, and prints its new
version. The task comes either from a JSON file (docs/api.md "Task JSON"; '-'
reads stdin) or from flags, never from both. A replace is whole: a paused
task put again without --paused (or "paused": true) is resumed.

From flags, the executor is one of:
  --url URL [--method M] [--header K=V]... [--body B]   http
  --command ARG [--command ARG]... [--env K=V]...        exec (argv, in order)
  --handler NAME [--payload JSON]                        handler
  --noop                                                 noop
Fields left out take the server's defaults (timeout 1m, one attempt,
misfire fire_once, catch-up window 1m, concurrency allow). The task is
checked here first for a quick error; the server has the last word.

--if-match VERSION replaces the task only if its version is still VERSION
(optimistic concurrency); otherwise nothing changes and the command fails.
With -f, a "version" in the file (as 'task get --output json' prints it)
is that condition: a task changed by someone else since it was read is not
overwritten. --force replaces it whatever its version.

A task that only some live nodes can run (exec, a handler) is written
with a warning on stderr; one that no live node can run is refused.

--on-success ID and --on-failure ID (repeatable) chain tasks: when a fire
ends after its last attempt, the target is triggered with the idempotency
key "<target>@<this fire's scheduled ms>". A chain that would form a cycle
is refused, and so is a target that does not exist unless --allow-missing.

--dry-run has the server check the task as a put would (If-Match
included) and prints its next 5 fire times; nothing is written.

A task may fire within a window (--not-before, --not-after: RFC 3339
times), at most --max-fires times (its first N scheduled times from
--not-before, or from its creation), or once ("--schedule '@at
2027-01-01T00:00:00Z'"); --delete-after-fire deletes such a task once its
last fire ended.

Examples:
  shardcron task put -f invoice.json
  shardcron task put --id billing/invoice-42 --schedule '0 */5 * * * *' \
      --timezone Europe/Berlin --url https://hooks.example.com/invoice --header X-Team=billing \
      --max-attempts 3 --backoff 1s --label team=billing
  shardcron task put --id backup/db --schedule '@daily' --command /usr/bin/backup --command --full
      # an exec task: a live node must run with --allow-exec (and an --exec-allow that admits it)
  shardcron task get billing/invoice-42 --output json | jq '.paused=true' | shardcron task put -f -
  shardcron task put --id report/q4 --schedule '@at 2027-01-01T09:00:00' --timezone Europe/Berlin \
      --url https://hooks.example.com/report --delete-after-fire
  shardcron task put -f invoice.json --dry-run
`

// putFlags are the flags of 'task put'.
type putFlags struct {
	file    string
	ifMatch int64
	force   bool

	id, schedule, timezone string
	url, method, body      string
	headers, env           kvFlag
	command                listFlag
	handler, payload       string
	noop                   bool
	taskTimeout            time.Duration
	maxAttempts            int
	backoff, maxBackoff    time.Duration
	misfire                string
	catchupWindow          time.Duration
	concurrency            string
	jitter                 time.Duration
	paused                 bool
	labels                 labelFlag
	onSuccess, onFailure   listFlag
	allowMissing           bool

	// Windows and one-shot tasks, and the dry run.
	notBefore, notAfter string
	maxFires            int
	deleteAfterFire     bool
	dryRun              bool
}

// fieldFlags maps a task JSON field to the flag that sets it, so that a
// validation error names what the user typed.
var fieldFlags = map[string]string{
	"id": "--id", "schedule": "--schedule", "timezone": "--timezone",
	"executor.url": "--url", "executor.method": "--method", "executor.headers": "--header",
	"executor.body": "--body", "executor.command": "--command", "executor.env": "--env",
	"executor.name": "--handler", "executor.payload": "--payload",
	"timeout": "--task-timeout", "retry.max_attempts": "--max-attempts", "retry.backoff": "--backoff",
	"retry.max_backoff": "--max-backoff", "misfire": "--misfire", "catchup_window": "--catchup-window",
	"concurrency": "--concurrency", "jitter": "--jitter", "labels": "--label",
	"on_success": "--on-success", "on_failure": "--on-failure",
	"not_before": "--not-before", "not_after": "--not-after", "max_fires": "--max-fires",
	"delete_after_fire": "--delete-after-fire",
}

func (p *putFlags) register(c *command) {
	fs := c.fs
	fs.StringVar(&p.file, "f", "", "read the task from `FILE` (JSON; '-' = stdin) instead of the task flags")
	fs.StringVar(&p.file, "file", "", "alias of --f")
	fs.Int64Var(&p.ifMatch, "if-match", 0, "replace only if the stored task has this `VERSION` (left out: with -f the file's \"version\", else none)")
	fs.BoolVar(&p.force, "force", false, "with -f, replace the task whatever its version (ignore the file's \"version\")")
	fs.StringVar(&p.id, "id", "", "task `ID`: 1-256 bytes of UTF-8 (required)")
	fs.StringVar(&p.schedule, "schedule", "", "cron `SPEC` with 5 or 6 fields, or @hourly, @every 30s, ... (required)")
	fs.StringVar(&p.timezone, "timezone", "", "IANA time `ZONE` of the schedule (server default UTC)")
	fs.StringVar(&p.url, "url", "", "http executor: the `URL` to call")
	fs.StringVar(&p.method, "method", "", "http executor: the HTTP `METHOD` (server default POST)")
	fs.Var(&p.headers, "header", "http executor: add a request header `K=V` (repeatable)")
	fs.StringVar(&p.body, "body", "", "http executor: the request `BODY`")
	fs.Var(&p.command, "command", "exec executor: the next `ARG` of the argv, argv[0] first (repeatable)")
	fs.Var(&p.env, "env", "exec executor: add an environment variable `K=V` (repeatable)")
	fs.StringVar(&p.handler, "handler", "", "handler executor: the in-process handler's `NAME`")
	fs.StringVar(&p.payload, "payload", "", "handler executor: a `JSON` value passed to the handler")
	fs.BoolVar(&p.noop, "noop", false, "noop executor: fire and do nothing (for tests and benchmarks)")
	fs.DurationVar(&p.taskTimeout, "task-timeout", 0, "how long one attempt may run, at most 24h (server default 1m); --timeout is the request's")
	fs.IntVar(&p.maxAttempts, "max-attempts", 0, "attempts per fire, counting the first, at most 100 (server default 1)")
	fs.DurationVar(&p.backoff, "backoff", 0, "delay before the first retry, doubled per retry; each wait is between half and all of it (jitter); at most 24h (server default 1s)")
	fs.DurationVar(&p.maxBackoff, "max-backoff", 0, "cap of the retry delay, at most 24h and not under --backoff (server default 1m)")
	fs.StringVar(&p.misfire, "misfire", "", "misfire `POLICY`: fire_once, skip or fire_all (server default fire_once)")
	fs.DurationVar(&p.catchupWindow, "catchup-window", 0, "missed fires older than this never run, at most 24h (server default 1m)")
	fs.StringVar(&p.concurrency, "concurrency", "", "`POLICY` while the previous fire runs: allow, forbid, buffer_one or replace (server default allow)")
	fs.DurationVar(&p.jitter, "jitter", 0, "delay each fire by a deterministic amount below this, derived from the id and the scheduled time: at most 1h, and shorter than the schedule's shortest interval (default 0: none)")
	fs.BoolVar(&p.paused, "paused", false, "create the task paused")
	fs.Var(&p.labels, "label", "add a label `K=V` (repeatable; K is 1-63 bytes of A-Z a-z 0-9 . _ / -, V at most 256 bytes)")
	fs.Var(&p.onSuccess, "on-success", "trigger the task `ID` when a fire succeeds (repeatable, at most 16)")
	fs.Var(&p.onFailure, "on-failure", "trigger the task `ID` when a fire fails after its last attempt (repeatable, at most 16)")
	fs.BoolVar(&p.allowMissing, "allow-missing", false, "let --on-success/--on-failure (or on_success/on_failure in -f) name tasks that do not exist yet")
	fs.StringVar(&p.notBefore, "not-before", "", "no fire before this RFC 3339 `TIME`")
	fs.StringVar(&p.notAfter, "not-after", "", "no fire after this RFC 3339 `TIME`")
	fs.IntVar(&p.maxFires, "max-fires", 0, "fire at most the first `N` scheduled times, from --not-before or the task's creation (1-10000)")
	fs.BoolVar(&p.deleteAfterFire, "delete-after-fire", false, "delete the task once its last fire ended (@at, --not-after or --max-fires)")
	fs.BoolVar(&p.dryRun, "dry-run", false, "have the server check the task and print its next 5 fire times; write nothing")
}

// taskFlagNames are the flags that set task fields (all but -f and
// --if-match).
var taskFlagNames = []string{"id", "schedule", "timezone", "url", "method", "header", "body", "command", "env",
	"handler", "payload", "noop", "task-timeout", "max-attempts", "backoff", "max-backoff", "misfire",
	"catchup-window", "concurrency", "jitter", "paused", "label", "on-success", "on-failure",
	"not-before", "not-after", "max-fires", "delete-after-fire"}

// build makes a Task from the flags. set holds the flags given on the
// command line. Zero-valued flags are left out of the task so that the
// server applies its defaults; an explicit zero where zero is not a value
// is refused rather than silently turned into the default. A non-empty
// result is a usage error.
func (p *putFlags) build(set map[string]bool) (*task.Task, string) {
	var missing []string
	if p.id == "" {
		missing = append(missing, "--id")
	}
	if p.schedule == "" {
		missing = append(missing, "--schedule")
	}
	var kinds []string
	t := &task.Task{ID: p.id, Schedule: p.schedule, Timezone: p.timezone, Paused: p.paused}
	x := &t.Executor
	if set["url"] {
		kinds = append(kinds, "--url")
		x.Type = task.ExecutorHTTP
	}
	if set["command"] {
		kinds = append(kinds, "--command")
		x.Type = task.ExecutorExec
	}
	if set["handler"] {
		kinds = append(kinds, "--handler")
		x.Type = task.ExecutorHandler
	}
	if p.noop {
		kinds = append(kinds, "--noop")
		x.Type = task.ExecutorNoop
	}
	switch {
	case len(kinds) == 0:
		missing = append(missing, "an executor (--url, --command, --handler or --noop)")
	case len(kinds) > 1:
		return nil, fmt.Sprintf("%s: a task has one executor, choose one", strings.Join(kinds, " and "))
	}
	if len(missing) > 0 {
		return nil, "missing " + joinAnd(missing) + " (or give the task as JSON with -f FILE)"
	}
	x.URL, x.Method, x.Body = p.url, p.method, p.body
	x.Command, x.Name = p.command, p.handler
	if len(p.headers) > 0 {
		x.Headers = p.headers
	}
	if len(p.env) > 0 {
		x.Env = p.env
	}
	if set["payload"] {
		if !json.Valid([]byte(p.payload)) {
			return nil, fmt.Sprintf("--payload: %q is not JSON (a string needs quotes: --payload '\"x\"')", p.payload)
		}
		x.Payload = json.RawMessage(p.payload)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		dst  *task.Duration
	}{
		{"task-timeout", p.taskTimeout, &t.Timeout},
		{"backoff", p.backoff, &t.Retry.Backoff},
		{"max-backoff", p.maxBackoff, &t.Retry.MaxBackoff},
		{"catchup-window", p.catchupWindow, &t.CatchupWindow},
	} {
		if set[d.name] && d.v <= 0 {
			return nil, fmt.Sprintf("--%s: %s is not more than 0 (leave the flag out for the default)", d.name, d.v)
		}
		*d.dst = task.Duration(d.v)
	}
	if set["jitter"] && p.jitter < 0 {
		return nil, fmt.Sprintf("--jitter: %s is negative", p.jitter)
	}
	t.Jitter = task.Duration(p.jitter)
	if set["max-attempts"] && p.maxAttempts < 1 {
		return nil, fmt.Sprintf("--max-attempts: %d is less than 1 (leave the flag out for the default)", p.maxAttempts)
	}
	t.Retry.MaxAttempts = p.maxAttempts
	t.Misfire = task.MisfirePolicy(p.misfire)
	t.Concurrency = task.ConcurrencyPolicy(p.concurrency)
	if len(p.labels) > 0 {
		t.Labels = p.labels
	}
	t.OnSuccess, t.OnFailure = p.onSuccess, p.onFailure
	for _, w := range []struct {
		name, v string
		dst     *time.Time
	}{{"not-before", p.notBefore, &t.NotBefore}, {"not-after", p.notAfter, &t.NotAfter}} {
		if !set[w.name] {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, w.v)
		if err != nil {
			return nil, fmt.Sprintf("--%s: %q is not an RFC 3339 time such as 2027-01-01T00:00:00Z", w.name, w.v)
		}
		*w.dst = at
	}
	if set["max-fires"] && p.maxFires < 1 {
		return nil, fmt.Sprintf("--max-fires: %d is less than 1 (leave the flag out for no limit)", p.maxFires)
	}
	t.MaxFires, t.DeleteAfterFire = p.maxFires, p.deleteAfterFire
	return t, ""
}

// joinAnd joins "a", "b" and "c" as "a, b and c".
func joinAnd(s []string) string {
	if len(s) <= 1 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// flagError rewrites a validation error of a task built from flags to name
// the flag ("--max-attempts (retry.max_attempts): ...").
func flagError(err error) error {
	var ve *task.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	if f, ok := fieldFlags[ve.Field]; ok {
		return fmt.Errorf("%s (%s): %s", f, ve.Field, ve.Reason)
	}
	return err
}

func taskPut(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task put", taskPutHelp, stdout, stderr)
	var cf clientFlags
	var p putFlags
	p.register(c)
	cf.register(c)
	pos, code, done := c.parseClient(args, &cf)
	if done {
		return code
	}
	if len(pos) > 0 {
		return c.usageError("unexpected argument %q (the task comes from -f FILE or from flags)", pos[0])
	}
	set := map[string]bool{}
	c.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := checkIfMatch(p.ifMatch, set["if-match"]); err != "" {
		return c.usageError("%s", err)
	}

	if p.force && set["if-match"] {
		return c.usageError("--force and --if-match contradict each other: give one")
	}
	if set["f"] || set["file"] {
		for _, n := range taskFlagNames {
			if set[n] {
				return c.usageError("--%s cannot be combined with -f: the task comes from the file or from flags", n)
			}
		}
		return putFromFile(c, &cf, p.file, client.PutOptions{IfVersion: p.ifMatch, AllowMissingTargets: p.allowMissing}, p.force, p.dryRun, stdin)
	}
	if p.force {
		return c.usageError("--force applies to -f only: a task from flags has no version")
	}
	t, msg := p.build(set)
	if msg != "" {
		return c.usageError("%s", msg)
	}
	// Validate a copy: it fills in defaults, and the server should apply
	// its own to what the user left out. What it refuses is a flag's value:
	// a usage error, as the flags' own checks are.
	check := *t
	if err := check.Validate(); err != nil {
		return c.usageError("%s: %v", subject(t.ID), flagError(err))
	}
	ctx, cancel := cf.ctx()
	defer cancel()
	o := client.PutOptions{IfVersion: p.ifMatch, AllowMissingTargets: p.allowMissing}
	if p.dryRun {
		d, err := cf.client().CheckTask(ctx, t, o)
		if err != nil {
			return cf.fail(c, subject(t.ID), err)
		}
		return printDryRun(c, &cf, d)
	}
	got, err := cf.client().PutTaskWith(ctx, t, o)
	if err != nil {
		return cf.fail(c, subject(t.ID), err)
	}
	return printPut(c, &cf, got)
}

// printDryRun prints what a dry run answered: the task would be written,
// and its next fire times.
func printDryRun(c *command, cf *clientFlags, d *client.DryRun) int {
	return printResult(c, cf, d, func(w io.Writer) error {
		if _, err := fmt.Fprintf(w, "dry run: %s is valid; nothing was written\n", subject(d.Task.ID)); err != nil {
			return err
		}
		return writePreview(w, d.Preview)
	})
}

// previewEndText says why a preview lists fewer times than asked for.
var previewEndText = map[string]string{
	task.EndedNotAfter: "then none: the window ends (not_after)",
	task.EndedMaxFires: "then none: max_fires is reached",
	task.EndedAt:       "its only one (@at)",
}

// writePreview prints a preview's times, one a line.
func writePreview(w io.Writer, p *client.Preview) error {
	if p == nil {
		return nil
	}
	times := "times"
	if len(p.Next) == 1 {
		times = "time"
	}
	head := fmt.Sprintf("next %d fire %s (%s)", len(p.Next), times, p.Timezone)
	if len(p.Next) == 0 {
		head = "no fire to come"
	}
	if p.Ended != "" {
		head += ", " + previewEndText[p.Ended]
	}
	head += ":"
	if _, err := fmt.Fprintln(w, head); err != nil {
		return err
	}
	for i, at := range p.Next {
		line := "  " + at
		if i < len(p.Due) {
			line += "  (with jitter: " + p.Due[i] + ")"
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// putFromFile sends the file's JSON as it is, so that the server decodes
// exactly what the user wrote (unknown fields included) and the client
// needs to know no more of the task than its id.
//
// The file's "version", unless force or an explicit ifMatch, is sent as
// If-Match: a task read, edited and put back is not written over a change
// made in between.
func putFromFile(c *command, cf *clientFlags, file string, o client.PutOptions, force, dryRun bool, stdin io.Reader) int {
	ifMatch := o.IfVersion
	var data []byte
	var err error
	name := file
	if file == "-" {
		name = "stdin"
		data, err = io.ReadAll(io.LimitReader(stdin, task.MaxTaskSize+1))
	} else {
		data, err = readFileLimited(file, task.MaxTaskSize+1)
	}
	if err != nil {
		fmt.Fprintf(c.stderr, "shardcron: %v\n", err)
		return exitError
	}
	if len(data) > task.MaxTaskSize {
		fmt.Fprintf(c.stderr, "shardcron: %s: a task is at most 64 KiB of JSON\n", name)
		return exitError
	}
	data = bytes.TrimPrefix(data, utf8BOM) // editors on Windows begin a file with it, as import takes it
	var head struct {
		ID      json.RawMessage `json:"id"`
		Version json.RawMessage `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		var se *json.SyntaxError
		switch {
		case jsonValues(data) > 1:
			fmt.Fprintf(c.stderr, "shardcron: %s: not a task: more than one JSON value, want one JSON object (shardcron import takes many tasks, one a line)\n", name)
		case errors.As(err, &se):
			fmt.Fprintf(c.stderr, "shardcron: %s: malformed JSON at byte %d: %v\n", name, se.Offset, err)
		default:
			fmt.Fprintf(c.stderr, "shardcron: %s: not a task: want one JSON object (shardcron import takes many tasks, one a line)\n", name)
		}
		return exitError
	}
	var id string
	if len(head.ID) == 0 || json.Unmarshal(head.ID, &id) != nil || id == "" {
		fmt.Fprintf(c.stderr, "shardcron: %s: the task has no \"id\" (a string, required)\n", name)
		return exitError
	}
	if ifMatch == 0 && !force && len(head.Version) > 0 && string(head.Version) != "null" {
		if err := json.Unmarshal(head.Version, &ifMatch); err != nil || ifMatch < 0 {
			fmt.Fprintf(c.stderr, "shardcron: %s: \"version\" is %s, not a task version (a positive integer)\n", name, head.Version)
			return exitError
		}
	}
	ctx, cancel := cf.ctx()
	defer cancel()
	o.IfVersion = ifMatch
	if dryRun {
		d, err := cf.client().CheckTaskJSON(ctx, id, data, o)
		if err != nil {
			return cf.fail(c, subject(id), err)
		}
		return printDryRun(c, cf, d)
	}
	got, err := cf.client().PutTaskJSONWith(ctx, id, data, o)
	if err != nil {
		return cf.failWithHint(c, subject(id), err, http.StatusPreconditionFailed,
			fmt.Sprintf("version %d is not the task's: it changed since it was read, or is gone (get it again, or put with --force to overwrite)", ifMatch))
	}
	return printPut(c, cf, got)
}

// jsonValues counts the JSON values in data, one after the other (JSON
// Lines), or returns 0 when data is not such a sequence.
func jsonValues(data []byte) int {
	dec := json.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		var v json.RawMessage
		switch err := dec.Decode(&v); {
		case errors.Is(err, io.EOF):
			return n
		case err != nil:
			return 0
		}
		n++
	}
}

// readFileLimited reads at most limit bytes of a file: enough to tell that
// it is too large without reading a huge file whole.
func readFileLimited(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

func printPut(c *command, cf *clientFlags, t *task.Task) int {
	return printResult(c, cf, t, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "put %s: version %d\n", subject(t.ID), t.Version)
		return err
	})
}

// --- task get ---------------------------------------------------------------

const taskGetHelp = `Usage: shardcron task get ID [flags]

Shows a task: its definition, its partition and version, and the state
its owning node reports (next and last fire, counters since the owner
took the partition). --output json prints the API's JSON, which
'task put -f' accepts back.

Example:
  shardcron task get billing/invoice-42
  shardcron task get billing/invoice-42 --output json
`

func taskGet(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task get", taskGetHelp, stdout, stderr)
	return onTask(c, args, func(ctx context.Context, cf *clientFlags, id string) int {
		t, err := cf.client().GetTask(ctx, id)
		if err != nil {
			return cf.fail(c, subject(id), err)
		}
		return printResult(c, cf, t, func(w io.Writer) error { return writeTaskDetail(w, t) })
	})
}

// --- task list --------------------------------------------------------------

const taskListHelp = `Usage: shardcron task list [--prefix P] [--label K=V]... [--status S] [--limit N] [--cursor C] [--all] [flags]

Lists tasks one page at a time, ordered by id (byte order): without --all
it prints one page and, when there are more, says how to get the next.
A page holds --limit tasks (at most 10000), fewer only at the end; the
cursor of the next page is the last id of this one. --all follows
the pages to the end. Each task comes with its state from the node that
owns it (NEXT FIRE). With --output json it prints the API's answer,
{"tasks": [...], "next_cursor": "..."}; with --all, every task in one
"tasks" array and an empty cursor.

--status keeps the tasks whose owners see them so: failing (the last
fire failed after its last attempt), paused, or stale (no fire succeeded
within two of the schedule's intervals); the table then shows their
health: failures in a row, last success, last failure and its error.
When a node does not answer, its tasks are missing and a warning on
stderr says so ("partial" in JSON).

Examples:
  shardcron task list --prefix billing/
  shardcron task list --status failing
  shardcron task list --label team=billing --status stale --all
  shardcron task list --label team=billing --all --output json | jq -r '.tasks[].id'
`

func taskList(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task list", taskListHelp, stdout, stderr)
	var cf clientFlags
	var status string
	var cursor cursorFlag
	var prefix prefixFlag
	var labels labelFlag
	var limit int
	var all bool
	c.fs.Var(&prefix, "prefix", "only tasks whose id starts with `P`")
	c.fs.StringVar(&status, "status", "", "only tasks with status `S`: failing, paused or stale")
	c.fs.Var(&labels, "label", "only tasks with label `K=V` (repeatable: all must match)")
	c.fs.IntVar(&limit, "limit", 0, fmt.Sprintf("`N` tasks per page, at most %d (0: the server's page size, %d)", registry.MaxListLimit, registry.DefaultListLimit))
	c.fs.Var(&cursor, "cursor", "start at the cursor `C`, the next_cursor of a previous page")
	c.fs.BoolVar(&all, "all", false, "follow next_cursor and list every matching task")
	cf.register(c)
	pos, code, done := c.parseClient(args, &cf)
	if done {
		return code
	}
	if len(pos) > 0 {
		return c.usageError("unexpected argument %q (filter with --prefix or --label)", pos[0])
	}
	if limit < 0 || limit > registry.MaxListLimit {
		return c.usageError("--limit: %d is not within 0-%d", limit, registry.MaxListLimit)
	}
	if status != "" {
		if _, err := task.ParseStatus(status); err != nil {
			return c.usageError("--status: %s", strings.TrimPrefix(err.Error(), "status: "))
		}
	}
	cl := cf.client()
	opts := client.ListOptions{Prefix: string(prefix), Labels: labels, Limit: limit, Cursor: string(cursor), Status: status, State: true}
	var tasks []*task.Task
	var partial []string
	for {
		ctx, cancel := cf.ctx()
		page, err := cl.ListPage(ctx, opts)
		cancel()
		if err != nil {
			return cf.fail(c, "", err)
		}
		tasks = append(tasks, page.Tasks...)
		for _, p := range page.Partial {
			if !slices.Contains(partial, p) {
				partial = append(partial, p)
			}
		}
		opts.Cursor = page.NextCursor
		if !all || opts.Cursor == "" {
			break
		}
	}
	if tasks == nil {
		tasks = []*task.Task{} // "tasks": [] rather than null
	}
	warnPartial(stderr, "tasks", partial)
	out := listResult{Tasks: tasks, NextCursor: opts.Cursor, Partial: partial}
	table := func(w io.Writer) error { return writeTaskTable(w, tasks) }
	if status != "" {
		table = func(w io.Writer) error { return writeHealthTable(w, tasks) }
	}
	none := "no tasks yet"
	switch filtered := prefix != "" || len(labels) > 0 || status != "" || cursor != ""; {
	case filtered && len(partial) > 0:
		none = "no tasks match on the nodes that answered"
	case len(partial) > 0:
		none = "no tasks on the nodes that answered"
	case filtered:
		none = "no tasks match"
	}
	rc := printResult(c, &cf, out, orNone(len(tasks), none, table))
	if rc == exitOK && cf.output == outputTable && opts.Cursor != "" {
		fmt.Fprintf(stderr, "more tasks: list them all with --all, or the next page with --cursor %s\n", shellQuote(opts.Cursor))
	}
	return rc
}

// listResult is the JSON of 'task list': the API's list answer.
type listResult struct {
	Tasks      []*task.Task `json:"tasks"`
	NextCursor string       `json:"next_cursor"` // "" after the last page
	Partial    []string     `json:"partial,omitempty"`
}

// --- task export ------------------------------------------------------------

const taskExportHelp = `Usage: shardcron task export [--prefix P] [--label K=V]... [flags] > tasks.jsonl

Writes every matching task (all of them by default) to stdout as
JSON Lines, one task per line, as stored, which 'shardcron import' reads
back unchanged (into this cluster or another one). The node reads all of them
from one etcd revision, so the export is a consistent snapshot however
long it takes and whatever is written meanwhile. With --prefix or
--label the lines are ordered by id; the whole fleet comes in etcd's key
order (by partition, then id), read in one pass without the index, which
is about twice as fast. --timeout bounds the wait for the first task
(or, when none matches, for the whole answer), not the export's length:
an export of millions of tasks runs until it is done. At the end it prints
"exported N tasks" on stderr. One cut off (the node gone; Ctrl-C or
SIGTERM, a second one at once) exits 1 saying how many whole tasks stdout
holds and whether a partial line, part of the next task, ends it.

Examples:
  shardcron task export > fleet.jsonl
  shardcron task export --label team=billing | shardcron import --server http://other:8080 -
`

func taskExport(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task export", taskExportHelp, stdout, stderr)
	var cf clientFlags
	var prefix prefixFlag
	var labels labelFlag
	c.fs.Var(&prefix, "prefix", "only tasks whose id starts with `P`")
	c.fs.Var(&labels, "label", "only tasks with label `K=V` (repeatable: all must match)")
	cf.register(c)
	pos, code, done := c.parseClient(args, &cf)
	if done {
		return code
	}
	if len(pos) > 0 {
		return c.usageError("unexpected argument %q (filter with --prefix or --label; the tasks go to stdout)", pos[0])
	}
	// Ctrl-C (or SIGTERM) stops the export as a cut connection does:
	// how far it got is printed. A second one kills it, as import's.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	lines := &lineCounter{w: stdout}
	bw := bufio.NewWriterSize(lines, 256<<10)
	err := cf.streamClient().Export(ctx, client.ListOptions{Prefix: string(prefix), Labels: labels}, bw)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		if ctx.Err() != nil {
			err = errors.New("export interrupted")
		}
		code := cf.fail(c, "", err)
		switch {
		case lines.partial:
			fmt.Fprintf(stderr, "export stopped after %d whole %s: stdout holds %s, then a partial last line, part of the next task "+
				"(the export is incomplete; an import reports that line as an error)\n",
				lines.n, plural(lines.n, "task", "tasks"), plural(lines.n, "it", "them"))
		case lines.n > 0:
			fmt.Fprintf(stderr, "export stopped after %d %s: stdout holds %s (the export is incomplete)\n",
				lines.n, plural(lines.n, "task", "tasks"), plural(lines.n, "it", "them"))
		}
		return code
	}
	fmt.Fprintf(stderr, "exported %d %s\n", lines.n, plural(lines.n, "task", "tasks"))
	return exitOK
}

// lineCounter counts the lines written through it.
type lineCounter struct {
	w       io.Writer
	n       int
	partial bool // what was written ends within a line
}

func (l *lineCounter) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	l.n += bytes.Count(p[:n], []byte{'\n'})
	if n > 0 {
		l.partial = p[n-1] != '\n'
	}
	return n, err
}

// --- task delete, pause, resume ------------------------------------------------

const taskDeleteHelp = `Usage: shardcron task delete ID [--if-match VERSION] [flags]
       shardcron task delete (--prefix P | --label K=V... | --all) [--dry-run | --yes] [flags]

Deletes a task. Its owner stops firing it within a second; executions
already running finish. Deleting a task that does not exist fails. With
--if-match, the task is deleted only if its version is VERSION: a task
changed since it was read is kept.

Examples:
  shardcron task delete billing/invoice-42
  shardcron task delete billing/invoice-42 --if-match 1207
  shardcron task delete --label team=billing --dry-run
  shardcron task delete --prefix tmp/ --yes
` + bulkHelp

func taskDelete(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task delete", taskDeleteHelp, stdout, stderr)
	var ifMatch int64
	c.fs.Int64Var(&ifMatch, "if-match", 0, "delete only if the stored task has this `VERSION` (left out: whatever its version)")
	return onTaskOrBulk(c, args, task.BulkDelete, func(ctx context.Context, cf *clientFlags, id string) int {
		given := false
		c.fs.Visit(func(f *flag.Flag) { given = given || f.Name == "if-match" })
		if err := checkIfMatch(ifMatch, given); err != "" {
			return c.usageError("%s", err)
		}
		if err := cf.client().DeleteTaskIf(ctx, id, ifMatch); err != nil {
			return cf.failWithHint(c, subject(id), err, http.StatusPreconditionFailed, "nothing was deleted")
		}
		out := struct {
			ID      string `json:"id"`
			Deleted bool   `json:"deleted"`
		}{id, true}
		return printResult(c, cf, out, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "deleted %s\n", subject(id))
			return err
		})
	}, "if-match")
}

// checkIfMatch says what is wrong with an --if-match value, given or not:
// versions start at 1, and the API takes no condition of 0, so a 0 given
// (a script's empty version) must not mean "whatever the version".
func checkIfMatch(v int64, given bool) string {
	if v < 0 || given && v == 0 {
		return fmt.Sprintf("--if-match: %d is not a version (versions start at 1; leave the flag out for none)", v)
	}
	return ""
}

const taskPauseHelp = `Usage: shardcron task pause ID [--note TEXT] [flags]
       shardcron task pause (--prefix P | --label K=V... | --all) [--note TEXT] [--dry-run] [flags]

Pauses a task: it keeps its definition and does not fire until resumed.
A pause records who paused the task and when, with --note, which
'task get' shows until it is resumed. Pausing one task again replaces
them; a pause by selector leaves the tasks paused already as they are,
records included. Prints the new version (--output json: the task).

Examples:
  shardcron task pause billing/invoice-42 --note "provider outage, INC-123"
  shardcron task pause --label team=billing --dry-run
  shardcron task pause --label team=billing --note "provider outage, INC-123"
` + bulkHelp

const taskResumeHelp = `Usage: shardcron task resume ID [flags]
       shardcron task resume (--prefix P | --label K=V... | --all) [--dry-run] [flags]

Resumes a paused task: it fires again from its next scheduled time (fires
missed while paused are not caught up). Prints the new version
(--output json: the task).

Examples:
  shardcron task resume billing/invoice-42
  shardcron task resume --label team=billing
` + bulkHelp

func taskSetPaused(args []string, pause bool, stdout, stderr io.Writer) int {
	name, help, verb := "shardcron task resume", taskResumeHelp, "resumed"
	if pause {
		name, help, verb = "shardcron task pause", taskPauseHelp, "paused"
	}
	action := task.BulkResume
	if pause {
		action = task.BulkPause
	}
	c := newCommand(name, help, stdout, stderr)
	var note string
	if pause {
		c.fs.StringVar(&note, "note", "", "why the task is paused, a `TEXT` of at most 1024 bytes: its state shows it with who paused it and when")
	}
	return onTaskOrBulk(c, args, action, func(ctx context.Context, cf *clientFlags, id string) int {
		cl := cf.client()
		var t *task.Task
		var err error
		if pause {
			t, err = cl.PauseWithNote(ctx, id, note)
		} else {
			t, err = cl.Resume(ctx, id)
		}
		if err != nil {
			return cf.fail(c, subject(id), err)
		}
		return printResult(c, cf, t, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "%s %s: version %d\n", verb, subject(id), t.Version)
			return err
		})
	})
}

// --- task trigger -----------------------------------------------------------

const taskTriggerHelp = `Usage: shardcron task trigger ID [flags]
       shardcron task trigger (--prefix P | --label K=V... | --all) [--dry-run] [flags]

Fires a task once now, outside its schedule (also when it is paused), and
prints the scheduled time of that fire: its executions show up in
'task history' under that time. --body (http tasks) or --payload (handler
tasks) replaces the task's for that one fire and its retries.

Examples:
  shardcron task trigger billing/invoice-42
  shardcron task trigger billing/invoice-42 --body '{"invoice": 42, "resend": true}'
  shardcron task trigger jobs/reindex --payload '{"full": true}'
  shardcron task trigger --prefix reports/daily/
` + bulkHelp

func taskTrigger(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task trigger", taskTriggerHelp, stdout, stderr)
	var body, payload string
	c.fs.StringVar(&body, "body", "", "http tasks: send `BODY` as this fire's request body instead of the task's")
	c.fs.StringVar(&payload, "payload", "", "handler tasks: pass the `JSON` value to this fire's handler instead of the task's payload")
	return onTaskOrBulk(c, args, task.BulkTrigger, func(ctx context.Context, cf *clientFlags, id string) int {
		var o task.Override
		c.fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "body":
				o.Body = &body
			case "payload":
				o.Payload = json.RawMessage(payload)
			}
		})
		if o.Body != nil && o.Payload != nil {
			return c.usageError("--body (http tasks) and --payload (handler tasks) exclude each other")
		}
		if o.Payload != nil && !json.Valid(o.Payload) {
			return c.usageError("--payload: %q is not JSON (a string needs quotes: --payload '\"x\"')", payload)
		}
		at, err := cf.client().TriggerWith(ctx, id, &o)
		if err != nil {
			return cf.fail(c, subject(id), err)
		}
		out := struct {
			ScheduledAt string `json:"scheduled_at"`
		}{at.UTC().Format("2006-01-02T15:04:05.000Z07:00")} // as the API writes it
		return printResult(c, cf, out, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "triggered %s: scheduled at %s\n", subject(id), formatTime(at))
			return err
		})
	}, "body", "payload")
}

// --- task backfill ----------------------------------------------------------

const taskBackfillHelp = `Usage: shardcron task backfill ID --from TIME --to TIME [--concurrency N] [flags]
       shardcron task backfill ID --cancel [flags]

Runs every scheduled time of the task in [--from, --to] (RFC 3339 times)
once, with the fires' usual idempotency keys "<id>@<scheduled ms>", so
that receivers deduplicate what already ran. The task's owner runs it, at
most --concurrency fires at a time, and records its progress in etcd:
'task get' shows it, and a new owner continues after it when the task's
partition changes hands. --to must not be in the future; one backfill
runs at most 10000 fires, and one runs per task at a time.

--cancel stops the task's running backfill: no further fire of it starts,
and those already started (at most its concurrency) run to their end.

Examples:
  shardcron task backfill reports/daily --from 2026-11-01T00:00:00Z --to 2026-11-30T23:59:59Z --concurrency 4
  shardcron task backfill reports/daily --cancel
`

func taskBackfill(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task backfill", taskBackfillHelp, stdout, stderr)
	var from, to string
	var concurrency int
	c.fs.StringVar(&from, "from", "", "the first scheduled `TIME` to run (RFC 3339, required)")
	c.fs.StringVar(&to, "to", "", "the last scheduled `TIME` to run (RFC 3339, not in the future, required)")
	c.fs.IntVar(&concurrency, "concurrency", task.DefaultBackfillConcurrency, fmt.Sprintf("fires of the backfill running at once, `N` from 1 to %d", task.MaxBackfillConcurrency))
	var cancel bool
	c.fs.BoolVar(&cancel, "cancel", false, "cancel the task's running backfill instead (without --from, --to or --concurrency)")
	return onTask(c, args, func(ctx context.Context, cf *clientFlags, id string) int {
		if cancel {
			var given []string
			c.fs.Visit(func(f *flag.Flag) {
				if f.Name == "from" || f.Name == "to" || f.Name == "concurrency" {
					given = append(given, "--"+f.Name)
				}
			})
			if len(given) > 0 {
				return c.usageError("--cancel stops the running backfill: leave out %s", strings.Join(given, " and "))
			}
			b, err := cf.client().CancelBackfill(ctx, id)
			if err != nil {
				return cf.fail(c, subject(id), err)
			}
			return printResult(c, cf, b, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "backfill of %s canceled: %d of its %d %s done; those started run to their end\n",
					subject(id), b.Done, b.Fires, plural(b.Fires, "fire", "fires"))
				return err
			})
		}
		var times [2]time.Time
		for i, f := range []struct{ name, v string }{{"from", from}, {"to", to}} {
			if f.v == "" {
				return c.usageError("missing --%s", f.name)
			}
			t, err := time.Parse(time.RFC3339, f.v)
			if err != nil {
				return c.usageError("--%s: %q is not an RFC 3339 time such as 2026-11-01T00:00:00Z", f.name, f.v)
			}
			times[i] = t
		}
		if concurrency < 1 || concurrency > task.MaxBackfillConcurrency {
			return c.usageError("--concurrency: %d is not within 1-%d", concurrency, task.MaxBackfillConcurrency)
		}
		b, err := cf.client().Backfill(ctx, id, times[0], times[1], concurrency)
		if err != nil {
			return cf.fail(c, subject(id), err)
		}
		return printResult(c, cf, b, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "backfill of %s: %d %s from %s to %s, %d at a time ('task get' shows its progress)\n",
				subject(id), b.Fires, plural(b.Fires, "fire", "fires"), formatTime(b.From), formatTime(b.To), b.Concurrency)
			return err
		})
	})
}

// --- task history -----------------------------------------------------------

const taskHistoryHelp = `Usage: shardcron task history ID [--limit N] [flags]

Shows a task's execution records, newest first, from every node: one row
per attempt, plus fires that were skipped, misfired or canceled. Nodes
keep records for their --history-ttl. A node that does not answer is
named in a warning on stderr ("partial" in JSON): its records, often the
newest, are missing.

Example:
  shardcron task history billing/invoice-42 --limit 50
`

// defaultHistoryLimit is what a terminal shows at a glance.
const defaultHistoryLimit = 20

func taskHistory(args []string, stdout, stderr io.Writer) int {
	c := newCommand("shardcron task history", taskHistoryHelp, stdout, stderr)
	var limit int
	c.fs.IntVar(&limit, "limit", defaultHistoryLimit, fmt.Sprintf("show the `N` latest records (1-%d)", api.MaxHistoryLimit))
	return onTask(c, args, func(ctx context.Context, cf *clientFlags, id string) int {
		if limit < 1 || limit > api.MaxHistoryLimit {
			return c.usageError("--limit: %d is not from 1 to %d", limit, api.MaxHistoryLimit)
		}
		resp, err := cf.client().HistoryAnswer(ctx, id, limit)
		if err != nil {
			return cf.fail(c, subject(id), err)
		}
		execs := resp.Executions
		if execs == nil {
			execs = []task.Execution{}
		}
		warnPartial(c.stderr, "records", resp.Partial)
		out := struct {
			Executions []task.Execution `json:"executions"`
			Partial    []string         `json:"partial,omitempty"`
		}{execs, resp.Partial}
		none := "no execution records of " + subject(id) + " yet"
		if len(resp.Partial) > 0 {
			none = "no execution records of " + subject(id) + " on the nodes that answered"
		}
		return printResult(c, cf, out, orNone(len(execs), none,
			func(w io.Writer) error { return writeHistoryTable(w, execs) }))
	})
}
