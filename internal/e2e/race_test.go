//go:build race

package e2e_test

// raceEnabled: the race detector is on; it costs time and memory.
const raceEnabled = true
