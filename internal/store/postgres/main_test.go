package postgres_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Store started goroutines (pool health checks, the listener, one per
// subscription); Close must have ended them all.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
