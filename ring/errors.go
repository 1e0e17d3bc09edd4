package ring

import (
	"errors"
	"fmt"
)

// ErrNoRoom is returned (wrapped) when the partitions cannot all be placed
// within the per-member bound: there are more members than partitions. It
// is consistent's "not enough room to distribute partitions" as an error
// instead of a panic.
var ErrNoRoom = errors.New("ring: not enough room to distribute partitions")

// ValidationError reports invalid input: a Config field or the member list.
// Reason is meant for the user who supplied the value.
type ValidationError struct {
	Field  string // "Partitions", "ReplicationFactor", "Load" or "members"
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("ring: %s: %s", e.Field, e.Reason)
}
