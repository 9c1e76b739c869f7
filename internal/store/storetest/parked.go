package storetest

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

func parkLimitTests() []test {
	return []test{
		{"Calls", testParkLimitCalls},
		{"Bytes", testParkLimitBytes},
		{"HeldKey", testParkLimitHeldKey},
		{"Concurrent", testParkLimitConcurrent},
	}
}

// parkParams are the params that park c (a parked call from newCall) under
// limits, with one event.
func parkParams(c *store.Call, limits store.ParkLimits) store.ClaimCallParams {
	p := store.ClaimCallParams{Call: c, Limits: limits, Events: []store.AuditEvent{newEvent(audit.GateRequired, c.ID)}}
	if c.State == store.CallAwaitingApproval {
		p.Approval = newApproval(c)
	} else {
		p.Preview = newPreview(c)
	}
	return p
}

// wantParkLimit checks that parking c under limits is refused, naming what
// the principal has parked, and that nothing of it was written.
func wantParkLimit(t *testing.T, s store.Store, c *store.Call, limits store.ParkLimits, calls int, bytes int64) {
	t.Helper()
	p := parkParams(c, limits)
	got, ok, err := s.ClaimCall(t.Context(), p)
	var le *store.ParkLimitError
	if !errors.Is(err, store.ErrParkLimit) || !errors.As(err, &le) || ok || got != nil {
		t.Fatalf("ClaimCall(%s) past the limits: %v %v %v", c.IdempotencyKey, got, ok, err)
	}
	if le.Principal != c.PrincipalID || le.Limits != limits || le.Calls != calls || le.Bytes != bytes ||
		le.Adding != store.ParkedBytes(p.Approval, p.Preview) {
		t.Fatalf("refusal %+v, want %d calls and %d bytes parked", le, calls, bytes)
	}
	_, err = s.GetCallByKey(t.Context(), c.PrincipalID, c.IdempotencyKey)
	wantErr(t, "the refused call", err, store.ErrNotFound)
	if p.Approval != nil {
		_, err = s.GetApproval(t.Context(), p.Approval.ID)
		wantErr(t, "the refused approval", err, store.ErrNotFound)
	}
	wantEvents(t, s, store.AuditFilter{CallID: c.ID})
}

// testParkLimitCalls: a principal parks at most MaxCalls calls at once
// (approvals and previews together); calls in progress and other
// principals' calls do not count; each way out of the parked states makes
// room again.
func testParkLimitCalls(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	limits := store.ParkLimits{MaxCalls: 2}
	a1 := newCall("agent-1", "a1", store.CallAwaitingApproval)
	p1 := newCall("agent-1", "p1", store.CallAwaitingPreview)
	claimWith(t, s, parkParams(a1, limits))
	claimWith(t, s, parkParams(p1, limits))
	held := store.ParkedBytes(newApproval(a1), nil) + store.ParkedBytes(nil, newPreview(p1))
	wantParkLimit(t, s, newCall("agent-1", "a2", store.CallAwaitingApproval), limits, 2, held)
	wantParkLimit(t, s, newCall("agent-1", "p2", store.CallAwaitingPreview), limits, 2, held)
	// Unaffected: a call that runs at once, another principal's park.
	claimWith(t, s, store.ClaimCallParams{Call: newCall("agent-1", "run", store.CallInProgress), Lease: longLease, Limits: limits})
	claimWith(t, s, parkParams(newCall("agent-2", "a1", store.CallAwaitingApproval), limits))

	// Room is made by each way out of the parked states, and taken again.
	ways := []struct {
		name string
		out  func(c *store.Call)
	}{
		{"approved and started", func(c *store.Call) {
			approve(t, s, c.ApprovalID)
			_, err := s.StartParkedCall(ctx, store.StartParkedCallParams{CallID: c.ID, ApprovalID: c.ApprovalID,
				Now: at(2 * time.Minute), Lease: longLease, Risk: c.Risk, Decision: c.Decision, ClaimToken: "t-" + c.ID})
			noErr(t, "StartParkedCall", err)
		}},
		{"denied", func(c *store.Call) {
			_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: c.ApprovalID, State: store.ApprovalDenied,
				Resolver: "approver-1", Now: at(time.Minute), CallResult: result("denied"), CallExpiresAt: at(time.Hour)})
			noErr(t, "ResolveApproval", err)
		}},
		{"released", func(c *store.Call) {
			_, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: c.ID, From: c.State,
				ApprovalState: store.ApprovalInvalidated, Now: at(time.Minute), ExpiresAt: at(time.Hour)})
			noErr(t, "ReleaseParkedCall", err)
		}},
		{"expired", func(c *store.Call) {
			_, err := s.ExpireApprovals(ctx, store.ExpireParams{Now: at(2 * time.Hour), ExpiresAt: at(3 * time.Hour)})
			noErr(t, "ExpireApprovals", err)
		}},
	}
	// p1 goes first, expiring with the approvals' sweep below; a1 is
	// replaced in turn by each new park.
	out := a1
	for i, w := range ways {
		if w.name == "expired" {
			// Every approval and preview of agent-1 expires: p1 too.
			w.out(out)
			for _, k := range []string{"x1", "x2"} {
				claimWith(t, s, parkParams(newCall("agent-1", k, store.CallAwaitingApproval), limits))
			}
			wantParkLimit(t, s, newCall("agent-1", "x3", store.CallAwaitingApproval), limits, 2, 2*store.ParkedBytes(newApproval(a1), nil))
			continue
		}
		w.out(out)
		next := newCall("agent-1", "next-"+itoa(i), store.CallAwaitingApproval)
		claimWith(t, s, parkParams(next, limits))
		wantParkLimit(t, s, newCall("agent-1", "over-"+itoa(i), store.CallAwaitingApproval), limits, 2, held)
		out = next
	}

	// Deleting the tool releases every call parked behind it.
	_, err := s.DeleteTool(ctx, store.DeleteToolParams{Name: "files", Now: at(3 * time.Hour)})
	noErr(t, "DeleteTool", err)
	claimWith(t, s, parkParams(newCall("agent-1", "after-delete-1", store.CallAwaitingApproval), limits))
	claimWith(t, s, parkParams(newCall("agent-1", "after-delete-2", store.CallAwaitingPreview), limits))
}

// testParkLimitBytes: the bytes a principal's parked calls hold (approval
// arguments, preview message and value, as given) are bounded by MaxBytes,
// up to and including the limit.
func testParkLimitBytes(t *testing.T, s store.Store) {
	createTool(t, s, newTool("files"))
	big := func(c *store.Call, n int) store.ClaimCallParams {
		p := parkParams(c, store.ParkLimits{})
		if p.Approval != nil {
			p.Approval.Arguments = json.RawMessage(`{"content":"` + strings.Repeat("x", n) + `"}`)
		} else {
			p.Preview.Message = strings.Repeat("é", n/2)
			p.Preview.Value = json.RawMessage(`{"diff":"` + strings.Repeat("y", n) + `"}`)
		}
		return p
	}
	first := big(newCall("agent-1", "b1", store.CallAwaitingApproval), 3000)
	second := big(newCall("agent-1", "b2", store.CallAwaitingPreview), 2000)
	used := store.ParkedBytes(first.Approval, nil) + store.ParkedBytes(nil, second.Preview)
	third := big(newCall("agent-1", "b3", store.CallAwaitingApproval), 1000)
	limits := store.ParkLimits{MaxCalls: 10, MaxBytes: used + store.ParkedBytes(third.Approval, nil)}
	first.Limits, second.Limits = limits, limits
	claimWith(t, s, first)
	claimWith(t, s, second)
	// One byte more than fits is refused ...
	over := big(newCall("agent-1", "b4", store.CallAwaitingApproval), 1001)
	over.Limits = limits
	got, ok, err := s.ClaimCall(t.Context(), over)
	var le *store.ParkLimitError
	if !errors.As(err, &le) || ok || got != nil || le.Bytes != used || le.Calls != 2 || le.CallsExceeded() {
		t.Fatalf("one byte over: %v %v %+v", ok, err, le)
	}
	// ... what fits exactly is not.
	third.Limits = limits
	claimWith(t, s, third)
}

// testParkLimitHeldKey: a key that is held is answered as such whatever the
// limits; taking over a RELEASED record parks anew and counts.
func testParkLimitHeldKey(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	limits := store.ParkLimits{MaxCalls: 1}
	parked := newCall("agent-1", "k1", store.CallAwaitingApproval)
	claimWith(t, s, parkParams(parked, limits))
	again := newCall("agent-1", "k1", store.CallAwaitingApproval)
	got, ok, err := s.ClaimCall(ctx, parkParams(again, limits))
	if err != nil || ok || got == nil || got.ID != parked.ID {
		t.Fatalf("a held key at the limit: %v %v %v, want the holder", got, ok, err)
	}
	// Released: the key may park again, within the limits.
	_, err = s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: parked.ID, From: store.CallAwaitingApproval,
		ApprovalState: store.ApprovalExpired, Now: at(time.Minute), ExpiresAt: at(time.Hour)})
	noErr(t, "ReleaseParkedCall", err)
	other := newCall("agent-1", "k2", store.CallAwaitingPreview)
	claimWith(t, s, parkParams(other, limits))
	wantParkLimit(t, s, newCall("agent-1", "k3", store.CallAwaitingPreview), limits, 1, store.ParkedBytes(nil, newPreview(other)))
	retake := newCall("agent-1", "k1", store.CallAwaitingApproval)
	_, ok, err = s.ClaimCall(ctx, parkParams(retake, limits))
	if !errors.Is(err, store.ErrParkLimit) || ok {
		t.Fatalf("taking over a released key past the limit: %v %v", ok, err)
	}
	if c := getCall(t, s, parked.ID); c.State != store.CallReleased {
		t.Fatalf("the released record after a refused take-over: %s", c.State)
	}
}

// testParkLimitConcurrent: many concurrent parks by one principal never
// pass its limits together, on every replica of the store.
func testParkLimitConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	const n, limit = 40, 5
	limits := store.ParkLimits{MaxCalls: limit}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		claimed int
		refused int
		other   []error
	)
	start := make(chan struct{})
	for i := range n {
		state := store.CallAwaitingApproval
		if i%2 == 1 {
			state = store.CallAwaitingPreview
		}
		p := parkParams(newCall("agent-1", "c"+itoa(i), state), limits)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, ok, err := s.ClaimCall(ctx, p)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && ok:
				claimed++
			case errors.Is(err, store.ErrParkLimit):
				refused++
			default:
				other = append(other, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if claimed != limit || refused != n-limit || len(other) != 0 {
		t.Fatalf("%d claimed, %d refused, other errors %v; want %d and %d", claimed, refused, other, limit, n-limit)
	}
	parked := 0
	for i := range n {
		if c, err := s.GetCallByKey(ctx, "agent-1", "c"+itoa(i)); err == nil && c.State.Parked() {
			parked++
		}
	}
	if parked != limit {
		t.Fatalf("%d calls stored parked, want %d", parked, limit)
	}
}
