// Package ring maps task ids to partitions and partitions to the nodes that
// own them.
//
// A task id belongs to partition Partition(id, P) = xxhash64(id) mod P, for
// ever: P is fixed when a cluster is created. Which member owns each
// partition is computed by consistent hashing with bounded loads
// (github.com/buraksezer/consistent v0.10.0), with member names and
// partition numbers hashed by xxhash64.
//
// Guarantees:
//   - Deterministic: NewAssignment depends only on the Config and on the set
//     of member names, not on their order, so every node that sees the same
//     member set computes the same owner for every partition. The result is
//     pinned by golden tests, so that nodes running different builds of
//     shardcron agree too.
//   - Bounded load: no member owns more than Capacity() =
//     ceil(floor(P/N) × Load) partitions (or P if that is less), N being the
//     number of members, at most P. This is consistent's own bound; it is at
//     most ceil(Load × P/N), and because of the floor it can be as low as
//     1.1 × P/N with Load 1.25 (P=1024, N=114).
//   - Small moves, while members hold many partitions: when one member
//     joins or leaves, partitions mostly move to the newcomer or away from
//     the leaver. With N <= P/32 at most 2.5 × P/N partitions move (measured
//     up to 1.8 × P/N). With fewer partitions per member a change that
//     lowers the bound (floor(P/N) drops) moves more: 3.1 × P/N at P=1024
//     when N goes from 60 to 61, 11 × P/N from 113 to 114.
//   - Lock-free lookups: an Assignment is immutable and Ring publishes it
//     through an atomic pointer, so Owner costs an atomic load and a slice
//     index, takes no lock and never allocates, from any number of
//     goroutines.
//   - More members than partitions: the P members of lowest xxhash own one
//     partition each and the rest stand by, owning none until one of the P
//     leaves (consistent cannot place fewer partitions than members).
//   - No panics: the combinations of P, members, ReplicationFactor and Load
//     that make consistent panic are refused with an error up front, and a
//     panic from consistent would still be recovered into ErrNoRoom.
//
// It does not:
//   - know who the members are: membership (and debouncing changes to it) is
//     the caller's job, as is acting on the partitions Diff reports;
//   - read the clock, start goroutines or talk to etcd;
//   - agree across nodes whose Config or member set differ: identical owners
//     require an identical Config (Partitions, ReplicationFactor, Load) and
//     an identical member set on every node.
package ring
