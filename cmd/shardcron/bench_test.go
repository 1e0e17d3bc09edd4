package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBench_JSONLastLineAndReport(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := run([]string{"bench", "throughput", "--tasks", "100", "--duration", "1s", "--partitions", "8",
		"--workers", "4", "--queue", "4096", "--json", "--report", dir}, nil, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("last line of stdout is not a JSON object: %q: %v", lines[len(lines)-1], err)
	}
	if m["scenario"] != "throughput" || m["tasks"] != 100.0 {
		t.Errorf("JSON %v: want scenario throughput, 100 tasks", m)
	}
	if !strings.Contains(errb.String(), "bench: ") {
		t.Errorf("no progress on stderr: %q", errb.String())
	}
	html, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(html)
	if !strings.Contains(s, "<svg") || !strings.Contains(s, "<table") {
		t.Errorf("report.html holds no table or no SVG chart")
	}
	if strings.Contains(s, "<script") || strings.Contains(s, "<link") || strings.Contains(s, `src="http`) {
		t.Errorf("report.html loads something: it must be self-contained")
	}
}

func TestBench_BadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench"}, "missing SCENARIO"},
		{[]string{"bench", "fastest"}, `unknown scenario "fastest"`},
		{[]string{"bench", "rebalance", "--nodes", "1"}, "at least 2 nodes"},
		{[]string{"bench", "throughput", "--executor", "exec"}, `unknown executor "exec"`},
		{[]string{"bench", "throughput", "burst"}, "want one SCENARIO"},
		{[]string{"bench", "a b", "c"}, `want one SCENARIO, got 2 arguments: "a b" "c"`},
		{[]string{"bench", "robfig", "--procs"}, "procs: applies to throughput, burst, memory, import, restart, query, trigger, rebalance, failover"},
		{[]string{"bench", "memory", "--procs", "--etcd", "http://127.0.0.1:2379"}, "give --etcd or --procs, not both"},
		{[]string{"bench", "throughput", "--etcd", "http://127.0.0.1:2379"}, "etcd: applies to memory only"},
		{[]string{"bench", "memory", "--etcd", "127.0.0.1:2379"}, "etcd: want a client URL"},
		{[]string{"bench", "rebalance", "--procs", "--bin", "/"}, "is not an executable"},
		{[]string{"bench", "throughput", "--runs", "-2"}, "runs: must be between"},
		{[]string{"bench", "throughput,slow"}, `unknown scenario "slow"`},
		{[]string{"bench", "trigger", "--schedule", "@every 1s"}, "schedule: trigger's tasks fire once a year (@yearly)"},
		{[]string{"bench", "throughput", "--tasks", "-1"}, "shardcron bench: tasks: must be between 1 and"},
		{[]string{"bench", "throughput,robfig", "--schedule", "H/2 * * * * *"}, `shardcron bench: schedule: robfig/cron (used by robfig) cannot parse "H/2 * * * * *": failed to parse int from H`},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, nil, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errb.String(), exitUsage, tc.want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"bench", "--help"}, nil, &out, &errb); code != exitOK || !strings.Contains(out.String(), "--report") ||
		!strings.Contains(out.String(), "--procs") || !strings.Contains(out.String(), "--runs") ||
		!strings.Contains(out.String(), "\n  trigger ") {
		t.Errorf("--help: exit %d, output %q", code, out.String())
	}
}

// TestBench_ListJSON runs two scenarios in one invocation: the JSON is one
// object with a result each and the ratios between them, and the table of
// ratios is printed.
func TestBench_ListJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"bench", "throughput,afterfunc", "--tasks", "100", "--duration", "1s", "--partitions", "8",
		"--workers", "4", "--queue", "4096", "--json"}, nil, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var m struct {
		Results []map[string]any `json:"results"`
		Ratios  []map[string]any `json:"ratios"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("last line of stdout is not the JSON object: %q: %v", lines[len(lines)-1], err)
	}
	if len(m.Results) != 2 || m.Results[0]["scenario"] != "throughput" || m.Results[1]["scenario"] != "afterfunc" {
		t.Errorf("results %v: want throughput then afterfunc", m.Results)
	}
	if len(m.Ratios) == 0 || m.Ratios[0]["baseline"] != "afterfunc" {
		t.Errorf("ratios %v: want some against afterfunc", m.Ratios)
	}
	if !strings.Contains(out.String(), "shardcron better by") {
		t.Errorf("no ratio table in the output:\n%s", out.String())
	}
}

// TestBench_ReportNotWritable: a --report directory that cannot be made or
// written is a usage error found before anything runs.
func TestBench_ReportNotWritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dirs := []string{file, filepath.Join(file, "sub")}
	if fi, err := os.Stat("/sys/kernel"); err == nil && fi.IsDir() {
		dirs = append(dirs, "/sys/kernel") // exists, but no file can be made there, even by root
	}
	for _, dir := range dirs {
		var out, errb bytes.Buffer
		code := run([]string{"bench", "robfig", "--tasks", "100", "--duration", "1s", "--json", "--report", dir}, nil, &out, &errb)
		if code != exitUsage || !strings.Contains(errb.String(), "--report") {
			t.Errorf("--report %s: exit %d, stderr %q; want exit %d naming --report", dir, code, errb.String(), exitUsage)
		}
		if strings.Contains(errb.String(), "bench: measuring") {
			t.Errorf("--report %s: the scenario ran before the error", dir)
		}
	}
}

// TestBench_ReportFailsLate: when the report cannot be written at the end
// (here report.html is a directory), the JSON result is still printed and
// the exit code says the run failed.
func TestBench_ReportFailsLate(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "report.html"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"bench", "afterfunc", "--tasks", "100", "--duration", "1s", "--json", "--report", dir}, nil, &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), "report.html") {
		t.Errorf("exit %d, stderr %q; want exit %d and the report's error", code, errb.String(), exitError)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil || m["scenario"] != "afterfunc" {
		t.Errorf("last line of stdout %q: want the JSON result (%v)", lines[len(lines)-1], err)
	}
}

// TestBench_FlagOutOfRange: a flag given out of range is a usage error
// that names the flag, once, and never an engine field.
func TestBench_FlagOutOfRange(t *testing.T) {
	testFlagMistakes(t, []flagMistake{
		{[]string{"--lease-ttl", "1s"}, "lease-ttl: must be a whole number of seconds, at least 2s"},
		{[]string{"--lease-ttl", "2500ms"}, "lease-ttl: must be a whole number of seconds, at least 2s"},
		{[]string{"--queue", "-1"}, "queue: must be between 1 and 16777216, got -1"},
		{[]string{"--workers", "-1"}, "workers: must be between 1 and 65536, got -1"},
		{[]string{"--replication", "1"}, "replication: must be between 2 and 256, got 1"},
		{[]string{"--partitions", "100000"}, "partitions: must be between 1 and 32768, got 100000"},
		{[]string{"--load", "1"}, "load: must be a finite number above 1, got 1"},
		{[]string{"--tick", "1s"}, "tick: must be between 100µs and 100ms, got 1s"},
		{[]string{"--tick", "10us"}, "tick: must be between 100µs and 100ms, got 10µs"},
	})
}

type flagMistake struct {
	args []string
	want string
}

// testFlagMistakes runs robfig with each mistake's flags, and checks the
// exit code and that stderr names the flag, once, and no engine field.
func testFlagMistakes(t *testing.T, mistakes []flagMistake) {
	t.Helper()
	for _, tc := range mistakes {
		var out, errb bytes.Buffer
		code := run(append([]string{"bench", "robfig"}, tc.args...), nil, &out, &errb)
		msg := errb.String()
		if code != exitUsage || strings.Count(msg, tc.want) != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q once", tc.args, code, msg, exitUsage, tc.want)
		}
		for _, engineName := range []string{"engine:", "ring:", "Workers", "Queue", "Partitions", "ReplicationFactor", "Tick", "TTL"} {
			if strings.Contains(msg, engineName) {
				t.Errorf("%v: stderr %q names %q, not the flag", tc.args, msg, engineName)
			}
		}
	}
}

// TestBench_FlagGivenAsZero: bench.Config takes 0 for the default, but a
// flag given as 0 is a mistake, refused as the server refuses it.
func TestBench_FlagGivenAsZero(t *testing.T) {
	testFlagMistakes(t, []flagMistake{
		{[]string{"--tasks", "0"}, "tasks: must not be 0 (leave --tasks out for the default)"},
		{[]string{"--duration", "0"}, "duration: must not be 0"},
		{[]string{"--nodes", "0"}, "nodes: must not be 0"},
		{[]string{"--partitions", "0"}, "partitions: must not be 0"},
		{[]string{"--replication", "0"}, "replication: must not be 0"},
		{[]string{"--load", "0"}, "load: must not be 0"},
		{[]string{"--workers", "0"}, "workers: must not be 0"},
		{[]string{"--queue", "0"}, "queue: must not be 0"},
		{[]string{"--tick", "0"}, "tick: must not be 0"},
		{[]string{"--lease-ttl", "0s"}, "lease-ttl: must not be 0"},
		{[]string{"--runs", "0"}, "runs: must not be 0"},
	})
}
