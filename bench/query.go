package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/shardcron/shardcron/api"
	"github.com/shardcron/shardcron/api/client"
	"github.com/shardcron/shardcron/task"
)

// queryRounds is how many times the query scenario asks each query: its
// p99 is the highest but one of 100.
const queryRounds = 100

// queryLabels are task i's labels in the query scenario: g takes one value
// per 100 tasks (i % (tasks/100)), team one of 10 (i % 10).
func queryLabels(i, tasks int) map[string]string {
	return map[string]string{"g": strconv.Itoa(i % labelGroups(tasks)), "team": strconv.Itoa(i % 10)}
}

// labelGroups is how many values the label g takes: 100 tasks a value.
func labelGroups(tasks int) int { return max(1, tasks/100) }

// query is one of the query scenario's requests, with how many tasks its
// answer must hold.
type query struct {
	name string
	opts client.ListOptions
	want int
}

// queries are the requests of issue 14's targets over tasks tasks: the first
// page of the (up to) 100 ids with a prefix, 100 tasks with a label, and a
// page of 1000 without a filter from the middle of the fleet.
func queries(tasks int) []query {
	block := tasks / 2 / 100 // ids block*100 ... block*100+99 share a prefix
	g := labelGroups(tasks) / 2
	withLabel := (tasks - g + labelGroups(tasks) - 1) / labelGroups(tasks)
	return []query{
		{"prefix100", client.ListOptions{Prefix: taskID(block * 100)[:14], Limit: 100}, min(100, tasks-block*100)},
		{"label100", client.ListOptions{Labels: map[string]string{"g": strconv.Itoa(g)}, Limit: 100}, min(100, withLabel)},
		{"page1000", client.ListOptions{Cursor: taskID(tasks / 2), Limit: 1000}, min(1000, tasks-tasks/2-1)},
	}
}

// runQuery writes cfg.Tasks noop tasks with two labels (queryLabels),
// starts cfg.Nodes nodes, and asks the first node's HTTP API each query
// of queries queryRounds times, in turns, then exports every task.
func runQuery(ctx context.Context, cfg Config) (*Result, error) {
	c, err := startCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.close() }()
	if err := c.writeTasks(ctx, cfg.Tasks, func(i int) *task.Task {
		return &task.Task{ID: taskID(i), Schedule: cfg.Schedule, Executor: task.Executor{Type: task.ExecutorNoop},
			Labels: queryLabels(i, cfg.Tasks)}
	}); err != nil {
		return nil, err
	}
	first, err := c.addNode(ctx, false)
	if err != nil {
		return nil, err
	}
	for range cfg.Nodes - 1 {
		if _, err := c.addNode(ctx, false); err != nil {
			return nil, err
		}
	}
	if err := c.waitReady(ctx, cfg.Tasks, readyTimeout(cfg)); err != nil {
		return nil, err
	}
	url, stop, err := c.serveAPI(first)
	if err != nil {
		return nil, err
	}
	defer stop()
	cl := client.NewClient(url, "")
	fmt.Fprintf(cfg.Progress, "bench: %d node(s) ready; %d rounds of queries\n", cfg.Nodes, queryRounds)

	qs := queries(cfg.Tasks)
	lat := make([][]time.Duration, len(qs))
	for range queryRounds {
		for i, q := range qs {
			start := time.Now()
			page, err := cl.ListPage(ctx, q.opts)
			lat[i] = append(lat[i], time.Since(start))
			if err != nil {
				return nil, fmt.Errorf("bench: query %s: %w", q.name, err)
			}
			if len(page.Tasks) != q.want {
				return nil, fmt.Errorf("bench: query %s: %d tasks, want %d", q.name, len(page.Tasks), q.want)
			}
		}
	}
	r := &Result{Scenario: Query, Tasks: cfg.Tasks, Nodes: cfg.Nodes, Procs: cfg.Procs}
	for i, dst := range [][2]*float64{
		{&r.PrefixP50Ms, &r.PrefixP99Ms}, {&r.LabelP50Ms, &r.LabelP99Ms}, {&r.PageP50Ms, &r.PageP99Ms},
	} {
		slices.Sort(lat[i])
		*dst[0] = ms(int64(lat[i][len(lat[i])/2]))
		*dst[1] = ms(int64(lat[i][(len(lat[i])*99-1)/100]))
	}

	fmt.Fprintf(cfg.Progress, "bench: exporting %d tasks\n", cfg.Tasks)
	var lines lineCounter
	start := time.Now()
	if err := cl.Export(ctx, client.ListOptions{}, &lines); err != nil {
		return nil, fmt.Errorf("bench: export: %w", err)
	}
	r.DurationS = time.Since(start).Seconds()
	if lines.n != cfg.Tasks {
		return nil, fmt.Errorf("bench: export: %d tasks, want %d", lines.n, cfg.Tasks)
	}
	r.ExportTasksPerSec = float64(cfg.Tasks) / r.DurationS
	r.RSSBytes = rss()
	return r, nil
}

// lineCounter counts the lines written to it.
type lineCounter struct{ n int }

func (l *lineCounter) Write(p []byte) (int, error) {
	l.n += bytes.Count(p, []byte{'\n'})
	return len(p), nil
}

// serveAPI returns the URL of node n's HTTP API, serving it from the bench's
// process for an in-process node, and a function that stops it.
func (c *cluster) serveAPI(n *node) (url string, stop func(), err error) {
	if n.proc != nil {
		return n.proc.url, func() {}, nil
	}
	srv, err := api.New(api.Config{Engine: n.eng, Logger: c.log})
	if err != nil {
		return "", nil, fmt.Errorf("bench: api: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = srv.Close()
		return "", nil, fmt.Errorf("bench: api listener: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = hs.Close(); <-done; _ = srv.Close() }, nil
}
