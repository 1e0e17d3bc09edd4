//go:build race

package engine

// raceEnabled: the tests run under the race detector, which makes the
// CPU, not the clock, their bound.
const raceEnabled = true
