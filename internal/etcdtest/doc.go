// Package etcdtest is the test fixture for code that talks to etcd: an
// embedded single-member etcd server, a TCP proxy that can cut a client off
// from it, an address that refuses connections, and a polling helper.
//
// Every Cluster listens on loopback ports chosen by the kernel (port 0), so
// any number of test packages can run in parallel without collisions, and it
// is stopped and its data directory removed when the test ends. The server
// runs without fsync: it is fast and loses data on a machine crash, which is
// fine for tests and wrong for anything else.
//
// It is meant for tests (and test harnesses), and imports no other shardcron
// package than internal/etcdembed, which starts the server.
package etcdtest
