//go:build !linux

package engine

import "time"

// threadCPU is not measured here: 0.
func threadCPU() time.Duration { return 0 }
