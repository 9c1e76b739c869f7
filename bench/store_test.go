package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
)

// BenchmarkPostgresStore times the Postgres store's writes on the hot path,
// without gRPC or the executor, each against the single-row INSERT commit
// measured alongside it (x-insert) through the same pool:
//
//   - reserve+record: ClaimCall of a fresh key with its attempted event,
//     then FinishCall SUCCEEDED with its outcome event and no health change
//     — the two write transactions of an executed call.
//   - append: AppendAuditEvents of one event — the write of a replay.
//
// Read with TestPostgresStoreRoundTrips, which counts their round trips.
func BenchmarkPostgresStore(b *testing.B) {
	s := startServer(b, apptest.Postgres)
	// A second Store on the App's pool: the statements are the store's,
	// the connections the same the insert baseline uses. It is not closed
	// (that would close the App's pool); it has started nothing of its own.
	st := postgres.New(s.pool)
	now := time.Now().UTC()
	var seq atomic.Uint64
	event := func(typ, callID string) []store.AuditEvent {
		return []store.AuditEvent{audit.NewDetail(typ, store.AuditEvent{
			Time: now, CallID: callID, Principal: principal, Tool: "echo", Action: "echo",
		}, map[string]any{"attempt": 1, "probe": false})}
	}
	reserveRecord := func() op {
		return op{name: "reserve+record", do: func(ctx context.Context) error {
			c := &store.Call{
				ID: audit.NewID(), PrincipalID: principal, IdempotencyKey: fmt.Sprintf("store-%s-%d", s.run, seq.Add(1)),
				Fingerprint: "fp", Tool: "echo", Action: "echo", State: store.CallInProgress, AttemptCount: 1,
				LeaseExpiresAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
			}
			if _, ok, err := st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute, Events: event(audit.ToolCallAttempted, c.ID)}); err != nil || !ok {
				return fmt.Errorf("ClaimCall: claimed %v, %v", ok, err)
			}
			_, err := st.FinishCall(ctx, store.FinishCallParams{
				CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: &store.Result{Success: true, Message: "ok"},
				Now: now, ExpiresAt: now.Add(time.Hour), Events: event(audit.ToolCallSucceeded, c.ID),
			})
			return err
		}}
	}
	appendEvent := func() op {
		return op{name: "append", do: func(ctx context.Context) error {
			return st.AppendAuditEvents(ctx, event(audit.ToolCallDeduped, ""))
		}}
	}
	for _, subject := range []func() op{reserveRecord, appendEvent} {
		b.Run(subject().name, func(b *testing.B) {
			measureSerial(b, subject, s.opInsert)
		})
	}
}
