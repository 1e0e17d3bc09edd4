package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/shardcron/shardcron/api"
	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/task"
)

const importHelp = `Usage: shardcron import [flags] FILE
       shardcron import [flags] -          (read stdin)

Bulk-loads tasks from JSON Lines: one task JSON object per line (docs/api.md
"Task JSON"); blank lines and lines starting with # are skipped. Tasks are
sent in batches to POST /v1/tasks:batch: --batch lines, or fewer once
the first has waited 1 s (a slow producer's tasks are written as they
come, not when --batch lines have come or the input ended). A line
that is not valid (bad JSON, a task the server refuses, more than 64
KiB) is reported with its line number and does not stop the others. Importing the same file again is
harmless: tasks that did not change are not rewritten. A line replaces its
task whole, as 'task put' does: a task paused since the file was written
(task pause) is resumed by a line without "paused": true, its pause note
gone; 'task export' writes the pauses, with who paused each task, when
and why, which the import keeps, for a file to import back.

On a terminal, a progress bar on stderr shows lines done, rate and time
left (--quiet hides it). A batch that fails on the network or with a
temporarily unavailable node is retried. --in-flight batches are sent at
once (default 4); errors are still reported in line order. When a batch
fails for good the import stops: "import stopped after line N" names the
last line of the batches before it, which were all written; batches that
were in flight after it may have been written too. Ctrl-C (or SIGTERM)
stops it the same way, "interrupted", also while it waits for its input
(a pipe with nothing more yet); a second one at once. Running the
import again from the start is safe. A task written with a warning (only some
nodes can run it; its id comes again later in the same batch, which
replaces it; its id was given on an earlier line, which it replaces: a
batch waits for one in flight that gives its id, so that the last line is
written last) is reported as "line N: warning: ...". When the later line
of an id in the same batch is refused, the earlier ones are not written
either, and each is an error that says so. At the end it prints
"imported N tasks, M errors", with "(U unchanged)" after the tasks when
some were identical to what is stored and left alone, and the warnings'
count when there were any; it exits 1 if there were errors. N counts the
tasks each batch wrote: a task given on several lines of a batch once,
one given again in a later batch, which writes it again, once more.

Examples:
  shardcron import tasks.jsonl
  generate-tasks | shardcron import --batch 5000 -
  shardcron import tasks.jsonl --output json | jq '.errors[] | "\(.line): \(.error)"'
`

// Limits of import.
const (
	defaultImportBatch = 1000
	// defaultImportInFlight is how many batches are sent at once: the
	// next batches are read and sent while the node writes the ones
	// before, so that neither the network round trip nor a batch's slowest
	// transaction leaves the node and etcd idle. 4 imported 200 000 tasks
	// 40 % faster than 2 through a node process, 8 no faster than 4
	// (BENCHMARKS.md, issue 14's fifth pass).
	defaultImportInFlight = 4
	maxImportInFlight     = 16
	// maxImportBatchBytes caps the body of one batch, well below the
	// server's default limit (64 MiB): 1000 lines of large tasks would
	// otherwise make one huge request. A server with a lower limit answers
	// 413, and the batch is split.
	maxImportBatchBytes = 8 << 20
	importRetries       = 4 // attempts of one batch, counting the first
	importBackoff       = 500 * time.Millisecond
	// importFlush is how long a batch's first line waits for the batch to
	// fill: a slow producer's tasks are written as they come, not once
	// --batch lines have come or the input ended.
	importFlush = time.Second
)

// lineError is an import error tied to an input line.
type lineError struct {
	Line  int    `json:"line"`
	Error string `json:"error"`
	id    string // of a line the client refused, when it could be read
}

// lineWarning is a warning about the task of an input line, which was
// written.
type lineWarning struct {
	Line    int    `json:"line"`
	Warning string `json:"warning"`
}

// runImport runs 'shardcron import FILE|-': args are the arguments after
// "import". It returns the exit code: 0 every task imported, 1 some lines
// (or the whole import) failed, 2 a usage error.
func runImport(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := newCommand("shardcron import", importHelp, stdout, stderr)
	var cf clientFlags
	var batch int
	var quiet bool
	var inFlight int
	c.fs.IntVar(&batch, "batch", defaultImportBatch, fmt.Sprintf("lines per request, 1-%d", api.MaxBatchItems))
	c.fs.IntVar(&inFlight, "in-flight", defaultImportInFlight, fmt.Sprintf("requests sent at once, 1-%d (1: one after the other)", maxImportInFlight))
	c.fs.BoolVar(&quiet, "quiet", false, "no progress bar")
	c.fs.BoolVar(&quiet, "q", false, "alias of --quiet")
	cf.register(c)
	pos, code, done := c.parseClient(args, &cf)
	if done {
		return code
	}
	switch {
	case len(pos) == 0:
		return c.usageError("missing FILE (a JSON Lines file, or - for stdin)")
	case len(pos) > 1:
		return c.tooManyArgs("FILE", pos)
	}
	if batch < 1 || batch > api.MaxBatchItems {
		return c.usageError("--batch: %d is not within 1-%d", batch, api.MaxBatchItems)
	}
	if inFlight < 1 || inFlight > maxImportInFlight {
		return c.usageError("--in-flight: %d is not within 1-%d", inFlight, maxImportInFlight)
	}

	showBar := !quiet && isTerminal(stderr)
	in, total := stdin, int64(-1)
	name := pos[0]
	if name == "-" {
		name = "stdin"
	} else {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintf(stderr, "shardcron: %v\n", err)
			return exitError
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.IsDir() {
			fmt.Fprintf(stderr, "shardcron: %s is a directory: give a JSON Lines file, or - for stdin\n", name)
			return exitError
		}
		in = f
		// The bar's total: counting lines reads the file once more, at
		// disk speed, far faster than the import itself. A pipe or device
		// cannot be read twice: its bar has no total.
		if st, serr := f.Stat(); showBar && serr == nil && st.Mode().IsRegular() {
			if total, err = countLines(f); err == nil {
				_, err = f.Seek(0, io.SeekStart)
			}
			if err != nil {
				fmt.Fprintf(stderr, "shardcron: read %s: %v\n", name, err)
				return exitError
			}
		}
	}
	im := &importer{
		cf:       &cf,
		client:   cf.client(),
		batch:    batch,
		inFlight: inFlight,
		maxBytes: maxImportBatchBytes,
		retries:  importRetries,
		backoff:  importBackoff,
		stdout:   stdout,
		stderr:   stderr,
	}
	if showBar {
		im.bar = newImportBar(stderr, total)
	}
	// Ctrl-C (or SIGTERM) stops the import as a batch that fails for
	// good does: where it stopped is printed. A second one kills it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	return im.run(ctx, in, name)
}

// errInterrupted is what stops an import that a signal canceled.
var errInterrupted = errors.New("interrupted (the lines before were written; importing the file again finishes it)")

// isTerminal reports whether w is a terminal: the progress bar redraws its
// line, which only makes sense there (in a log file it would be a mess).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// newImportBar returns a bar counting input lines to total (-1: unknown, a
// spinner with count and rate). It starts no goroutine: it redraws when
// lines are added, at most every 100 ms.
func newImportBar(w io.Writer, total int64) *progressbar.ProgressBar {
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("importing"),
		progressbar.OptionSetItsString("lines"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetPredictTime(total > 0),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionClearOnFinish(),
	)
	_ = bar.RenderBlank() // starts the clock now, so that the first rate is right
	return bar
}

// countLines counts the lines of r, a last line without "\n" included, so
// that the progress bar knows its total.
func countLines(r io.Reader) (int64, error) {
	buf := make([]byte, 256<<10)
	var n int64
	last := byte('\n')
	for {
		k, err := r.Read(buf)
		if k > 0 {
			n += int64(bytes.Count(buf[:k], []byte{'\n'}))
			last = buf[k-1]
		}
		if err == io.EOF {
			if last != '\n' {
				n++
			}
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// importer sends JSON Lines to the batch endpoint. run is called by one
// goroutine; it sends up to inFlight batches at once.
type importer struct {
	cf       *clientFlags
	client   *client.Client
	batch    int           // lines per request
	inFlight int           // requests at once; 0 is 1
	maxBytes int           // body bytes per request, about
	retries  int           // attempts of one request
	backoff  time.Duration // before the second attempt; doubled after
	stdout   io.Writer
	stderr   io.Writer
	bar      *progressbar.ProgressBar // nil: no bar

	mu      sync.Mutex     // guards written, same and sent, which batches in flight update
	written int            // tasks written: those the server reported, each id once a batch
	same    int            // of written, those it found identical and left alone
	sent    bool           // a request succeeded: the node exists, so a refused connection is transient
	errs    []lineError    // every error, in line order (run's goroutine only)
	warns   []lineWarning  // every warning, likewise
	given   map[string]int // the last input line of each id sent (run's goroutine only)
}

// sending is a batch in flight: its errors and error are set before done
// is closed.
type sending struct {
	b      *importBatch
	local  []lineError   // the lines of the batch that could not be sent
	again  []lineWarning // its lines whose id an earlier batch gave (replacing it if written)
	prev   []int         // prev[i]: the line that gave line i's id before it (0: none), for forgetRefused
	remote []lineError
	warns  []lineWarning
	err    error
	done   chan struct{}
}

// replaced returns the again warnings of the lines the server wrote: a
// refused line replaced nothing.
func (s *sending) replaced() []lineWarning {
	var out []lineWarning
	for _, w := range s.again {
		if !slices.ContainsFunc(s.remote, func(e lineError) bool { return e.Line == w.Line }) {
			out = append(out, w)
		}
	}
	return out
}

// readResult is what one readBatch gave, and whether the input ended.
type readResult struct {
	b     *importBatch
	local []lineError
	err   error
	eof   bool
}

// readLine is what one lineReader.next gave, its data a copy.
type readLine struct {
	data []byte
	line int
	lerr *lineError
	err  error
}

// importBatch is the lines of one request.
type importBatch struct {
	body  []byte   // the lines, each ending in "\n"
	lines []int    // lines[i] is the input line number of the batch's item i
	ids   []string // ids[i] is item i's id; "" if it has none the client can read
	read  int      // input lines consumed for it, skipped ones included (for the bar)
}

func (b *importBatch) add(line int, data []byte) { b.put(line, data, task.PeekID(data)) }

// put adds a line whose id is known.
func (b *importBatch) put(line int, data []byte, id string) {
	b.body = append(b.body, data...)
	b.body = append(b.body, '\n')
	b.lines = append(b.lines, line)
	b.ids = append(b.ids, id)
}

// run imports everything in r and prints the summary. It sends up to
// inFlight batches at once and reports them in input order; it returns
// once every batch it sent has its answer.
func (im *importer) run(ctx context.Context, r io.Reader, name string) int {
	lr := newLineReader(r)
	// Lines are read on a goroutine of their own, one ahead at most, so
	// that a signal stops an import whose input has nothing to give yet (a
	// pipe that is slow or stalled), and a batch not yet full is sent
	// after importFlush all the same: a read cannot be canceled. The
	// goroutine ends with the read under way once stop is closed; a
	// command stopped by a signal exits without waiting for it.
	lines, stop := make(chan readLine), make(chan struct{})
	defer close(stop)
	go func() {
		for {
			data, line, lerr, err := lr.next()
			select {
			case lines <- readLine{data: bytes.Clone(data), line: line, lerr: lerr, err: err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	done := 0 // input lines dealt with in order: sent, skipped or reported
	var fatal error
	var queue []*sending // in input order
	// settle waits for the oldest batch and reports it.
	settle := func() {
		s := queue[0]
		queue = queue[1:]
		<-s.done
		im.forgetRefused(s)
		switch {
		case s.err != nil:
			// A batch split in two may have written its first half.
			im.report(append(s.local, s.remote...), s.warns, 0)
			if fatal == nil {
				fatal = s.err
			}
		case fatal != nil: // after the batch that stopped the import: reported, not counted as done
			im.report(append(s.local, s.remote...), s.warns, 0)
		default:
			im.report(append(s.local, s.remote...), append(s.warns, s.replaced()...), s.b.read)
			done += s.b.read
		}
	}
	for fatal == nil {
		rd := im.readBatch(ctx, lines)
		b, local, err := rd.b, rd.local, rd.err
		if err != nil {
			// The batches before the bad read, or the signal (the error
			// is then errInterrupted, below).
			for len(queue) > 0 && fatal == nil {
				settle()
			}
			if fatal == nil {
				fatal = fmt.Errorf("read %s: %w", name, err)
			}
			break
		}
		s := &sending{b: b, local: local, done: make(chan struct{})}
		if im.givenInFlight(s, queue) {
			// Batches in flight may be written in any order: the line given
			// last must be written last, so the earlier ones go first.
			for len(queue) > 0 && fatal == nil {
				settle()
			}
			if fatal != nil {
				break
			}
		}
		im.noteGiven(s)
		if len(b.lines) > 0 {
			go func() {
				defer close(s.done)
				s.remote, s.warns, s.err = im.send(ctx, b)
			}()
		} else {
			close(s.done)
		}
		queue = append(queue, s)
		for len(queue) >= max(1, im.inFlight) && fatal == nil {
			settle()
		}
		if rd.eof {
			break
		}
	}
	for len(queue) > 0 {
		settle()
	}
	if im.bar != nil {
		_ = im.bar.Finish() // clears the bar
	}
	if fatal != nil && ctx.Err() != nil {
		fatal = errInterrupted
	}
	if fatal != nil {
		subject := "import"
		if done > 0 {
			subject = fmt.Sprintf("import stopped after line %d", done)
		}
		fmt.Fprintln(im.stderr, describeError(im.cf, subject, fatal))
	}
	return im.summary(fatal != nil)
}

// givenInFlight says whether a batch still in queue gave an id of s.
func (im *importer) givenInFlight(s *sending, queue []*sending) bool {
	if len(s.b.lines) == 0 {
		return false
	}
	first := s.b.lines[0]
	oldest := first // the first line sent by a batch in queue
	for _, q := range queue {
		if len(q.b.lines) > 0 {
			oldest = q.b.lines[0]
			break
		}
	}
	for _, id := range s.b.ids {
		if prev, ok := im.given[id]; ok && prev >= oldest && prev < first {
			return true
		}
	}
	return false
}

// noteGiven notes the ids of s's lines, and warns of each whose id a line
// of an earlier batch gave, once those batches settled (the lines they had
// refused are forgotten by then). A later line of the same batch is left
// to the server, which writes the last and warns of the others.
func (im *importer) noteGiven(s *sending) {
	if im.given == nil {
		im.given = map[string]int{}
	}
	s.prev = make([]int, len(s.b.lines))
	for i, id := range s.b.ids {
		if id == "" {
			continue
		}
		prev := im.given[id]
		if prev > 0 && prev < s.b.lines[0] {
			s.again = append(s.again, lineWarning{Line: s.b.lines[i],
				Warning: fmt.Sprintf("task %q was given before, on line %d: this line replaces it", id, prev)})
		}
		s.prev[i], im.given[id] = prev, s.b.lines[i]
	}
}

// forgetRefused takes the lines of s the server refused out of given, the
// last first: they replaced nothing, and a later line of their id replaces
// the line before them, if any.
func (im *importer) forgetRefused(s *sending) {
	refused := slices.SortedFunc(slices.Values(s.remote), func(a, b lineError) int { return b.Line - a.Line })
	for _, e := range refused {
		k := slices.Index(s.b.lines, e.Line)
		if k < 0 || s.b.ids[k] == "" || im.given[s.b.ids[k]] != e.Line {
			continue
		}
		if id := s.b.ids[k]; s.prev[k] > 0 {
			im.given[id] = s.prev[k]
		} else {
			delete(im.given, id)
		}
	}
}

// readBatch takes lines from lines up to the batch size or byte limit, or
// until the first has waited importFlush; its error is ctx's once ctx is
// done. Lines that cannot be sent are returned as errors and do not count
// toward the batch.
func (im *importer) readBatch(ctx context.Context, lines <-chan readLine) readResult {
	b := &importBatch{}
	rd := readResult{b: b}
	refused := map[string]int{} // the last line of each id refused here, when it could be read
	var flush <-chan time.Time  // set at the batch's first line
read:
	for len(b.lines) < im.batch && len(b.body) < im.maxBytes {
		var l readLine
		select {
		case l = <-lines:
		case <-flush:
			break read
		case <-ctx.Done():
			return readResult{err: ctx.Err()}
		}
		if l.err != nil {
			if l.err == io.EOF {
				rd.eof = true
			} else {
				rd.err = l.err
			}
			break
		}
		b.read++
		if flush == nil {
			t := time.NewTimer(importFlush)
			defer t.Stop()
			flush = t.C
		}
		if l.lerr != nil {
			rd.local = append(rd.local, *l.lerr)
			if l.lerr.id != "" {
				refused[l.lerr.id] = l.lerr.Line
			}
			continue
		}
		if l.data != nil {
			b.add(l.line, l.data)
		}
	}
	// As the server does with a later item it refuses: when an id's last
	// line in the batch is one refused here, its lines before are not
	// written either.
	for id, at := range refused {
		if k := lastIndex(b.ids, id); k < 0 || b.lines[k] > at {
			continue // none before it, or a later line replaces it
		}
		var gone []int
		b, gone = b.without(id)
		for _, l := range gone {
			rd.local = append(rd.local, lineError{Line: l, Error: fmt.Sprintf(
				"not written: task %q comes again on line %d, which was refused", id, at)})
		}
	}
	rd.b = b
	return rd
}

// lastIndex is the index of the last v in s, or -1.
func lastIndex(s []string, v string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == v {
			return i
		}
	}
	return -1
}

// report prints a batch's errors and warnings in line order and advances
// the bar by the lines the batch consumed.
func (im *importer) report(errs []lineError, warns []lineWarning, read int) {
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Line < errs[j].Line })
	im.errs = append(im.errs, errs...)
	im.warns = append(im.warns, warns...)
	if len(errs)+len(warns) > 0 && im.cf.output == outputTable { // JSON has them in its summary
		if im.bar != nil {
			_ = im.bar.Clear()
		}
		out := make([]lineError, 0, len(errs)+len(warns))
		out = append(out, errs...)
		for _, w := range warns {
			out = append(out, lineError{Line: w.Line, Error: "warning: " + w.Warning})
		}
		sort.SliceStable(out, func(i, j int) bool { return out[i].Line < out[j].Line })
		for _, e := range out {
			fmt.Fprintf(im.stderr, "line %d: %s\n", e.Line, e.Error)
		}
	}
	if im.bar != nil && read > 0 {
		_ = im.bar.Add(read)
	}
}

// summary prints "imported N tasks (U unchanged), M errors" (or the JSON summary) and
// returns the exit code.
func (im *importer) summary(stopped bool) int {
	if im.cf.output == outputJSON {
		errs := im.errs
		if errs == nil {
			errs = []lineError{}
		}
		_ = writeJSON(im.stdout, struct {
			Imported  int           `json:"imported"`
			Unchanged int           `json:"unchanged"`
			ErrorsN   int           `json:"error_count"`
			Errors    []lineError   `json:"errors"`
			Warnings  []lineWarning `json:"warnings,omitempty"`
			Completed bool          `json:"completed"`
		}{im.written, im.same, len(im.errs), errs, im.warns, !stopped})
	} else {
		warned := ""
		if len(im.warns) > 0 {
			warned = fmt.Sprintf(", %d %s", len(im.warns), plural(len(im.warns), "warning", "warnings"))
		}
		same := ""
		if im.same > 0 {
			same = fmt.Sprintf(" (%d unchanged)", im.same)
		}
		fmt.Fprintf(im.stdout, "imported %d %s%s, %d %s%s\n", im.written, plural(im.written, "task", "tasks"), same,
			len(im.errs), plural(len(im.errs), "error", "errors"), warned)
	}
	if stopped || len(im.errs) > 0 {
		return exitError
	}
	return exitOK
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// send writes one batch, retrying transient failures, and returns the
// errors of its items mapped to input lines. A batch the server finds too
// large (413) is split in two. A non-nil error ends the import.
func (im *importer) send(ctx context.Context, b *importBatch) (errs []lineError, warns []lineWarning, err error) {
	res, err := im.post(ctx, b.body)
	var ae *client.Error
	if errors.As(err, &ae) {
		switch {
		case ae.Status == http.StatusRequestEntityTooLarge && len(b.lines) > 1:
			first, second := b.split()
			e1, w1, err := im.send(ctx, first)
			if err != nil {
				return e1, w1, err
			}
			e2, w2, err := im.send(ctx, second)
			errs, warns = append(e1, e2...), append(w1, w2...)
			if err == nil {
				// An id in both halves was written by each, and counted so.
				im.mu.Lock()
				im.written -= b.repeats(errs) - first.repeats(e1) - second.repeats(e2)
				im.mu.Unlock()
			}
			return errs, warns, err
		case ae.Status == http.StatusBadRequest || ae.Status == http.StatusRequestEntityTooLarge:
			// The batch as a whole was refused: every line shares the reason.
			errs := make([]lineError, len(b.lines))
			for i, l := range b.lines {
				errs[i] = lineError{Line: l, Error: ae.Message}
			}
			return errs, nil, nil
		}
	}
	if err != nil {
		return nil, nil, err
	}
	errs = mapBatchErrors(b.lines, res.Errors)
	im.mu.Lock()
	im.sent = true
	im.written += res.Written - b.repeats(errs) // the server counts the lines it wrote
	im.same += res.Unchanged
	im.mu.Unlock()
	for _, w := range res.Warnings {
		warns = append(warns, lineWarning{Line: batchLine(b.lines, w.Index), Warning: w.Warning})
	}
	return errs, warns, nil
}

// repeats counts the lines of b written (not among errs) whose id a later
// line of b written too gives again: the server writes the last and counts
// each line (its Written), though they are one task.
func (b *importBatch) repeats(errs []lineError) int {
	refused := make(map[int]bool, len(errs))
	for _, e := range errs {
		refused[e.Line] = true
	}
	seen := make(map[string]bool, len(b.ids))
	n := 0
	for k, id := range b.ids {
		switch {
		case id == "" || refused[b.lines[k]]:
		case seen[id]:
			n++
		default:
			seen[id] = true
		}
	}
	return n
}

// batchLine is the input line of item i of a batch; 0 for an index the
// batch did not have (the server is confused: said without a line).
func batchLine(lines []int, i int) int {
	if i >= 0 && i < len(lines) {
		return lines[i]
	}
	return 0
}

// mapBatchErrors turns the server's per-item errors (by index in the
// batch) into errors by input line.
func mapBatchErrors(lines []int, errs []task.BatchError) []lineError {
	out := make([]lineError, 0, len(errs))
	for _, e := range errs {
		l := batchLine(lines, e.Index)
		// The server numbers the lines of the body it got ("line 3: ...");
		// item i is its line i+1, since no blank lines are sent. The input's
		// line number replaces it.
		msg := strings.TrimPrefix(e.Error, fmt.Sprintf("line %d: ", e.Index+1))
		out = append(out, lineError{Line: l, Error: msg})
	}
	return out
}

// without returns b without its lines of id, and their line numbers.
func (b *importBatch) without(id string) (*importBatch, []int) {
	out := &importBatch{read: b.read}
	var gone []int
	b.each(func(k int, data []byte) {
		if b.ids[k] == id {
			gone = append(gone, b.lines[k])
		} else {
			out.put(b.lines[k], data, b.ids[k])
		}
	})
	return out, gone
}

// each gives fn each line of b, without its newline.
func (b *importBatch) each(fn func(k int, data []byte)) {
	rest := b.body
	for k := range b.lines {
		j := bytes.IndexByte(rest, '\n')
		fn(k, rest[:j])
		rest = rest[j+1:]
	}
}

// split halves a batch.
func (b *importBatch) split() (*importBatch, *importBatch) {
	half := len(b.lines) / 2
	first, second := &importBatch{}, &importBatch{}
	b.each(func(k int, data []byte) {
		if k < half {
			first.put(b.lines[k], data, b.ids[k])
		} else {
			second.put(b.lines[k], data, b.ids[k])
		}
	})
	return first, second
}

// post sends one batch body, retrying with exponential backoff while the
// failure looks transient: a network error (a refused connection only once
// the node has answered before, else nothing is running there), a timeout,
// or a node that failed or is temporarily unavailable (429, 5xx: etcd
// may have been slow or between leaders). Batches
// are idempotent, so a retry after a lost answer rewrites nothing.
func (im *importer) post(ctx context.Context, body []byte) (*client.BatchResult, error) {
	delay := im.backoff
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, im.cf.timeout)
		res, err := im.client.PutBatch(rctx, body)
		cancel()
		if err == nil || attempt >= im.retries || !im.transient(err) || ctx.Err() != nil {
			return res, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		delay *= 2
	}
}

func (im *importer) transient(err error) bool {
	var ae *client.Error
	if errors.As(err, &ae) {
		switch ae.Status {
		case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
			http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
		return false
	}
	if isConnRefused(err) {
		im.mu.Lock()
		defer im.mu.Unlock()
		return im.sent
	}
	return true // timeouts, resets, EOF mid-answer
}

var utf8BOM = []byte("\xef\xbb\xbf")

// lineReader reads JSON Lines, one task per line, and numbers them.
type lineReader struct {
	r    *bufio.Reader
	line int  // number of the last line read, 1-based
	eof  bool // the input ended
}

func newLineReader(r io.Reader) *lineReader {
	// Room for the largest task plus "\r\n": a longer line is too long.
	return &lineReader{r: bufio.NewReaderSize(r, task.MaxTaskSize+2)}
}

// next returns the next line to send and its number; (nil, n, nil, nil)
// for a line to skip (blank, comment); a *lineError for a line that cannot
// be sent; io.EOF at the end. The returned data is valid until the next
// call.
func (lr *lineReader) next() ([]byte, int, *lineError, error) {
	if lr.eof {
		return nil, lr.line, nil, io.EOF
	}
	data, err := lr.r.ReadSlice('\n')
	switch {
	case err == bufio.ErrBufferFull:
		size, id := len(data), task.PeekID(data)
		for err == bufio.ErrBufferFull {
			data, err = lr.r.ReadSlice('\n')
			size += len(data)
		}
		if err == io.EOF {
			lr.eof = true
		} else if err != nil {
			return nil, lr.line, nil, err
		}
		lr.line++
		return nil, lr.line, &lineError{Line: lr.line, Error: fmt.Sprintf(
			"task is about %d bytes of JSON, more than the limit of %d (64 KiB)", size, task.MaxTaskSize), id: id}, nil
	case err == io.EOF:
		lr.eof = true
		if len(data) == 0 {
			return nil, lr.line, nil, io.EOF
		}
	case err != nil:
		return nil, lr.line, nil, err
	}
	lr.line++
	if lr.line == 1 {
		data = bytes.TrimPrefix(data, utf8BOM) // editors on Windows begin a file with it
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] == '#' {
		return nil, lr.line, nil, nil
	}
	if len(data) > task.MaxTaskSize {
		return nil, lr.line, &lineError{Line: lr.line, Error: fmt.Sprintf(
			"task is %d bytes of JSON, more than the limit of %d (64 KiB)", len(data), task.MaxTaskSize), id: task.PeekID(data)}, nil
	}
	if msg := checkJSONObject(data); msg != "" {
		return nil, lr.line, &lineError{Line: lr.line, Error: msg, id: task.PeekID(data)}, nil
	}
	return data, lr.line, nil, nil
}

// checkJSONObject says why data is not one JSON object, or "". The server
// would refuse such a line too, but one malformed line could make it
// refuse the whole batch; refusing it here keeps the others going. A line
// that ends within a value, or holds an array, is most likely of a JSON
// file given for JSON Lines (a task as --output json prints it): the
// error says how to make them.
func checkJSONObject(data []byte) string {
	if !json.Valid(data) {
		var v json.RawMessage
		err := json.Unmarshal(data, &v)
		var se *json.SyntaxError
		if !errors.As(err, &se) {
			return "malformed JSON"
		}
		msg := fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se)
		if errors.Is(json.NewDecoder(bytes.NewReader(data)).Decode(&v), io.ErrUnexpectedEOF) {
			msg += ": the line ends within a task (import reads JSON Lines, one whole task a line: " +
				"jq -c . FILE writes a task given over several lines on one, jq -c '.[]' FILE the tasks of a JSON array one a line)"
		}
		return msg
	}
	switch data[0] {
	case '{':
		return ""
	case '[':
		return "a task must be a JSON object, one per line, not an array (jq -c '.[]' FILE writes its tasks one a line)"
	}
	return "a task must be a JSON object, one per line"
}
