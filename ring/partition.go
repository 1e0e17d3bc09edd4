package ring

import "github.com/cespare/xxhash/v2"

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
