package idempotency

import (
	"testing"

	"go.uber.org/goleak"
)

// Leases and the reaper run goroutines; none may outlive Stop or its context.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
