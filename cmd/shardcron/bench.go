package main

import (
	"fmt"
	"io"
)

// runBench is the benchmark harness's entry point. The harness (scenarios,
// the lock-per-fire baseline, reports) is not built yet; until it is, the
// figures in BENCHMARKS.md come from 'go test -bench'.
func runBench(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "shardcron bench: the benchmark harness is not built yet; BENCHMARKS.md lists the 'go test -bench' commands that measure shardcron today")
	return 2
}
