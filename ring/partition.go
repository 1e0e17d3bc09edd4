package ring

import (
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Partition returns the partition of a task id: xxhash64(id) mod partitions,
// in [0, partitions). It never allocates. When partitions is less than 2
// every id is in partition 0. The result must never change between
// releases: tasks are stored in etcd under their partition.
func Partition(id string, partitions int) int {
	if partitions < 2 {
		return 0
	}
	return int(xxhash.Sum64String(id) % uint64(partitions))
}

// Ranges writes partitions as sorted runs, each number once ("0-2,5,7-8"):
// a node acquires or releases hundreds at once, which as numbers fill a
// screen. ps is not changed.
func Ranges(ps []int) string {
	s := slices.Compact(slices.Sorted(slices.Values(ps)))
	var b []byte
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if len(b) > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(s[i]), 10)
		if j > i {
			b = append(b, '-')
			b = strconv.AppendInt(b, int64(s[j]), 10)
		}
		i = j + 1
	}
	return string(b)
}
