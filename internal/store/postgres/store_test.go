package postgres_test

import (
	"testing"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/store/storetest"
)

// The shared conformance suite, each subtest on a database of its own.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return pgtest.NewStore(t) })
}
