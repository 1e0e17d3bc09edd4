// Package registry is the store of shardcron's task definitions in etcd:
// create, read, update, delete, batches, bulk actions, lists and export by
// prefix and labels (with their index), triggers, the capability check of
// the live nodes (Runners), and the reads a node loads its partitions with
// (ReadPartition, WatchPartition, CatchUp, ChangesAt, DecodeFiring).
// It owns the etcd layout of tasks, triggers and the index
// (/<prefix>/tasks/<partition>/<id>, /<prefix>/triggers/..., /<prefix>/index/...);
// the engine's runtime keys (locks, checkpoints, watermarks) are not its.
//
// A Registry needs no running engine: the API and the CLI's import use it
// alone. It is the seam where a store other than etcd could plug in
// (docs/design.md).
//
// # What it guarantees
//
//   - Every method validates its input (package task) before it writes: a
//     refused request leaves etcd, and its revision, untouched.
//   - Put with IfVersion writes only over that exact version; a put that
//     changes nothing writes nothing. Reads of many tasks (List pages,
//     Export) are each taken at one revision, in id order.
//   - A batch writes each task with its index keys in one transaction, and
//     stays within etcd's request limits (MaxTxnOps, MaxTxnBytes).
//   - ReadPartition reads a partition at one revision; ChangesAt gives
//     every task created, changed or deleted between two revisions,
//     whatever etcd compacted since.
//
// # What it does not guarantee
//
//   - A bulk action over many tasks is not atomic: it writes them in
//     transactions of at most MaxTxnOps operations, and one stopped midway
//     returns what was done so far; running it again finishes the job.
//   - A trigger is a request to the partition's owner: Trigger returns once
//     it is stored, not once it fired.
//   - Runners reads membership as it is; a node may leave right after.
//   - WrittenBy and HeldAt read a task's earlier versions from etcd's
//     history: one etcd compacted is gone (ErrVersionGone), and so, for
//     WrittenBy, is one more than 16 writes back.
package registry
