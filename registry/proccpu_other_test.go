//go:build !linux

package registry

import "time"

// processCPU is not measured off Linux.
func processCPU() time.Duration { return 0 }
