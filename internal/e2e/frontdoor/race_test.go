//go:build race

package frontdoor_test

// raceEnabled: the tests run with the race detector, and so does the
// toolsvc they build.
const raceEnabled = true
