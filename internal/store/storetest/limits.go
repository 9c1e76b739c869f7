package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

func limitTests() []test {
	return []test{
		{"Negative", testNegativeLimits},
		{"ZeroMeansAll", testZeroLimits},
	}
}

// testNegativeLimits: a negative limit or cursor is the caller's mistake,
// not "no limit".
func testNegativeLimits(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	calls := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"ListTools", func(ctx context.Context) error {
			_, err := s.ListTools(ctx, store.ListToolsParams{Limit: -1})
			return err
		}},
		{"ListToolHealth", func(ctx context.Context) error {
			_, err := s.ListToolHealth(ctx, store.ListToolHealthParams{Limit: -1})
			return err
		}},
		{"ListApprovals", func(ctx context.Context) error {
			_, err := s.ListApprovals(ctx, store.ListApprovalsParams{Limit: -1})
			return err
		}},
		{"ListAuditEvents", func(ctx context.Context) error {
			_, err := s.ListAuditEvents(ctx, store.AuditFilter{Limit: -1})
			return err
		}},
		{"ListAuditEventsAfterSeq", func(ctx context.Context) error {
			_, err := s.ListAuditEvents(ctx, store.AuditFilter{AfterSeq: -1})
			return err
		}},
		{"ListTaskHistory", func(ctx context.Context) error {
			_, err := s.ListTaskHistory(ctx, store.TaskHistoryFilter{PrincipalID: "agent-1", TaskID: "task-1", Limit: -1})
			return err
		}},
		{"ReapExpiredLeases", func(ctx context.Context) error {
			_, err := s.ReapExpiredLeases(ctx, store.ReapParams{Now: at(time.Hour), Limit: -1})
			return err
		}},
		{"ExpireApprovals", func(ctx context.Context) error {
			_, err := s.ExpireApprovals(ctx, store.ExpireParams{Now: at(time.Hour), Limit: -1})
			return err
		}},
		{"DeleteExpiredCalls", func(ctx context.Context) error {
			_, err := s.DeleteExpiredCalls(ctx, at(time.Hour), -1)
			return err
		}},
	}
	for _, c := range calls {
		wantErr(t, c.name+" with a negative limit", c.fn(ctx), store.ErrInvalid)
	}
}

// testZeroLimits: the sweeps treat limit 0 like the lists do: no limit.
func testZeroLimits(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := range 3 {
		claimLease(t, s, newCall("agent-1", "run-"+itoa(i), store.CallInProgress), shortLease)
		claim(t, s, newCall("agent-1", "park-"+itoa(i), store.CallAwaitingApproval))
		claim(t, s, newCall("agent-1", "preview-"+itoa(i), store.CallAwaitingPreview))
	}
	expireShortLeases()
	reaped, err := s.ReapExpiredLeases(ctx, store.ReapParams{Now: at(time.Hour), ExpiresAt: at(2 * time.Hour)})
	noErr(t, "ReapExpiredLeases", err)
	if len(reaped) != 3 {
		t.Fatalf("reap with limit 0 took %d of 3", len(reaped))
	}
	expired, err := s.ExpireApprovals(ctx, store.ExpireParams{Now: at(2 * time.Hour), ExpiresAt: at(2 * time.Hour)})
	noErr(t, "ExpireApprovals", err)
	if len(expired.Approvals) != 3 || len(expired.Previews) != 3 {
		t.Fatalf("expiry with limit 0 took %d of 3 approvals and %d of 3 previews", len(expired.Approvals), len(expired.Previews))
	}
	n, err := s.DeleteExpiredCalls(ctx, at(3*time.Hour), 0)
	noErr(t, "DeleteExpiredCalls", err)
	if n != 9 {
		t.Fatalf("retention with limit 0 removed %d of 9", n)
	}
}
