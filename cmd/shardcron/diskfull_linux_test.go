//go:build linux

package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardcron/shardcron/internal/etcdtest"
	"github.com/shardcron/shardcron/internal/tmpfs"
)

// TestServer_DiskFullKeepsFiring runs a node whose data directory is on a
// small filesystem, then fills it: the history writes fail, are counted
// and logged, and the every-second task keeps firing; once space is freed
// the history is written again.
func TestServer_DiskFullKeepsFiring(t *testing.T) {
	fs := tmpfs.Mount(t, 96<<20) // the cache keeps 64 MiB free by default
	c := etcdtest.Start(t)
	s := newSink(t)
	p := startServer(t, true, "--data-dir", filepath.Join(fs, "data"), "--etcd", c.Endpoints[0], "--partitions", "16")
	p.waitReady(t)
	s.putEverySecond(t, p.API, "full-disk")

	filler := filepath.Join(fs, "filler")
	tmpfs.Fill(t, filler)
	before, _ := s.count("full-disk@")
	etcdtest.WaitFor(t, 30*time.Second, func() bool { return metric(t, p.API, "shardcron_history_write_failed_total") > 0 })
	etcdtest.WaitFor(t, 20*time.Second, func() bool { n, _ := s.count("full-disk@"); return n >= before+3 })
	// The store counts a lost batch before it logs it: wait for the log
	// line, which the count says is coming.
	etcdtest.WaitFor(t, 10*time.Second, func() bool {
		return strings.Contains(p.log(), "store: execution records lost") && strings.Contains(p.log(), "disk full")
	})

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	etcdtest.WaitFor(t, 20*time.Second, func() bool {
		resp, err := http.Get(p.API + "/v1/tasks/full-disk/history?local=1")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var h struct {
			Executions []struct {
				ScheduledAt time.Time `json:"scheduled_at"`
			} `json:"executions"`
		}
		return json.NewDecoder(resp.Body).Decode(&h) == nil && len(h.Executions) > 0 && h.Executions[0].ScheduledAt.After(freed)
	})
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit code %d\n%s", code, p.log())
	}
	if _, dups := s.count("full-disk@"); dups > 0 {
		t.Errorf("%d fires delivered twice", dups)
	}
}

// metric returns the value of an unlabelled counter or gauge of the node's
// /metrics, -1 when it cannot be read.
func metric(t *testing.T, api, name string) float64 {
	t.Helper()
	resp, err := http.Get(api + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return -1
	}
	return v
}
