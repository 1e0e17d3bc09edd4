package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shardcron/shardcron/task"
)

// Widths past which a table cell is cut, so that one long URL or error
// does not push every other column off the screen. --output json always
// has the whole value.
const (
	maxExecutorWidth = 48
	maxErrorWidth    = 72
)

// newTable returns a writer that aligns tab-separated columns; Flush it.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
}

// row writes one table row.
func row(w io.Writer, cells ...string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// writeJSON prints v as indented JSON, for scripts (jq) and humans alike.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // URLs with & stay readable
	return enc.Encode(v)
}

// formatTime is the time in UTC, RFC 3339 with milliseconds when it has
// any: a cluster's nodes and its users may sit in different zones, and UTC
// is what the API and the logs use. "-" for the zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.999Z07:00")
}

// formatDuration rounds d for a table: milliseconds under a minute,
// seconds above.
func formatDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d < time.Millisecond:
		return d.String()
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// truncate cuts s to at most n runes, ending with "…" when cut, and puts
// it on one line (oneLine).
func truncate(s string, n int) string {
	s = oneLine(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// dash shows an empty cell as "-", so that columns stay readable by
// tools such as awk.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// describeExecutor summarizes what a task runs: "http POST http://x/hook",
// "exec /usr/bin/backup --full", "handler sync", "noop".
func describeExecutor(x task.Executor) string {
	switch x.Type {
	case task.ExecutorHTTP:
		m := x.Method
		if m == "" {
			m = task.DefaultHTTPMethod
		}
		return "http " + m + " " + x.URL
	case task.ExecutorExec:
		return strings.TrimSpace("exec " + quoteArgv(x.Command))
	case task.ExecutorHandler:
		return "handler " + x.Name
	}
	return string(x.Type)
}

// quoteArgv joins argv for display, quoting the arguments that need it.
func quoteArgv(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$`") {
			a = strconv.Quote(a)
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}

// formatMap shows a map as "k=v, k2=v2", sorted by key.
func formatMap(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ", ")
}

// warnPartial prints on stderr each entry of a partial answer's
// "partial". An entry that starts with a node's id (which holds no space)
// is a node that did not answer, whose what are missing; the others, the
// partitions no node held throughout a scan or a member list that could
// not be read, say themselves what is missing, and were no node's.
func warnPartial(w io.Writer, what string, partial []string) {
	for _, p := range partial {
		if id, _, ok := strings.Cut(p, ": "); ok && !strings.Contains(id, " ") {
			fmt.Fprintf(w, "warning: partial answer, the %s of a node are missing: %s\n", what, p)
		} else {
			fmt.Fprintf(w, "warning: partial answer: %s\n", p)
		}
	}
}

// orNone is table, or, when the answer has no row (n is 0), a line that
// says so: the table's header alone read as an answer cut short. Of a
// partial answer, none says that the nodes that answered have no row: the
// others may have some.
func orNone(n int, none string, table func(io.Writer) error) func(io.Writer) error {
	if n > 0 {
		return table
	}
	return func(w io.Writer) error {
		_, err := fmt.Fprintln(w, none)
		return err
	}
}

// writeTaskTable prints tasks as a table, one row each.
func writeTaskTable(w io.Writer, tasks []*task.Task) error {
	tw := newTable(w)
	row(tw, "ID", "SCHEDULE", "TZ", "EXECUTOR", "PAUSED", "NEXT FIRE", "VERSION")
	for _, t := range tasks {
		next := "-"
		if t.State != nil {
			next = formatTime(t.State.NextFireAt)
		}
		paused := "no"
		if t.Paused {
			paused = "yes"
		}
		row(tw, t.ID, t.Schedule, dash(t.Timezone), truncate(describeExecutor(t.Executor), maxExecutorWidth),
			paused, next, strconv.FormatInt(t.Version, 10))
	}
	return tw.Flush()
}

// writeHealthTable prints tasks with their health, one row each.
func writeHealthTable(w io.Writer, tasks []*task.Task) error {
	tw := newTable(w)
	row(tw, "ID", "SCHEDULE", "OWNER", "FAILS", "LAST SUCCESS", "LAST FAILURE", "LAST ERROR")
	for _, t := range tasks {
		s := t.State
		if s == nil {
			row(tw, t.ID, t.Schedule, "-", "-", "-", "-", "-")
			continue
		}
		row(tw, t.ID, t.Schedule, dash(s.Owner), strconv.FormatUint(s.ConsecutiveFailures, 10),
			formatTime(s.LastSuccessAt), formatTime(s.LastFailureAt), dash(truncate(s.LastError, maxErrorWidth)))
	}
	return tw.Flush()
}

// writeTaskDetail prints one task as "Key: value" lines: the definition,
// then what the cluster knows of it, then the owner's state.
func writeTaskDetail(w io.Writer, t *task.Task) error {
	tw := newTable(w)
	kv := func(k, v string) { row(tw, k+":", v) }
	kv("ID", t.ID)
	kv("Schedule", t.Schedule)
	kv("Timezone", dash(t.Timezone))
	kv("Executor", describeExecutor(t.Executor))
	x := t.Executor
	switch x.Type {
	case task.ExecutorHTTP:
		if len(x.Headers) > 0 {
			kv("  Headers", formatMap(x.Headers))
		}
		if x.Body != "" {
			kv("  Body", truncate(x.Body, maxErrorWidth))
		}
	case task.ExecutorExec:
		if len(x.Env) > 0 {
			kv("  Env", formatMap(x.Env))
		}
	case task.ExecutorHandler:
		if len(x.Payload) > 0 {
			kv("  Payload", truncate(string(x.Payload), maxErrorWidth))
		}
	}
	kv("Timeout", durationOrDefault(t.Timeout))
	attempts := t.Retry.MaxAttempts
	if attempts == 0 {
		attempts = task.DefaultMaxAttempts
	}
	retry := "none (1 attempt)"
	if attempts > 1 {
		retry = fmt.Sprintf("%d attempts, backoff %s, max backoff %s", attempts,
			durationOrDefault(t.Retry.Backoff), durationOrDefault(t.Retry.MaxBackoff))
	}
	kv("Retry", retry)
	kv("Misfire", dash(string(t.Misfire)))
	kv("Catch-up window", durationOrDefault(t.CatchupWindow))
	kv("Concurrency", dash(string(t.Concurrency)))
	kv("Jitter", t.Jitter.String())
	kv("Paused", strconv.FormatBool(t.Paused))
	if p := t.Pause; p != nil {
		kv("  Paused by", fmt.Sprintf("%s at %s", p.By, formatTime(p.At)))
		if p.Note != "" {
			kv("  Note", truncate(p.Note, maxErrorWidth))
		}
	}
	kv("Labels", formatMap(t.Labels))
	if len(t.OnSuccess) > 0 {
		kv("On success", strings.Join(t.OnSuccess, ", "))
	}
	if len(t.OnFailure) > 0 {
		kv("On failure", strings.Join(t.OnFailure, ", "))
	}
	if !t.NotBefore.IsZero() || !t.NotAfter.IsZero() || t.MaxFires > 0 || t.DeleteAfterFire {
		kv("Not before", formatTime(t.NotBefore))
		kv("Not after", formatTime(t.NotAfter))
		maxFires := "-"
		if t.MaxFires > 0 {
			maxFires = strconv.Itoa(t.MaxFires)
		}
		kv("Max fires", maxFires)
		kv("Delete after fire", strconv.FormatBool(t.DeleteAfterFire))
	}
	if t.Partition != nil {
		kv("Partition", strconv.Itoa(*t.Partition))
	}
	kv("Version", strconv.FormatInt(t.Version, 10))
	kv("Created", formatTime(t.CreatedAt))
	kv("Updated", formatTime(t.UpdatedAt))
	switch s := t.State; {
	case s == nil:
		kv("Owner", "- (no node owns its partition right now)")
	case s.OwnerError != "":
		// Whole: the peer client's error names the request first and its
		// cause (refused, timed out) last.
		kv("Owner", fmt.Sprintf("%s (did not answer: %s; its state is not shown)", s.Owner, oneLine(s.OwnerError)))
		if b := s.Backfill; b != nil {
			kv("Backfill", backfillText(b))
		}
	default:
		kv("Owner", dash(s.Owner))
		kv("Next fire", formatTime(s.NextFireAt))
		kv("Last fire", formatTime(s.LastFireAt))
		kv("Last status", dash(s.LastStatus))
		kv("Fires", strconv.FormatUint(s.Fires, 10))
		kv("Failures", strconv.FormatUint(s.Failures, 10))
		kv("Misfires", strconv.FormatUint(s.Misfires, 10))
		kv("Skipped", strconv.FormatUint(s.Skipped, 10))
		kv("Last success", formatTime(s.LastSuccessAt))
		kv("Last failure", formatTime(s.LastFailureAt))
		kv("Fails in a row", strconv.FormatUint(s.ConsecutiveFailures, 10))
		kv("Last error", dash(truncate(s.LastError, maxErrorWidth)))
		if b := s.Backfill; b != nil {
			kv("Backfill", backfillText(b))
		}
		kv("Stale", strconv.FormatBool(s.Stale))
		if s.Ended != "" {
			kv("Ended", endedText[s.Ended])
		}
	}
	return tw.Flush()
}

// backfillText describes a backfill's record: "running: 3 of 10 fires
// done, through T (from to to, 2 at a time, progress recorded by node-a)".
// Until the owner records its first progress the record has no node and
// no time through, and says so.
func backfillText(b *task.Backfill) string {
	text := fmt.Sprintf("%s: %d of %d fires done", b.State, b.Done, b.Fires)
	if !b.Through.IsZero() {
		text += ", through " + formatTime(b.Through)
	}
	text += fmt.Sprintf(" (%s to %s, %d at a time, ", formatTime(b.From), formatTime(b.To), b.Concurrency)
	if b.Node == "" {
		return text + "no progress recorded yet)"
	}
	return text + "progress recorded by " + b.Node + ")"
}

// endedText explains task.State.Ended.
var endedText = map[string]string{
	task.EndedNotAfter: "not_after (past its window: fires no more)",
	task.EndedMaxFires: "max_fires (its max_fires scheduled times are past: fires no more)",
	task.EndedAt:       "at (its one @at time is past: fires no more)",
}

// durationOrDefault shows a duration, "-" when left to the default.
func durationOrDefault(d task.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.String()
}

// writeHistoryTable prints execution records, newest first as the API
// returns them.
func writeHistoryTable(w io.Writer, execs []task.Execution) error {
	tw := newTable(w)
	row(tw, "SCHEDULED", "ATTEMPT", "STATUS", "NODE", "DURATION", "ERROR")
	for _, e := range execs {
		dur := "-"
		if !e.StartedAt.IsZero() && !e.FinishedAt.IsZero() {
			dur = formatDuration(e.FinishedAt.Sub(e.StartedAt))
		}
		row(tw, formatTime(e.ScheduledAt), strconv.Itoa(e.Attempt), dash(e.Status), dash(e.Node), dur,
			dash(truncate(e.Error, maxErrorWidth)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeOutputs(w, execs)
}

// writeOutputs prints, under the history table, the output that tasks
// with capture kept, one block per record that has some.
func writeOutputs(w io.Writer, execs []task.Execution) error {
	for _, e := range execs {
		if e.Output == "" {
			continue
		}
		out := strings.TrimRight(printable(e.Output), "\n")
		if _, err := fmt.Fprintf(w, "\n--- output of %s, attempt %d (%s) ---\n%s\n", formatTime(e.ScheduledAt), e.Attempt, dash(e.Status), out); err != nil {
			return err
		}
	}
	return nil
}

// oneLine puts s on one line (a cell with a newline would break the
// table) of printable text: an error may quote what a webhook or a
// certificate wrote, escape sequences included, which must not drive the
// terminal.
func oneLine(s string) string { return printable(strings.Join(strings.Fields(s), " ")) }

// printable replaces the control characters of a task's output but
// newline and tab with U+FFFD: captured output must not drive the
// terminal (escape sequences).
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r != '\n' && r != '\t' && unicode.IsControl(r) {
			return '\uFFFD'
		}
		return r
	}, s)
}

// shellQuote is s as a POSIX shell reads it back as one word: as it is
// when it holds only characters no shell treats specially, else in single
// quotes. A hint that gives a task id to paste (a cursor) must survive an
// id with a space or a quote in it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:@%+=,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
