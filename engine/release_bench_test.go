package engine

import (
	"testing"

	"github.com/shardcron/shardcron/task"
)

// BenchmarkReleaseInFlight: the node releases its 1 024 partitions while
// every task's fire is under way, taken by a worker: the loop's time for
// the release (releaseParts). A task that neither retries nor keeps its
// fires apart is not noted as leaving, noop or not: a job of it the stop
// meets unrun is handed on by its partition's release (leavers.unrun), at
// no cost a task. Noting each such task cost 0.3 µs a task with a fire
// under way (BENCHMARKS.md).
func BenchmarkReleaseInFlight(b *testing.B) {
	for _, noop := range []bool{true, false} {
		name := "noop"
		if !noop {
			name = "other"
		}
		b.Run(name, func(b *testing.B) {
			prof := noopProfile(task.MisfireFireOnce)
			prof.noop = noop
			benchBurst(b, prof, func(b *testing.B, tl *testLoop, _ []job) {
				parts := make([]int, tl.cfg.Partitions)
				for p := range parts {
					parts[p] = p
				}
				tl.releaseNow(parts...)
			})
		})
	}
}
