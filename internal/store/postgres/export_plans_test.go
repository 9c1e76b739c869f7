package postgres

import (
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// HotStatement is a statement of the hot path as the store sends it.
type HotStatement struct {
	Name string
	SQL  string
	Args []any
}

// HotStatements returns the statements of the hot path with sample
// arguments: the lookups, the claim, the recorded outcome, the lease
// renewal and the release of a claim.
func HotStatements() []HotStatement {
	now := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	c := &store.Call{ID: "plan-call", PrincipalID: "plan-p", IdempotencyKey: "plan-k", Fingerprint: "fp",
		Tool: "files", Action: "write", State: store.CallInProgress, AttemptCount: 1,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	args, err := callArgs(c)
	if err != nil {
		panic(err)
	}
	args[leaseArgIndex] = leaseArg(time.Minute)
	events := []store.AuditEvent{{ID: "plan-ev", Type: "tool_call.attempted", Time: now, CallID: c.ID, Principal: "plan-p"}}
	rows, err := newAuditRows(events)
	if err != nil {
		panic(err)
	}
	replayed := &store.AuditEvent{ID: "plan-replay", Type: "tool_call.deduped", Time: now, Principal: "plan-p"}
	claimSQL, claimArgs := claimStatement(c, store.ClaimCallParams{Call: c, Lease: time.Minute, Events: events, Replayed: replayed},
		args, rows, newReplayedRow(replayed))
	result := `{"success":true}`
	fp := store.FinishCallParams{CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Now: now, ExpiresAt: now.Add(time.Hour),
		Events: events, History: &store.TaskHistoryEntry{PrincipalID: "plan-p", TaskID: "t", CallID: c.ID, Tool: "files", Action: "write", At: now}}
	finishSQL, finishArgs := finishStatement(fp, result, rows)
	return []HotStatement{
		{"GetCall", getCallSQL, []any{c.ID}},
		{"GetCallByKey", getCallByKeySQL, []any{c.PrincipalID, c.IdempotencyKey}},
		{"FindParkedCall", findParkedCallSQL, []any{c.PrincipalID, c.Tool, c.Action, c.Fingerprint}},
		{"ClaimCall", claimSQL, claimArgs},
		{"FinishCall", finishSQL, finishArgs},
		{"RenewCallLease", renewLeaseSQL, []any{c.ID, 1, leaseArg(time.Minute)}},
		{"ReleaseClaim", releaseClaimSQL, []any{c.PrincipalID, c.IdempotencyKey, "token", result, now, now.Add(time.Hour), "tool_call.unknown_answered"}},
	}
}
