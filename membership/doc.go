// Package membership registers this node in etcd under a lease, watches the
// set of registered nodes, and keeps the session's fencing deadline.
//
// A node joins with Join: its key /<prefix>/nodes/<node-id> holds its
// NodeInfo and lives exactly as long as the session's lease. Two live nodes
// never hold the same id: Join waits out a crashed holder's lease and fails
// with ErrNodeExists while a live one keeps refreshing it.
//
// # Fencing
//
// The session refreshes its lease with its own keep-alive loop and computes
//
//	deadline = send time of the last acknowledged keep-alive + TTL - FenceMargin
//
// on the monotonic clock. etcd renews a lease when it receives the keep-alive,
// which is after it was sent, so the lease outlives the deadline by at least
// FenceMargin however slow the network, and a paused process (GC, SIGSTOP)
// finds the deadline passed when it resumes. Session.Fenced and Session.Done
// report that the deadline has passed; a caller that stops dispatching then
// never acts after its lease (and the partition locks held under it) can
// have passed to another node. This holds as long as the node's and the etcd
// leader's clocks run at the same rate to within FenceMargin per TTL; it does
// not depend on their wall clocks agreeing.
//
// The session does not guarantee the converse: the lease may outlive the
// deadline by more than FenceMargin (the etcd client's own keep-alives, see
// Session.Mutexes, or a keep-alive whose acknowledgement was lost). That only
// delays failover and never lets two nodes act on the same lease.
//
// The keep-alives share one gRPC stream, opened by Join before the lease is
// granted and again only after a keep-alive failed: on an etcd with
// password authentication every stream the client opens costs a login (a
// bcrypt on etcd), which a keep-alive must not wait for
// (TestSession_KeepAlivesShareOneLogin).
//
// # Member set
//
// Watch and List read the registered nodes. The member set is eventually
// consistent: every node sees every change within about a watch delivery
// plus the debounce, but two nodes may briefly see different sets.
package membership
