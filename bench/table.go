package bench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// column is one column of the comparison table.
type column struct {
	head string
	json string // the Result field it shows
	cell func(r *Result) string
}

var columns = []column{
	{"scenario", "scenario", func(r *Result) string { return r.Scenario }},
	{"tasks", "tasks", func(r *Result) string { return fmt.Sprint(r.Tasks) }},
	{"nodes", "nodes", func(r *Result) string { return fmt.Sprint(r.Nodes) }},
	{"fires/s", "fires_per_sec", func(r *Result) string { return fmt.Sprintf("%.0f", r.FiresPerSec) }},
	{"lag p50", "lag_p50_ms", func(r *Result) string { return msCell(r.LagP50Ms) }},
	{"lag p99", "lag_p99_ms", func(r *Result) string { return msCell(r.LagP99Ms) }},
	{"lag max", "lag_max_ms", func(r *Result) string { return msCell(r.LagMaxMs) }},
	{"cores", "cpu_cores", func(r *Result) string { return fmt.Sprintf("%.2f", r.CPUCores) }},
	{"RSS", "rss_bytes", func(r *Result) string { return fmt.Sprintf("%.0f MiB", float64(r.RSSBytes)/(1<<20)) }},
	{"etcd req", "etcd_requests", func(r *Result) string { return fmt.Sprint(r.EtcdRequests) }},
	{"dup", "duplicates", func(r *Result) string { return fmt.Sprint(r.Duplicates) }},
	{"missed", "missed", func(r *Result) string { return fmt.Sprint(r.Missed) }},
	{"misfires", "misfires", func(r *Result) string { return fmt.Sprint(r.Misfires) }},
	{"hand-over p99", "handoff_p99_ms", func(r *Result) string { return msCell(r.HandoffP99Ms) }},
	{"leave misfires", "leave_misfires", func(r *Result) string { return fmt.Sprint(r.Leave.Misfires) }},
	{"leave hand-over p99", "leave_handoff_p99_ms", func(r *Result) string { return msCell(r.Leave.HandoffP99Ms) }},
	{"rejoin misfires", "rejoin_misfires", func(r *Result) string { return fmt.Sprint(r.Rejoin.Misfires) }},
	{"rejoin hand-over p99", "rejoin_handoff_p99_ms", func(r *Result) string { return msCell(r.Rejoin.HandoffP99Ms) }},
	{"B/task", "bytes_per_task", func(r *Result) string { return fmt.Sprintf("%.0f", r.BytesPerTask) }},
	{"etcd B/task", "etcd_bytes_per_task", func(r *Result) string { return fmt.Sprintf("%.0f", r.EtcdBytesPerTask) }},
	{"GC", "gc_pause_ms", func(r *Result) string { return msCell(r.GCPauseMs) }},
	{"tasks/s", "tasks_per_sec", func(r *Result) string { return fmt.Sprintf("%.0f", r.TasksPerSec) }},
	{"ready", "ready_ms", func(r *Result) string { return msCell(r.ReadyMs) }},
	{"prefix100 p99", "prefix100_p99_ms", func(r *Result) string { return msCell(r.PrefixP99Ms) }},
	{"label100 p99", "label100_p99_ms", func(r *Result) string { return msCell(r.LabelP99Ms) }},
	{"page1000 p99", "page1000_p99_ms", func(r *Result) string { return msCell(r.PageP99Ms) }},
	{"export/s", "export_tasks_per_sec", func(r *Result) string { return fmt.Sprintf("%.0f", r.ExportTasksPerSec) }},
	{"triggers/s", "triggers_per_sec", func(r *Result) string { return fmt.Sprintf("%.0f", r.TriggersPerSec) }},
	{"trigger call", "trigger_ms", func(r *Result) string { return msCell(r.TriggerMs) }},
	{"to last fire", "last_fire_ms", func(r *Result) string { return msCell(r.LastFireMs) }},
	{"keys left", "trigger_keys_left", func(r *Result) string { return fmt.Sprint(r.TriggerKeysLeft) }},
	{"keys gone", "trigger_keys_gone_ms", func(r *Result) string {
		if r.TriggerKeysLeft > 0 {
			return "never"
		}
		return msCell(r.TriggerKeysGoneMs)
	}},
}

func msCell(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

// tableCells returns the table's header and rows: the columns that apply
// to at least one result, "-" where one does not apply.
func tableCells(results []*Result) (head []string, rows [][]string) {
	var cols []column
	for _, c := range columns {
		for _, r := range results {
			if applies(r, c.json) {
				cols = append(cols, c)
				break
			}
		}
	}
	for _, c := range cols {
		head = append(head, c.head)
	}
	for _, r := range results {
		var row []string
		for _, c := range cols {
			if applies(r, c.json) {
				row = append(row, c.cell(r))
			} else {
				row = append(row, "-")
			}
		}
		rows = append(rows, row)
	}
	return head, rows
}

func applies(r *Result, field string) bool {
	fs, ok := Fields[r.Scenario]
	return !ok || slices.Contains(fs, field)
}

// WriteTable prints the results as an aligned table, one row each.
func WriteTable(w io.Writer, results []*Result) {
	if len(results) == 0 {
		return
	}
	head, rows := tableCells(results)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	line := func(cells []string) {
		for _, c := range cells {
			fmt.Fprint(tw, c, "\t")
		}
		fmt.Fprintln(tw)
	}
	line(head)
	for _, r := range rows {
		line(r)
	}
	_ = tw.Flush()
	for _, r := range results {
		if r.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Scenario, r.Note)
		}
	}
}
