package ring

import (
	"errors"
	"fmt"
)

// ErrNoRoom is returned (wrapped) should the partitions not all fit within
// the per-member bound, which a valid Config with at most P active members
// always does: it is consistent's "not enough room to distribute
// partitions" as an error instead of a panic.
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
