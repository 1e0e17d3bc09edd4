package ring_test

import (
	"fmt"

	"github.com/shardcron/shardcron/ring"
)

// A node rebuilds its ring on each membership change and acts on the
// partitions it gained and lost.
func ExampleRing() {
	r, err := ring.New(ring.DefaultConfig())
	if err != nil {
		panic(err)
	}
	prev := r.Current() // nil: nothing owned yet
	next, err := r.Update([]string{"node-b", "node-a", "node-c"})
	if err != nil {
		panic(err)
	}
	gained, lost := ring.Diff(prev, next, "node-a")
	fmt.Println(len(gained) == len(next.Owned("node-a")), len(lost))

	p := ring.Partition("billing/invoice-42", r.Config().Partitions)
	owner, _ := r.Owner(p)
	fmt.Println(p, owner == next.Owner(p))
	// Output:
	// true 0
	// 14 true
}
