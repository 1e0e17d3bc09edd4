package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardcron/shardcron/internal/cputime"
)

// rss is the process's resident set size now, or its peak where /proc is
// not there.
func rss() uint64 {
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				return pages * uint64(os.Getpagesize())
			}
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return uint64(ru.Maxrss) * 1024
}

// sleepUntil waits for the wall clock to reach t, or for ctx to end.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// usage is a snapshot of the process's CPU time at a wall time.
type usage struct {
	at  time.Time
	cpu time.Duration
}

func snapshot() usage { return usage{at: time.Now(), cpu: cputime.Process()} }

// cores is the CPU time used between two snapshots per wall second.
func cores(a, b usage) float64 {
	wall := b.at.Sub(a.at)
	if wall <= 0 {
		return 0
	}
	return float64(b.cpu-a.cpu) / float64(wall)
}

// setUse sets r's CPU cores, RSS and etcd requests over the span from
// snapshot a to b, ca and cb the nodes' counters then. With node processes
// (procs) the CPU and RSS are theirs, and the bench's own CPU is
// harness_cpu_cores; in-process both are the bench's process's.
func (r *Result) setUse(procs bool, a, b usage, ca, cb counters) {
	r.CPUCores = cores(a, b)
	r.RSSBytes = rss()
	if procs {
		// A node that joined in the span has all its CPU time in it.
		r.Procs, r.HarnessCores = true, r.CPUCores
		r.CPUCores = float64(cb.cpu-ca.cpu) / float64(b.at.Sub(a.at))
		r.RSSBytes = cb.rss
	}
	r.EtcdRequests = cb.requests - ca.requests
}
