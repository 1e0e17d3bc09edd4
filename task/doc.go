// Package task is shardcron's task model: the Task as docs/api.md's "Task
// JSON" defines it, its defaults, its validation, DecodeTask and the
// *ValidationError every refusal is.
//
// It is a leaf: it imports engine/schedule (to parse schedules) and
// engine/executor (whose constructors and field rules it shares), and links
// neither etcd, nor Badger, nor the engine, so clients can use the model
// alone (TestDeps_Leaf checks that with go list -deps).
//
// # What it guarantees
//
//   - DecodeTask and Validate refuse, with a *ValidationError naming the
//     field by its JSON path, every task the engine cannot run as written:
//     a task that validates builds its executor on every node whose
//     allow-lists admit it.
//   - A validated task is normalized (defaults applied, empty collections
//     nil, payload compacted): it encodes and decodes to an equal Task, and
//     Validate is idempotent.
//   - The rules of each executor type's fields live once, in package
//     executor; kind.go's table says which fields a type takes, how they
//     are checked and how the executor is built.
//   - DecodeStored (json v2, github.com/go-json-experiment/json) reads
//     task JSON into what json.Unmarshal reads, or fails; it reads
//     whatever the encoder writes.
//     AppendResponse passes a stored task on as a response with its
//     partition and version, checked as JSON, not decoded: for a task as
//     the registry writes it, the bytes that decoding and encoding it give
//     (stored.go).
//
// # What it does not guarantee
//
//   - Validation says nothing about the cluster: whether a live node runs
//     exec, has a handler, or may reach a URL is registry.Runners' question.
//   - A Task is a plain value with no locking; it is not safe to modify
//     one while another goroutine reads it.
//
// # Where to change what
//
//   - A field of the model: task.go (the struct, its JSON and DecodeTask),
//     validate.go (its rule and default), then, when a fire uses it, the
//     engine's appendProfileKey and the registry's firing decode (their
//     reflection tests fail until then).
//   - An executor type: its fields on Executor and an entry in kind.go's
//     kinds; its rules in engine/executor.
package task
