package bench

import (
	"testing"

	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
)

// BenchmarkPostgresStore times the Postgres store's writes on the hot path,
// without gRPC or the executor, each against the single-row INSERT commit
// measured alongside it (x-insert) through the same pool:
//
//   - reserve+record: ClaimCall of a fresh key with its attempted event,
//     then FinishCall SUCCEEDED with its outcome event and no health change
//     — the two write transactions of an executed call.
//   - append: AppendAuditEvents of one event — the write of a refusal (a
//     replay's event rides in its claim).
//
// Read with TestPostgresStoreRoundTrips, which counts their round trips.
func BenchmarkPostgresStore(b *testing.B) {
	s := startServer(b, apptest.Postgres)
	// A second Store on the App's pool: the statements are the store's,
	// the connections the same the insert baseline uses. It is not closed
	// (that would close the App's pool); it has started nothing of its own.
	st := postgres.New(s.pool)
	ops := newStoreOps(st, "store-"+s.run)
	reserveRecord := func() op { return op{name: "reserve+record", do: ops.reserveRecord} }
	appendEvent := func() op { return op{name: "append", do: ops.appendEvent} }
	for _, subject := range []func() op{reserveRecord, appendEvent} {
		b.Run(subject().name, func(b *testing.B) {
			measureSerial(b, subject, s.opInsert)
		})
	}
}
