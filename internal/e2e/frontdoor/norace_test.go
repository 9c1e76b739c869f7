//go:build !race

package frontdoor_test

const raceEnabled = false
