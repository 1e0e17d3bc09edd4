// Package client is the Go client of a shardcron node's HTTP API
// (docs/api.md, "HTTP API"): tasks, batches, bulk actions, history, nodes
// and partitions. It also holds the JSON bodies of the API's answers, which
// the server (package api) writes with the same types.
//
// It links the task model (package task, with its schedule parser and its
// JSON library) and the standard library only: not etcd, Badger, the
// engine or the server, so that a program that only
// talks to a cluster stays small. TestDeps_Thin keeps it so.
//
// Methods named Local* and Self ask one node about itself alone (what it
// owns, its own records); nodes use them to gather a cluster-wide answer,
// which the other methods return.
package client
