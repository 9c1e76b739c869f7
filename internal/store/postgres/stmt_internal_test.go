package postgres

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// A statement's text is kept by shape, so it must depend on nothing else:
// built for other values, with the kept text cleared, each shape's text is
// the same, and the arguments gathered without writing text are those
// gathered while writing it.
func TestStatementTextsDependOnlyOnShape(t *testing.T) {
	now := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	claim := func(n int, approval, preview, replayed bool) (string, []any) {
		c := &store.Call{ID: fmt.Sprint("call-", n), PrincipalID: fmt.Sprint("p-", n), IdempotencyKey: fmt.Sprint("k-", n),
			Fingerprint: "fp", Tool: "files", Action: "write", State: store.CallInProgress, AttemptCount: n,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
		p := store.ClaimCallParams{Call: c, Lease: time.Minute}
		for i := range n {
			p.Events = append(p.Events, store.AuditEvent{ID: fmt.Sprint("ev-", n, "-", i), Type: "tool_call.attempted", Time: now, CallID: c.ID})
		}
		if approval {
			p.Approval = &store.Approval{ID: fmt.Sprint("ap-", n), CallID: c.ID, ExpiresAt: now}
		}
		if preview {
			p.Preview = &store.Preview{Token: fmt.Sprint("pv-", n), CallID: c.ID, ExpiresAt: now}
		}
		var rep *replayedRow
		if replayed {
			rep = newReplayedRow(&store.AuditEvent{ID: fmt.Sprint("rep-", n), Type: "tool_call.deduped", Time: now,
				Detail: []byte(fmt.Sprintf(`{"parent_call_id":"x%d"}`, n))})
		}
		args, err := callArgs(c)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := newAuditRows(p.Events)
		if err != nil {
			t.Fatal(err)
		}
		return claimStatement(c, p, args, rows, rep)
	}
	finish := func(n int, history bool) (string, []any) {
		p := store.FinishCallParams{CallID: fmt.Sprint("call-", n), Attempt: n, State: store.CallSucceeded, Now: now}
		for i := range n {
			p.Events = append(p.Events, store.AuditEvent{ID: fmt.Sprint("ev-", n, "-", i), Type: "tool_call.succeeded", Time: now})
		}
		if history {
			p.History = &store.TaskHistoryEntry{PrincipalID: fmt.Sprint("p-", n), TaskID: "t", CallID: p.CallID, At: now}
		}
		rows, err := newAuditRows(p.Events)
		if err != nil {
			t.Fatal(err)
		}
		return finishStatement(p, `{"success":true}`, rows)
	}
	check := func(name string, texts *sync.Map, build func(n int) (string, []any)) {
		t.Helper()
		texts.Clear()
		first, _ := build(1)
		_, kept := build(3) // the text is kept: arguments only
		texts.Clear()
		fresh, written := build(3) // the text written again, for other values
		if first != fresh {
			t.Errorf("%s: the text depends on the values:\n%s\n%s", name, first, fresh)
		}
		if !reflect.DeepEqual(kept, written) {
			t.Errorf("%s: arguments gathered without the text differ:\n%v\n%v", name, kept, written)
		}
	}
	for _, replayed := range []bool{false, true} {
		for _, parked := range []string{"", "approval", "preview"} {
			check(fmt.Sprintf("claim %s replayed=%v", parked, replayed), &claimTexts, func(n int) (string, []any) {
				return claim(n, parked == "approval", parked == "preview", replayed)
			})
		}
	}
	for _, history := range []bool{false, true} {
		check(fmt.Sprintf("finish history=%v", history), &finishTexts, func(n int) (string, []any) { return finish(n, history) })
	}
}
