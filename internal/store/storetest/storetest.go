// Package storetest is the conformance suite of store.Store: one set of tests
// that every backend runs (memory and Postgres), so that they cannot quietly
// behave differently. It asserts returned records, stored records and audit
// events exactly, including under concurrency.
//
// The suite builds its times from a fixed base, truncated to microseconds
// (Postgres' precision), and compares them with Equal; JSON documents are
// compared by meaning, not bytes (jsonb reorders keys and respaces). IDs are
// UUIDs, so a backend may store them in uuid columns.
package storetest

import (
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// test is one conformance test; it gets a fresh store of its own.
type test struct {
	name string
	fn   func(t *testing.T, s store.Store)
}

// Run runs the whole suite. newStore is called once per subtest and must
// return an empty store; the subtests run in parallel. Run closes each store
// when its subtest ends (after which newStore's own cleanups run), so Close
// must tolerate being called twice.
//
// There are no opt-outs: every backend must pass every test.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	groups := []struct {
		name  string
		tests []test
	}{
		{"Tools", toolTests()},
		{"Toolsets", toolsetTests()},
		{"Health", healthTests()},
		{"Calls", callTests()},
		{"ParkedCalls", parkedTests()},
		{"ParkLimits", parkLimitTests()},
		{"Approvals", approvalTests()},
		{"Previews", previewTests()},
		{"Audit", auditTests()},
		{"RefusedEvents", refusedEventTests()},
		{"TaskHistory", historyTests()},
		{"Keys", keyTests()},
		{"Notifications", notificationTests()},
		{"Outbox", outboxTests()},
		{"Sessions", sessionTests()},
		{"Limits", limitTests()},
		{"Lifecycle", lifecycleTests()},
		{"Nested", nestedTests()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					s := newStore(t)
					t.Cleanup(s.Close)
					tc.fn(t, s)
				})
			}
		})
	}
}

// base is the suite's clock: the store never reads one, so every time the
// suite passes is derived from here.
var base = time.Date(2031, time.March, 4, 5, 6, 7, 891234000, time.UTC)

// at returns base+d as Postgres would store it.
func at(d time.Duration) time.Time {
	return base.Add(d).UTC().Truncate(time.Microsecond)
}

// waitTimeout bounds how long the suite waits for notifications.
const waitTimeout = 5 * time.Second
