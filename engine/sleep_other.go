//go:build !linux

package engine

import "time"

// sleepPrecise sleeps for d, as precisely as the runtime's timers allow on
// this system (see sleep_linux.go).
func sleepPrecise(d time.Duration) { time.Sleep(d) }
