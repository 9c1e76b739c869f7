package postgres

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

// notRunningOrParked selects calls retention may delete; it is the predicate
// of calls_retention_idx, spelled the same so that the planner uses it.
const notRunningOrParked = `state NOT IN ('IN_PROGRESS', 'AWAITING_APPROVAL', 'AWAITING_PREVIEW')`

// The lookups of the hot path; each is served by an index (see
// plans_test.go).
const (
	getCallSQL      = `SELECT ` + callColumns + ` FROM calls WHERE id = $1`
	getCallByKeySQL = `SELECT ` + callColumns + ` FROM calls WHERE principal_id = $1 AND idempotency_key = $2`
	renewLeaseSQL   = `UPDATE calls SET lease_expires_at = now() + $3::interval
		WHERE id = $1 AND state = 'IN_PROGRESS' AND attempt_count = $2`
	// findParkedCallSQL is served by calls_parked_idx, whose predicate it
	// repeats.
	findParkedCallSQL = `SELECT ` + callColumns + ` FROM calls
		WHERE principal_id = $1 AND tool = $2 AND action = $3 AND fingerprint = $4
		AND state IN ('AWAITING_APPROVAL', 'AWAITING_PREVIEW')
		ORDER BY id DESC LIMIT 1`
)

// GetCall implements store.CallStore.
func (s *Store) GetCall(ctx context.Context, id string) (*store.Call, error) {
	c, err := scanCall(s.pool.QueryRow(ctx, getCallSQL, id))
	if err != nil {
		return nil, fmt.Errorf("get call %q: %w", id, err)
	}
	return c, nil
}

// GetCallByKey implements store.CallStore.
func (s *Store) GetCallByKey(ctx context.Context, principalID, key string) (*store.Call, error) {
	c, err := scanCall(s.pool.QueryRow(ctx, getCallByKeySQL, principalID, key))
	if err != nil {
		return nil, fmt.Errorf("get call of principal %q by key %q: %w", principalID, key, err)
	}
	return c, nil
}

// FindParkedCall implements store.CallStore.
func (s *Store) FindParkedCall(ctx context.Context, p store.FindParkedCallParams) (*store.Call, error) {
	if p.PrincipalID == "" || p.Tool == "" || p.Action == "" || p.Fingerprint == "" {
		return nil, fmt.Errorf("%w: find parked call: principal, tool, action and fingerprint are required", store.ErrInvalid)
	}
	c, err := scanCall(s.pool.QueryRow(ctx, findParkedCallSQL, p.PrincipalID, p.Tool, p.Action, p.Fingerprint))
	if err != nil {
		return nil, fmt.Errorf("find parked call of principal %q for %s.%s: %w", p.PrincipalID, p.Tool, p.Action, err)
	}
	return c, nil
}

// insertClaimCTE claims a free key, as the common table expression ins of a
// WITH clause: it inserts the call, or does nothing if a record holds the
// key. It neither reads the holder under a lock nor writes to it, so a
// claim that loses — a replay, a call in progress — writes nothing and
// commits without a flush of the WAL. (An INSERT … ON CONFLICT DO UPDATE
// whose WHERE is false still locks the holder's row: a WAL record and a
// flushed commit for every replay.)
//
// The lease ($17, an interval or NULL) runs from the database's clock, which
// every replica shares (see leaseArg).
var insertClaimCTE = `ins AS (INSERT INTO calls (` + callColumns + `)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, now() + $17::interval, $18, $19, $20, $21, $22, $23, $24,
		$25, $26, $27)
	ON CONFLICT ON CONSTRAINT calls_principal_key_uniq DO NOTHING
	RETURNING ` + callColumns + `)`

// takeoverCTE, after insertClaimCTE (same arguments), is took: it takes the
// holder over if it is RELEASED with the same fingerprint, keeping its id
// and created_at and counting the attempt. A holder committed after the
// statement's snapshot was taken is not seen: the claim loses, and the
// caller reads the holder again.
const takeoverCTE = `took AS (UPDATE calls SET
		fingerprint = $4, tool = $5, action = $6, tool_version = $7, state = $8, trace_id = $9, task_id = $10,
		step_id = $11, risk = $12, decision = $13, approval_id = $14, preview_token = $15, result = $16,
		lease_expires_at = now() + $17::interval,
		attempt_count = calls.attempt_count + CASE WHEN $8 = 'IN_PROGRESS' THEN 1 ELSE 0 END,
		resolved_by = $19, resolution_comment = $20, updated_at = $22, expires_at = $23, claim_token = $24,
		parent_call_id = $25, progress_message = $26, progress_at = $27
	WHERE principal_id = $2 AND idempotency_key = $3 AND state = 'RELEASED' AND fingerprint = $4
		AND NOT EXISTS (SELECT 1 FROM ins)
	RETURNING ` + callColumns + `)`

// claimCallSQL is the whole claim (arguments those of callColumns): the
// claimed row — inserted, or a released record taken over — or none if it
// lost. The hot path's claimStatement leaves the takeover out (it is rare,
// and a second data-modifying CTE on calls costs every claim its start-up);
// a claim that finds a released record it may take over comes here.
var claimCallSQL = `WITH ` + insertClaimCTE + `, ` + takeoverCTE + `
	SELECT ` + callColumns + ` FROM ins UNION ALL SELECT ` + callColumns + ` FROM took`

const insertApprovalSQL = `INSERT INTO approvals (` + approvalColumns + `)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)`

const insertPreviewSQL = `INSERT INTO previews (` + previewColumns + `)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`

// ClaimCall implements store.CallStore.
//
// The claim is one statement (claimStatement), committed with whatever
// other hot-path statements are waiting (commitGrouped): the claim and, only
// if it claimed, the approval or preview, the events and the notification;
// if it lost, the holder as the statement saw it — one round trip. If the
// holder was not visible to the statement (it committed meanwhile) or looked
// claimable, it is read again; if it has meanwhile become claimable
// (released with this fingerprint) or gone, or if an event is refused (which
// must be reported only once the claim is known to have won), the claim is
// decided again by claimInTx, which tries the claim again with a newer
// snapshot and is where a released record is taken over.
func (s *Store) ClaimCall(ctx context.Context, p store.ClaimCallParams) (*store.Call, bool, error) {
	if p.Call == nil {
		return nil, false, fmt.Errorf("%w: claim call: no call", store.ErrInvalid)
	}
	c := *p.Call
	if c.ID == "" || c.PrincipalID == "" || c.IdempotencyKey == "" {
		return nil, false, fmt.Errorf("%w: claim call: id, principal and idempotency key are required", store.ErrInvalid)
	}
	// A parked claim brings exactly what it is parked behind.
	var shapeOK bool
	switch c.State {
	case store.CallInProgress:
		shapeOK = p.Approval == nil && p.Preview == nil
	case store.CallAwaitingApproval:
		shapeOK = p.Approval != nil && p.Approval.ID != "" && p.Preview == nil
	case store.CallAwaitingPreview:
		shapeOK = p.Preview != nil && p.Preview.Token != "" && p.Approval == nil
	default:
		return nil, false, fmt.Errorf("%w: claim call %q in state %q", store.ErrInvalid, c.ID, c.State)
	}
	if !shapeOK {
		return nil, false, fmt.Errorf("%w: claim call %q: state %s takes an approval (with an id) only if AWAITING_APPROVAL and a preview (with a token) only if AWAITING_PREVIEW",
			store.ErrInvalid, c.ID, c.State)
	}
	if c.State == store.CallInProgress && p.Lease <= 0 {
		return nil, false, fmt.Errorf("%w: claim call %q: an IN_PROGRESS claim needs a lease", store.ErrInvalid, c.ID)
	}
	args, err := callArgs(&c)
	if err != nil {
		return nil, false, err
	}
	args[leaseArgIndex] = nil
	if c.State == store.CallInProgress {
		args[leaseArgIndex] = leaseArg(p.Lease)
	}

	var (
		out     *store.Call
		claimed bool
		events  []store.AuditEvent // p.Events as stored, when claimed
	)
	if limited := c.State.Parked() && p.Limits != (store.ParkLimits{}); limited {
		// Parking within limits reads the principal's parked calls under a
		// lock of its own: a transaction, off the grouped hot path (parking
		// waits for a person anyway).
		out, claimed, events, err = s.claimInTx(ctx, p, &c, args)
		if err != nil {
			return nil, false, err
		}
	} else if rows, err := newAuditRows(p.Events); err == nil {
		rep := newReplayedRow(p.Replayed)
		var (
			row      *store.Call
			won      bool
			ids      []string
			seqs     []int64
			notified *int64
			repSeq   *int64
		)
		claim := func(rep *replayedRow) error {
			q, qargs := claimStatement(&c, p, args, rows, rep)
			return s.commitGrouped(ctx, &groupStmt{sql: q, args: qargs, order: "1" + c.PrincipalID + "\x00" + c.IdempotencyKey,
				scan: func(r pgx.Rows) error {
					row, won, ids, seqs, notified, repSeq = nil, false, nil, nil, nil, nil
					if !r.Next() {
						return nil
					}
					dst := []any{&won, &ids, &seqs}
					if p.Approval != nil {
						dst = append(dst, &notified)
					}
					if rep != nil {
						dst = append(dst, &repSeq)
					}
					var err error
					row, err = scanCall(r, dst...)
					return err
				}})
		}
		err := claim(rep)
		if err != nil && rep != nil && !errors.Is(err, store.ErrUnavailable) {
			// The statement was refused, so nothing of it committed: the
			// claim goes on without the replay's event, which the caller
			// then appends itself (and is told why it cannot).
			err = claim(nil)
			rep = nil
		}
		switch {
		case err != nil:
			return nil, false, fmt.Errorf("claim call %q: %w", c.ID, err)
		case row != nil && won:
			out, claimed = row, true
			events = append([]store.AuditEvent(nil), p.Events...)
			if out.ID != c.ID {
				for i := range events {
					events[i].CallID = out.ID
				}
			}
			if err := setSeqs(events, ids, seqs); err != nil {
				return nil, false, fmt.Errorf("claim call %q: %w", c.ID, err)
			}
		case row != nil && (row.State != store.CallReleased || row.Fingerprint != c.Fingerprint):
			// Lost, and the statement saw the holder: nothing was written
			// but, if the holder answers it as a replay, the replay's event.
			if rep != nil && repSeq != nil {
				ev := rep.ev
				if err := audit.CompleteReplayed(&ev, row); err != nil {
					return nil, false, fmt.Errorf("claim call %q: %w", c.ID, err)
				}
				ev.Seq = *repSeq
				*p.Replayed = ev
			}
			return row, false, nil
		default:
			// Lost, and the holder was not visible to the statement
			// (committed after it began) or looked claimable: read it now
			// that it is committed (the claim waited for its transaction).
			out, err = scanCall(s.pool.QueryRow(ctx, getCallByKeySQL, c.PrincipalID, c.IdempotencyKey))
			if err != nil && !isNotFound(err) {
				return nil, false, fmt.Errorf("claim call: read the holder of key %q: %w", c.IdempotencyKey, err)
			}
			if err == nil && (out.State != store.CallReleased || out.Fingerprint != c.Fingerprint) {
				return out, false, nil
			}
			// Released or deleted since: claimable again.
			out, claimed, events, err = s.claimInTx(ctx, p, &c, args)
			if err != nil {
				return nil, false, err
			}
		}
	} else {
		out, claimed, events, err = s.claimInTx(ctx, p, &c, args)
		if err != nil {
			return nil, false, err
		}
	}
	if claimed {
		keptID := out.ID
		if p.Call.ID != keptID {
			p.Call.ID = keptID
			if p.Approval != nil {
				p.Approval.CallID = keptID
			}
			if p.Preview != nil {
				p.Preview.CallID = keptID
			}
			for i := range p.Events {
				p.Events[i].CallID = keptID
			}
		}
		for i := range p.Events {
			p.Events[i].Seq = events[i].Seq
		}
	}
	return out, claimed, nil
}

// claimStatement is ClaimCall as one statement: insertClaimCTE (arguments
// args, those of c), and, joined with its row so that they are written only
// if it claimed, the approval or preview, the events and the approval's
// notification (delivered at commit). It returns the claimed call, true,
// then the stored events' ids and seqs; if the claim lost, the holder,
// false (no row if the holder is not in the statement's snapshot) and, with
// rep, the seq of the replay's event if the holder answers c as a replay
// (else NULL). The approval's foreign key is checked at the end of the
// statement, when the call row exists. A released record is not taken over
// here (claimInTx does it).
func claimStatement(c *store.Call, p store.ClaimCallParams, args []any, rows *auditRows, rep *replayedRow) (string, []any) {
	key := claimShape{approval: p.Approval != nil, preview: p.Preview != nil, replayed: rep != nil}
	st, text := newStmt(&claimTexts, key, append(make([]any, 0, len(args)+64), args...)...)
	st.sql(`WITH `, insertClaimCTE, `, claimed AS (SELECT * FROM ins)`)
	// rowFromClaim is an INSERT of vals (columns cols) with the call id, at
	// index 1, taken from the claimed row.
	rowFromClaim := func(table, cols string, vals []any) {
		st.sql(`INSERT INTO `, table, ` (`, cols, `) SELECT `)
		for i, v := range vals {
			if i > 0 {
				st.sql(", ")
			}
			if i == 1 {
				st.sql("c.id")
			} else {
				st.sql(st.arg(v))
			}
		}
		st.sql(` FROM claimed c`)
	}
	if key.approval {
		st.sql(`, approval AS (`)
		rowFromClaim("approvals", approvalColumns, approvalArgs(p.Approval))
		st.sql(` RETURNING id)`)
	}
	if key.preview {
		st.sql(`, preview AS (`)
		rowFromClaim("previews", previewColumns, previewArgs(p.Preview))
		st.sql(`)`)
	}
	// The holder, as the statement's snapshot has it, if it has it (a
	// holder committed before the statement began) and the claim lost.
	holder := func() {
		st.sql(` FROM calls h WHERE h.principal_id = $2 AND h.idempotency_key = $3 AND NOT EXISTS (SELECT 1 FROM claimed)`)
	}
	if key.replayed {
		st.sql(`, rep AS (`)
		rep.insertSQL(st, holder)
		st.sql(`)`)
	}
	st.sql(`, ev AS (`)
	rows.insertSQL(st, "claimed c", `CASE WHEN c.id = $1 THEN e.call_id ELSE c.id END`)
	st.sql(`) SELECT `, claimedColumns, `, true, stored.ids, stored.seqs`)
	if key.approval {
		st.sql(`, (SELECT count(pg_notify(`, st.arg(notifyChannel), `, `,
			st.arg(string(store.TopicApprovals)+":"), ` || id)) FROM approval)`)
	}
	if key.replayed {
		st.sql(`, NULL::bigint`)
	}
	st.sql(` FROM claimed c, `, storedEvents)
	// A claim that lost answers with the holder, and the seq of the
	// replay's event if it stored one.
	st.sql(` UNION ALL SELECT `, holderColumns, `, false, NULL::text[], NULL::bigint[]`)
	if key.approval {
		st.sql(`, NULL::bigint`)
	}
	if key.replayed {
		st.sql(`, (SELECT seq FROM rep)`)
	}
	holder()
	return st.finish(&claimTexts, key, text), st.args
}

// claimShape is what the text of a claim statement depends on.
type claimShape struct{ approval, preview, replayed bool }

// claimTexts keeps the claim statements' texts by claimShape.
var claimTexts sync.Map

// The call's columns as the claim statement returns them: from the claimed
// row (c) or from the holder (h).
var (
	claimedColumns = qualified("c", callColumns)
	holderColumns  = qualified("h", callColumns)
)

// replayedRow is ClaimCallParams.Replayed as claimStatement stores it.
type replayedRow struct {
	ev store.AuditEvent
	// detail is the event's detail opened at the holder's attempt count
	// and state (audit.DetailParts).
	detail []string
}

// newReplayedRow returns ev ready for claimStatement, or nil (the store
// declines to store it) if it is nil or cannot be stored as it is.
func newReplayedRow(ev *store.AuditEvent) *replayedRow {
	if ev == nil || ev.ID == "" {
		return nil
	}
	parts, err := audit.DetailParts(ev.Detail, store.ReplayedAttemptKey, store.ReplayedStateKey)
	if err != nil {
		return nil
	}
	return &replayedRow{ev: *ev, detail: parts}
}

// replayedOutcomeSQL is store.CallState.Outcome of h.state, for the final
// states.
var replayedOutcomeSQL = func() string {
	var b strings.Builder
	b.WriteString(`CASE h.state`)
	for _, st := range store.FinalStates {
		b.WriteString(` WHEN '` + string(st) + `' THEN '` + string(st.Outcome()) + `'`)
	}
	b.WriteString(` END`)
	return b.String()
}()

// finalStatesSQL lists store.FinalStates as SQL.
var finalStatesSQL = func() string {
	q := make([]string, len(store.FinalStates))
	for i, st := range store.FinalStates {
		q[i] = `'` + string(st) + `'`
	}
	return `(` + strings.Join(q, ", ") + `)`
}()

// insertSQL writes to st the INSERT that stores the event, completed from
// the holder h that holder writes (a FROM … WHERE over calls h), if h
// answers c as a replay (store.Call.ReplayedBy; the call's principal, key,
// fingerprint, tool and action are the claim's $2, $3, $4, $5 and $6), as
// audit.CompleteReplayed completes it; it returns the event's seq.
func (r *replayedRow) insertSQL(st *stmt, holder func()) {
	e := &r.ev
	st.sql(`INSERT INTO audit_events
		(id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action, risk, decision, outcome, detail)
		SELECT `, st.arg(e.ID), `, `, st.arg(e.Time), `::timestamptz, `, st.arg(e.Type), `, h.id, `,
		st.arg(e.TraceID), `, `, st.arg(e.TaskID), `, `, st.arg(e.StepID), `, `, st.arg(e.Principal), `, `,
		st.arg(e.Tool), `, `, st.arg(e.Action), `, h.risk, h.decision, `, replayedOutcomeSQL, `,
			(`, st.arg(r.detail[0]), `::text || h.attempt_count::text || `, st.arg(r.detail[1]),
		`::text || to_json(h.state::text)::text || `, st.arg(r.detail[2]), `::text)::json`)
	holder()
	st.sql(` AND h.state IN `, finalStatesSQL, ` AND h.tool = $5 AND h.action = $6 AND h.fingerprint = $4
		RETURNING seq`)
}

// maxClaimRounds bounds how often claimInTx tries a claim again after
// reading a holder that its claim's snapshot missed.
const maxClaimRounds = 3

// claimInTx is ClaimCall as a transaction: the claim, then either the
// holder's record (read after the claim lost) or the approval or
// preview and the events, batched. It returns the call, whether it claimed,
// and when it did the events as stored (with Seq and the kept call id).
func (s *Store) claimInTx(ctx context.Context, p store.ClaimCallParams, c *store.Call, args []any) (*store.Call, bool, []store.AuditEvent, error) {
	var (
		out     *store.Call
		claimed bool
		events  []store.AuditEvent
	)
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if c.State.Parked() && p.Limits != (store.ParkLimits{}) {
			held, err := s.checkParkLimits(ctx, tx, p, c)
			if err != nil || held != nil {
				out, claimed = held, false
				return err
			}
		}
		var err error
		for round := 0; ; round++ {
			out, err = scanCall(tx.QueryRow(ctx, claimCallSQL, args...))
			if !isNotFound(err) {
				break
			}
			// Lost: read the holder, committed by now. One that the
			// claim's snapshot missed may be claimable (released with
			// this fingerprint) or gone; the claim is tried again, with
			// a newer snapshot, a bounded number of times (each round
			// sees a holder that moved).
			claimed = false
			out, err = scanCall(tx.QueryRow(ctx, getCallByKeySQL, c.PrincipalID, c.IdempotencyKey))
			switch {
			case round < maxClaimRounds && (isNotFound(err) ||
				err == nil && out.State == store.CallReleased && out.Fingerprint == c.Fingerprint):
				continue
			case err != nil:
				return fmt.Errorf("claim call: read the holder of key %q: %w", c.IdempotencyKey, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("claim call %q: %w", c.ID, err)
		}
		claimed = true
		// Work on copies: the caller's values change only once the claim
		// has committed (the transaction may be run again).
		events = append([]store.AuditEvent(nil), p.Events...)
		if out.ID != c.ID {
			for i := range events {
				events[i].CallID = out.ID
			}
		}
		var tl tail
		if p.Approval != nil {
			a := *p.Approval
			a.CallID = out.ID
			tl.batch.Queue(insertApprovalSQL, approvalArgs(&a)...)
			tl.notify(store.TopicApprovals, a.ID)
		}
		if p.Preview != nil {
			pv := *p.Preview
			pv.CallID = out.ID
			tl.batch.Queue(insertPreviewSQL, previewArgs(&pv)...)
		}
		tl.events(events)
		if err := tl.send(ctx, tx); err != nil {
			return fmt.Errorf("claim call %q: %w", c.ID, err)
		}
		return nil
	})
	if err != nil {
		return nil, false, nil, err
	}
	return out, claimed, events, nil
}

// parkLockSQL takes the transaction's lock on one principal's parked calls:
// its parking claims go one at a time, so that each counts the others'.
const parkLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended('toolsvc.parked:' || $1, 0))`

// parkedUsageSQL counts a principal's parked calls and the bytes they hold
// (store.ParkedBytes: the approval's arguments, the preview's message and
// value, as stored), through calls_parked_principal_idx.
const parkedUsageSQL = `SELECT count(*), coalesce(sum(
		coalesce(octet_length(a.arguments::text), 0) + coalesce(octet_length(p.message), 0) + coalesce(octet_length(p.value::text), 0)), 0)
	FROM calls c
	LEFT JOIN approvals a ON c.state = 'AWAITING_APPROVAL' AND a.id = c.approval_id
	LEFT JOIN previews p ON c.state = 'AWAITING_PREVIEW' AND p.token = c.preview_token
	WHERE c.principal_id = $1 AND c.state IN ('AWAITING_APPROVAL', 'AWAITING_PREVIEW')`

// checkParkLimits decides, in tx and under the principal's park lock,
// whether the parked claim of c may go on: it returns the record holding
// the key when the claim would lose anyway (answered as a lost claim), a
// *store.ParkLimitError when parking would pass p.Limits, or (nil, nil).
func (s *Store) checkParkLimits(ctx context.Context, tx pgx.Tx, p store.ClaimCallParams, c *store.Call) (*store.Call, error) {
	if _, err := tx.Exec(ctx, parkLockSQL, c.PrincipalID); err != nil {
		return nil, fmt.Errorf("claim call %q: lock the parked calls of %q: %w", c.ID, c.PrincipalID, interpretError(err))
	}
	held, err := scanCall(tx.QueryRow(ctx, getCallByKeySQL, c.PrincipalID, c.IdempotencyKey))
	switch {
	case err == nil && (held.State != store.CallReleased || held.Fingerprint != c.Fingerprint):
		return held, nil
	case err != nil && !isNotFound(err):
		return nil, fmt.Errorf("claim call: read the holder of key %q: %w", c.IdempotencyKey, err)
	}
	var (
		calls int
		bytes int64
	)
	if err := tx.QueryRow(ctx, parkedUsageSQL, c.PrincipalID).Scan(&calls, &bytes); err != nil {
		return nil, fmt.Errorf("claim call %q: count the parked calls of %q: %w", c.ID, c.PrincipalID, interpretError(err))
	}
	return nil, p.Limits.Check(c.PrincipalID, calls, bytes, store.ParkedBytes(p.Approval, p.Preview))
}

// startParkedCallSQL starts a parked call in one statement. The two CTEs
// consume the approval or the preview the call is parked behind (only the one
// matching the call's state, and only if it is usable at $4); the UPDATE then
// moves the call only if the matching CTE consumed something. Of concurrent
// callers, the first to lock the approval (or preview) row consumes it; the
// others wait on that lock, find it CONSUMED and match nothing. If the call
// itself changed under the statement (released, say) after the approval was
// consumed, no call row comes back and the caller rolls the transaction back,
// which undoes the consumption. The notification of a consumed approval is
// sent in the RETURNING clause, so only for a call that started (and
// delivered only if the transaction commits).
var startParkedCallSQL = `WITH consumed_approval AS (
		UPDATE approvals SET state = 'CONSUMED'
		WHERE $2 <> '' AND id = $2 AND call_id = $1 AND state = 'APPROVED' AND expires_at > $4
			AND EXISTS (SELECT 1 FROM calls WHERE id = $1 AND state = 'AWAITING_APPROVAL' AND approval_id = $2)
		RETURNING id
	), consumed_preview AS (
		UPDATE previews SET state = 'CONSUMED'
		WHERE $3 <> '' AND token = $3 AND call_id = $1 AND state = 'PENDING' AND expires_at > $4
			AND EXISTS (SELECT 1 FROM calls WHERE id = $1 AND state = 'AWAITING_PREVIEW' AND preview_token = $3)
		RETURNING token
	)
	UPDATE calls SET state = 'IN_PROGRESS', lease_expires_at = now() + $5::interval, risk = $6, decision = $7, updated_at = $4,
		attempt_count = attempt_count + 1, claim_token = $10
	WHERE id = $1 AND (
		(state = 'AWAITING_APPROVAL' AND approval_id = $2 AND EXISTS (SELECT 1 FROM consumed_approval)) OR
		(state = 'AWAITING_PREVIEW' AND preview_token = $3 AND EXISTS (SELECT 1 FROM consumed_preview)))
	RETURNING ` + callColumns + `, (SELECT count(pg_notify($8, $9 || id)) FROM consumed_approval)`

// StartParkedCall implements store.CallStore. The transaction's BEGIN, the
// statement and the events go to the server as one pipelined batch
// (pgx.Batch.BeginTx), then COMMIT: two round trips. It cannot be one
// statement in autocommit: when the call changed under the statement after
// its approval or preview was consumed, the statement returns no row and
// the transaction must be rolled back to undo the consumption. The events
// are sent before the outcome is known, so they are stored only by the
// COMMIT that follows a started call.
func (s *Store) StartParkedCall(ctx context.Context, p store.StartParkedCallParams) (*store.Call, error) {
	if p.Lease <= 0 {
		return nil, fmt.Errorf("%w: start parked call %q: no lease", store.ErrInvalid, p.CallID)
	}
	var out *store.Call
	err := s.retry(ctx, func() error {
		var tl tail
		tl.batch.BeginTx(pgx.TxOptions{})
		tl.batch.Queue(startParkedCallSQL, p.CallID, p.ApprovalID, p.PreviewToken, p.Now, leaseArg(p.Lease),
			riskText(p.Risk), string(p.Decision), notifyChannel, string(store.TopicApprovals)+":", p.ClaimToken)
		// What else was parked behind the approval or preview is released
		// with its consumption (rolled back with it if the call did not
		// start).
		if p.ApprovalID != "" {
			tl.releaseBehindApprovals([]string{p.ApprovalID}, p.Now, time.Time{}, p.CallID)
		}
		if p.PreviewToken != "" {
			tl.releaseBehindPreviews([]string{p.PreviewToken}, p.Now, time.Time{}, p.CallID)
		}
		// A refused event queues nothing: it is reported once the call is
		// known to have started, as the statement's own outcome comes first.
		tl.events(p.Events)

		br := s.pool.SendBatch(ctx, &tl.batch)
		tx := br.Tx()
		defer rollback(ctx, tx)
		if _, err := br.Exec(); err != nil { // BEGIN
			_ = br.Close()
			return interpretError(err)
		}
		var notified int64
		var err error
		out, err = scanCall(br.QueryRow(), &notified)
		if isNotFound(err) {
			_ = br.Close()
			// Give the connection back before asking on another one.
			rollback(ctx, tx)
			return notFoundOrConflict(ctx, s.pool, "start parked call", p.CallID, `SELECT 1 FROM calls WHERE id = $1`)
		}
		if err != nil {
			_ = br.Close()
			return fmt.Errorf("start parked call %q: %w", p.CallID, err)
		}
		if tl.err != nil {
			_ = br.Close()
			return tl.err
		}
		if err := br.Close(); err != nil {
			return fmt.Errorf("start parked call %q: %w", p.CallID, interpretError(err))
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("start parked call %q: %w", p.CallID, interpretError(err))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RenewCallLease implements store.CallStore. The lease runs from the
// database's clock; the caller's now is not used.
func (s *Store) RenewCallLease(ctx context.Context, callID string, attempt int, _ time.Time, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("%w: renew lease of call %q: no lease", store.ErrInvalid, callID)
	}
	tag, err := s.pool.Exec(ctx, renewLeaseSQL, callID, attempt, leaseArg(lease))
	if err != nil {
		return fmt.Errorf("renew lease of call %q: %w", callID, interpretError(err))
	}
	if tag.RowsAffected() == 0 {
		return notFoundOrConflict(ctx, s.pool, "renew lease of call", callID, `SELECT 1 FROM calls WHERE id = $1`)
	}
	return nil
}

// FinishCall implements store.CallStore. If the call's tool has been deleted
// meanwhile, the health change is skipped: the outcome matters more than the
// health of a tool that no longer exists.
//
// Without a health change it is one statement (finishStatement), committed
// with whatever other hot-path statements are waiting (commitGrouped): one
// round trip. A health change reads the tool's health
// row under a lock and asks p.Health.Fn in Go, so it runs as a transaction
// (finishInTx); so does a call with a refused event or task history entry,
// which is reported only once the call is known to be finishable.
func (s *Store) FinishCall(ctx context.Context, p store.FinishCallParams) (*store.Call, error) {
	switch p.State {
	case store.CallSucceeded, store.CallFailed, store.CallUnknown, store.CallReleased:
	default:
		return nil, fmt.Errorf("%w: finish call %q in state %q", store.ErrInvalid, p.CallID, p.State)
	}
	if p.Health != nil && p.Health.Fn == nil {
		return nil, fmt.Errorf("%w: finish call %q: a health change without a function", store.ErrInvalid, p.CallID)
	}
	result, err := resultArg(p.Result)
	if err != nil {
		return nil, err
	}
	if p.Health != nil || (p.History != nil && (p.History.PrincipalID == "" || p.History.TaskID == "")) {
		return s.finishInTx(ctx, p, result)
	}
	rows, err := newAuditRows(p.Events)
	if err != nil {
		return s.finishInTx(ctx, p, result)
	}
	q, args := finishStatement(p, result, rows)
	var (
		out  *store.Call
		ids  []string
		seqs []int64
	)
	err = s.commitGrouped(ctx, &groupStmt{sql: q, args: args, order: "2" + p.CallID, scan: func(r pgx.Rows) error {
		out, ids, seqs = nil, nil, nil
		if !r.Next() {
			return nil
		}
		var err error
		out, err = scanCall(r, &ids, &seqs)
		return err
	}})
	if err != nil {
		return nil, fmt.Errorf("finish call %q: %w", p.CallID, err)
	}
	if out == nil {
		return nil, notFoundOrConflict(ctx, s.pool, "finish call", p.CallID, `SELECT 1 FROM calls WHERE id = $1`)
	}
	// The result as stored is the one sent (a json column keeps its text),
	// so it is decoded from there rather than sent back.
	if out.Result, err = resultOut(resultBytes(result)); err != nil {
		return nil, fmt.Errorf("finish call %q: %w", p.CallID, err)
	}
	if err := setSeqs(p.Events, ids, seqs); err != nil {
		return nil, fmt.Errorf("finish call %q: %w", p.CallID, err)
	}
	return out, nil
}

// finishCallSQL records an outcome; $1..$6 are the call id, the attempt,
// the state, the result, now and the retention.
const finishCallSQL = `UPDATE calls SET state = $3, result = $4, updated_at = $5,
		expires_at = $6, lease_expires_at = NULL
	WHERE id = $1 AND attempt_count = $2
		AND (state = 'IN_PROGRESS' OR (state = 'UNKNOWN' AND resolved_by = ''))
	RETURNING ` + callColumns

// storedEvents is the (id, seq) of each event a statement's ev CTE stored,
// as two arrays (NULL if none) in one pass, so that they pair up; setSeqs
// matches them to the events by id, whatever their order.
const storedEvents = `LATERAL (SELECT array_agg(id) AS ids, array_agg(seq) AS seqs FROM ev) stored`

// finishStatement is FinishCall without a health change as one statement:
// finishCallSQL as a CTE and, joined with its row so that they are written
// only if it matched, the events and the task history entry. It returns the
// call (without its result, which the caller has), then the stored events'
// ids and seqs; no row if the call was not finishable.
func finishStatement(p store.FinishCallParams, result any, rows *auditRows) (string, []any) {
	key := p.History != nil
	st, text := newStmt(&finishTexts, key, p.CallID, p.Attempt, string(p.State), result, p.Now, tsArg(p.ExpiresAt))
	st.sql(`WITH finished AS (`, finishCallSQL, `), ev AS (`)
	rows.insertSQL(st, "finished f", "e.call_id")
	st.sql(`)`)
	if h := p.History; h != nil {
		st.sql(`, history AS (INSERT INTO task_history (principal_id, task_id, call_id, tool, action, resource, at)
			SELECT `, st.arg(h.PrincipalID), `, `, st.arg(h.TaskID), `, `, st.arg(h.CallID), `, `, st.arg(h.Tool), `, `,
			st.arg(h.Action), `, `, st.arg(h.Resource), `, `, st.arg(h.At), ` FROM finished)`)
	}
	st.sql(` SELECT `, finishedColumns, `, stored.ids, stored.seqs FROM finished f, `, storedEvents)
	return st.finish(&finishTexts, key, text), st.args
}

// finishTexts keeps the texts of finishStatement by whether it has a
// task history entry.
var finishTexts sync.Map

// finishedColumns are the call's columns as finishStatement returns them:
// the result is left out (the caller has it).
var finishedColumns = strings.Replace(qualified("f", callColumns), "f.result", "NULL::json", 1)

// finishInTx is FinishCall as a transaction: the update, then the events,
// the health change (as applyHealth makes it, on the locked row) and the
// history entry.
func (s *Store) finishInTx(ctx context.Context, p store.FinishCallParams, result any) (*store.Call, error) {
	var out *store.Call
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = scanCall(tx.QueryRow(ctx, finishCallSQL,
			p.CallID, p.Attempt, string(p.State), result, p.Now, tsArg(p.ExpiresAt)))
		if isNotFound(err) {
			return notFoundOrConflict(ctx, tx, "finish call", p.CallID, `SELECT 1 FROM calls WHERE id = $1`)
		}
		if err != nil {
			return fmt.Errorf("finish call %q: %w", p.CallID, err)
		}
		// The call's own events first, then the health change's: the
		// outcome is what caused the health change (the memory store writes
		// them in the same order).
		var tl tail
		tl.events(p.Events)
		if p.Health != nil {
			if _, _, err := applyHealth(ctx, tx, p.Health.Tool, p.Health.Fn, &tl); err != nil && !isNotFound(err) {
				return fmt.Errorf("finish call %q: %w", p.CallID, err)
			}
		}
		tl.history(p.History)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// releaseClaimSQL gives back a reservation by its token; $1..$7 are the
// principal, the key, the token, the result, now, the retention and the
// type of event that says a reaped call's UNKNOWN was answered.
const releaseClaimSQL = `UPDATE calls SET state = 'RELEASED', result = $4, updated_at = $5, expires_at = $6,
		lease_expires_at = NULL
	WHERE principal_id = $1 AND idempotency_key = $2 AND claim_token = $3 AND $3 <> ''
		AND (state = 'IN_PROGRESS' OR (state = 'UNKNOWN' AND resolved_by = '' AND NOT EXISTS (
			SELECT 1 FROM audit_events e WHERE e.call_id = calls.id AND e.call_id <> '' AND e.type = $7)))
	RETURNING ` + callColumns

// ReleaseClaim implements store.CallStore: the update, then the events
// under the released call's id, in one transaction.
func (s *Store) ReleaseClaim(ctx context.Context, p store.ReleaseClaimParams) (*store.Call, error) {
	if p.Token == "" || p.AnsweredEvent == "" {
		return nil, fmt.Errorf("%w: release claim: a token and the answered event type are required", store.ErrInvalid)
	}
	result, err := resultArg(p.Result)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = scanCall(tx.QueryRow(ctx, releaseClaimSQL,
			p.PrincipalID, p.IdempotencyKey, p.Token, result, p.Now, tsArg(p.ExpiresAt), p.AnsweredEvent))
		if err != nil {
			return fmt.Errorf("release claim on key %q: %w", p.IdempotencyKey, err)
		}
		events := append([]store.AuditEvent(nil), p.Events...)
		for i := range events {
			events[i].CallID = out.ID
		}
		var tl tail
		tl.events(events)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	for i := range p.Events {
		p.Events[i].CallID = out.ID
	}
	return out, nil
}

// ReleaseParkedCall implements store.CallStore. Locks are taken approval (or
// preview) first, then call, the same order as StartParkedCall,
// ResolveApproval and ExpireApprovals, so that these never deadlock.
func (s *Store) ReleaseParkedCall(ctx context.Context, p store.ReleaseParkedCallParams) (*store.Call, error) {
	if !p.From.Parked() {
		return nil, fmt.Errorf("%w: release call %q from non-parked state %q", store.ErrInvalid, p.CallID, p.From)
	}
	switch p.ApprovalState {
	case "", store.ApprovalExpired, store.ApprovalInvalidated:
	default:
		return nil, fmt.Errorf("%w: release call %q: approval state %q", store.ErrInvalid, p.CallID, p.ApprovalState)
	}
	switch p.PreviewState {
	case "", store.PreviewExpired:
	default:
		return nil, fmt.Errorf("%w: release call %q: preview state %q", store.ErrInvalid, p.CallID, p.PreviewState)
	}
	var out *store.Call
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var approvalID, token string
		err := tx.QueryRow(ctx, `SELECT approval_id, preview_token FROM calls WHERE id = $1`, p.CallID).Scan(&approvalID, &token)
		if err != nil {
			return fmt.Errorf("release call %q: %w", p.CallID, interpretError(err))
		}
		if p.ApprovalState != "" && approvalID != "" {
			if _, err := tx.Exec(ctx, `SELECT 1 FROM approvals WHERE id = $1 FOR UPDATE`, approvalID); err != nil {
				return fmt.Errorf("release call %q: %w", p.CallID, interpretError(err))
			}
		}
		if p.PreviewState != "" && token != "" {
			if _, err := tx.Exec(ctx, `SELECT 1 FROM previews WHERE token = $1 FOR UPDATE`, token); err != nil {
				return fmt.Errorf("release call %q: %w", p.CallID, interpretError(err))
			}
		}
		out, err = scanCall(tx.QueryRow(ctx, `UPDATE calls SET state = 'RELEASED', updated_at = $3, expires_at = $4
			WHERE id = $1 AND state = $2 RETURNING `+callColumns,
			p.CallID, string(p.From), p.Now, tsArg(p.ExpiresAt)))
		if isNotFound(err) {
			return notFoundOrConflict(ctx, tx, "release call", p.CallID, `SELECT 1 FROM calls WHERE id = $1`)
		}
		if err != nil {
			return fmt.Errorf("release call %q: %w", p.CallID, err)
		}
		var tl tail
		if p.ApprovalState != "" && out.ApprovalID != "" {
			tl.batch.Queue(`UPDATE approvals SET state = $2 WHERE id = $1`, out.ApprovalID, string(p.ApprovalState))
			tl.releaseBehindApprovals([]string{out.ApprovalID}, p.Now, p.ExpiresAt)
			tl.notify(store.TopicApprovals, out.ApprovalID)
		}
		if p.PreviewState != "" && out.PreviewToken != "" {
			tl.batch.Queue(`UPDATE previews SET state = $2 WHERE token = $1`, out.PreviewToken, string(p.PreviewState))
			tl.releaseBehindPreviews([]string{out.PreviewToken}, p.Now, p.ExpiresAt)
		}
		tl.events(p.Events)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ResolveCall implements store.CallStore.
func (s *Store) ResolveCall(ctx context.Context, p store.ResolveCallParams) (*store.Call, error) {
	if p.State != store.CallSucceeded && p.State != store.CallFailed {
		return nil, fmt.Errorf("%w: resolve call %q to state %q", store.ErrInvalid, p.CallID, p.State)
	}
	result, err := resultArg(p.Result)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = scanCall(tx.QueryRow(ctx, `UPDATE calls SET state = $2, result = $3, resolved_by = $4,
				resolution_comment = $5, updated_at = $6, expires_at = $7
			WHERE id = $1 AND state = 'UNKNOWN' RETURNING `+callColumns,
			p.CallID, string(p.State), result, p.ResolvedBy, p.Comment, p.Now, tsArg(p.ExpiresAt)))
		if isNotFound(err) {
			return notFoundOrConflict(ctx, tx, "resolve call", p.CallID, `SELECT 1 FROM calls WHERE id = $1`)
		}
		if err != nil {
			return fmt.Errorf("resolve call %q: %w", p.CallID, err)
		}
		var tl tail
		tl.events(p.Events)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReapExpiredLeases implements store.CallStore. Leases are compared with the
// database's clock, which set them, never with the reaper's (p.Now is only
// recorded): a replica whose clock runs ahead must not take away leases the
// others still renew. SKIP LOCKED lets reapers on several replicas run at
// once: each takes calls the others have not locked, so every call is reaped
// once.
func (s *Store) ReapExpiredLeases(ctx context.Context, p store.ReapParams) ([]*store.Call, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("%w: reap expired leases: negative limit", store.ErrInvalid)
	}
	result, err := resultArg(p.Result)
	if err != nil {
		return nil, err
	}
	var out []*store.Call
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		// Lease order is decided on the due rows; the lease itself is
		// cleared (the attempt no longer holds one).
		rows, err := tx.Query(ctx, `WITH due AS (
				SELECT id, lease_expires_at FROM calls WHERE state = 'IN_PROGRESS' AND lease_expires_at < now()
				ORDER BY lease_expires_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
			)
			UPDATE calls c SET state = 'UNKNOWN', result = $3, updated_at = $1, expires_at = $4,
				lease_expires_at = NULL
			FROM due WHERE c.id = due.id
			RETURNING `+qualified("c", callColumns)+`, due.lease_expires_at`,
			p.Now, limitArg(p.Limit), result, tsArg(p.ExpiresAt))
		if err != nil {
			return fmt.Errorf("reap expired leases: %w", interpretError(err))
		}
		type reaped struct {
			call  *store.Call
			lease time.Time
		}
		var rs []reaped
		for rows.Next() {
			var r reaped
			if r.call, err = scanCall(rows, timeDst{&r.lease}); err != nil {
				rows.Close()
				return fmt.Errorf("reap expired leases: %w", err)
			}
			rs = append(rs, r)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("reap expired leases: %w", interpretError(err))
		}
		sort.Slice(rs, func(i, j int) bool {
			if !rs[i].lease.Equal(rs[j].lease) {
				return rs[i].lease.Before(rs[j].lease)
			}
			return rs[i].call.ID < rs[j].call.ID
		})
		out = make([]*store.Call, len(rs))
		for i, r := range rs {
			out[i] = r.call
		}
		var tl tail
		if p.EventsFor != nil {
			for _, c := range out {
				cp := *c
				tl.events(p.EventsFor(&cp))
			}
		}
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ExpireApprovals implements store.CallStore. Approvals and previews are
// taken with SKIP LOCKED (replicas share the sweep; an approval or preview
// being consumed or resolved right now is left to that transaction), and
// locked before their calls, like everywhere else. The event functions may
// be called again if the transaction is retried.
func (s *Store) ExpireApprovals(ctx context.Context, p store.ExpireParams) (*store.ExpireResult, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("%w: expire approvals: negative limit", store.ErrInvalid)
	}
	var out *store.ExpireResult
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `WITH due AS (
				SELECT id FROM approvals WHERE state IN ('PENDING', 'APPROVED') AND expires_at < $1
				ORDER BY expires_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
			)
			UPDATE approvals a SET state = 'EXPIRED' FROM due WHERE a.id = due.id
			RETURNING `+qualified("a", approvalColumns),
			p.Now, limitArg(p.Limit))
		if err != nil {
			return fmt.Errorf("expire approvals: %w", interpretError(err))
		}
		approvals, err := collectApprovals(rows)
		if err != nil {
			return fmt.Errorf("expire approvals: %w", err)
		}
		sort.Slice(approvals, func(i, j int) bool {
			if !approvals[i].ExpiresAt.Equal(approvals[j].ExpiresAt) {
				return approvals[i].ExpiresAt.Before(approvals[j].ExpiresAt)
			}
			return approvals[i].ID < approvals[j].ID
		})

		// Previews: the same sweep, releasing their calls in the same
		// statement; the expired previews come back for their events.
		rows, err = tx.Query(ctx, `WITH due AS (
				SELECT token FROM previews WHERE state = 'PENDING' AND expires_at < $1
				ORDER BY expires_at, token LIMIT $2 FOR UPDATE SKIP LOCKED
			), expired AS (
				UPDATE previews pv SET state = 'EXPIRED' FROM due WHERE pv.token = due.token
				RETURNING `+qualified("pv", previewColumns)+`
			), released AS (
				UPDATE calls c SET state = 'RELEASED', updated_at = $1, expires_at = $3
				FROM expired WHERE c.id = expired.call_id AND c.state = 'AWAITING_PREVIEW'
					AND c.preview_token = expired.token
				RETURNING c.id
			)
			SELECT `+previewColumns+` FROM expired`,
			p.Now, limitArg(p.Limit), tsArg(p.ExpiresAt))
		if err != nil {
			return fmt.Errorf("expire previews: %w", interpretError(err))
		}
		previews, err := collectPreviews(rows)
		if err != nil {
			return fmt.Errorf("expire previews: %w", err)
		}
		sort.Slice(previews, func(i, j int) bool {
			if !previews[i].ExpiresAt.Equal(previews[j].ExpiresAt) {
				return previews[i].ExpiresAt.Before(previews[j].ExpiresAt)
			}
			return previews[i].Token < previews[j].Token
		})

		var tl tail
		if len(approvals) > 0 {
			// Their own calls and the calls parked behind them by ParkCall.
			ids := make([]string, len(approvals))
			for i, a := range approvals {
				ids[i] = a.ID
			}
			tl.releaseBehindApprovals(ids, p.Now, p.ExpiresAt)
			for _, a := range approvals {
				tl.notify(store.TopicApprovals, a.ID)
				if p.EventsFor != nil {
					cp := *a
					tl.events(p.EventsFor(&cp))
				}
			}
		}
		tokens := make([]string, len(previews))
		for i, pv := range previews {
			tokens[i] = pv.Token
		}
		tl.releaseBehindPreviews(tokens, p.Now, p.ExpiresAt)
		if p.PreviewEventsFor != nil {
			for _, pv := range previews {
				cp := *pv
				tl.events(p.PreviewEventsFor(&cp))
			}
		}
		if err := tl.send(ctx, tx); err != nil {
			return err
		}
		out = &store.ExpireResult{Approvals: approvals, Previews: previews}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteExpiredCalls implements store.CallStore. Approvals and previews are
// deleted explicitly (not only by ON DELETE CASCADE) so that watchers of a
// deleted approval are notified. Task history has no foreign key to calls,
// so it is deleted here by call_id (served by task_history_call_idx,
// migration 0002).
func (s *Store) DeleteExpiredCalls(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: delete expired calls: negative limit", store.ErrInvalid)
	}
	var n int
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id FROM calls WHERE expires_at < $1 AND `+notRunningOrParked+`
			ORDER BY expires_at, id LIMIT $2 FOR UPDATE SKIP LOCKED`, now, limitArg(limit))
		if err != nil {
			return fmt.Errorf("delete expired calls: %w", interpretError(err))
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("delete expired calls: %w", interpretError(err))
		}
		n = len(ids)
		if n == 0 {
			return nil
		}
		var tl tail
		tl.batch.Queue(`WITH deleted AS (DELETE FROM approvals WHERE call_id = ANY($1) RETURNING id)
			SELECT count(pg_notify($2, $3 || id)) FROM deleted`, ids, notifyChannel, string(store.TopicApprovals)+":")
		tl.batch.Queue(`DELETE FROM previews WHERE call_id = ANY($1)`, ids)
		tl.batch.Queue(`DELETE FROM task_history WHERE call_id = ANY($1)`, ids)
		tl.batch.Queue(`DELETE FROM calls WHERE id = ANY($1)`, ids)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// leaseArgIndex is the index of lease_expires_at in callColumns (and
// callArgs): in a claim it carries the lease's length (leaseArg).
const leaseArgIndex = 16

// leaseArg is a lease's length as an interval argument, added to the
// database's clock (now() + $n::interval) wherever a lease is set.
func leaseArg(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

// limitArg is a LIMIT argument: NULL (no limit) for n <= 0.
func limitArg(n int) any {
	if n <= 0 {
		return nil
	}
	return n
}
