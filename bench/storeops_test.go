package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

// storeOps are the Postgres store's hot-path writes as BenchmarkPostgresStore
// and BenchmarkPostgresDatabaseCPU time them, with events like the
// pipeline's, each call on a fresh key (keyPrefix and a counter).
type storeOps struct {
	st        store.Store
	keyPrefix string
	now       time.Time
	seq       atomic.Uint64
}

func newStoreOps(st store.Store, keyPrefix string) *storeOps {
	return &storeOps{st: st, keyPrefix: keyPrefix, now: time.Now().UTC()}
}

func (o *storeOps) event(typ, callID string) []store.AuditEvent {
	return []store.AuditEvent{audit.NewDetail(typ, store.AuditEvent{
		Time: o.now, CallID: callID, Principal: principal, Tool: "echo", Action: "echo",
	}, map[string]any{"attempt": 1, "probe": false})}
}

// reserveRecord is ClaimCall of a fresh key with its attempted event, then
// FinishCall SUCCEEDED with its outcome event and no health change: the two
// write transactions of an executed call.
func (o *storeOps) reserveRecord(ctx context.Context) error {
	now := o.now
	c := &store.Call{
		ID: audit.NewID(), PrincipalID: principal, IdempotencyKey: fmt.Sprintf("%s-%d", o.keyPrefix, o.seq.Add(1)),
		Fingerprint: "fp", Tool: "echo", Action: "echo", State: store.CallInProgress, AttemptCount: 1,
		LeaseExpiresAt: now.Add(time.Minute), CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
	if _, ok, err := o.st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute, Events: o.event(audit.ToolCallAttempted, c.ID)}); err != nil || !ok {
		return fmt.Errorf("ClaimCall: claimed %v, %v", ok, err)
	}
	_, err := o.st.FinishCall(ctx, store.FinishCallParams{
		CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: &store.Result{Success: true, Message: "ok"},
		Now: now, ExpiresAt: now.Add(time.Hour), Events: o.event(audit.ToolCallSucceeded, c.ID),
	})
	return err
}

// appendEvent is AppendAuditEvents of one event (a refusal's write).
func (o *storeOps) appendEvent(ctx context.Context) error {
	return o.st.AppendAuditEvents(ctx, o.event(audit.ToolCallDeduped, ""))
}
