package storetest

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// The parked calls a retry without its key finds (FindParkedCall).

func parkedTests() []test {
	return []test{
		{"FindParked", testFindParked},
		{"FindParkedLeavesWithState", testFindParkedLeaves},
		{"FindParkedTakeover", testFindParkedTakeover},
	}
}

// parkedCall returns a parked call of principal with fingerprint fp.
func parkedCall(principal, key, fp string, state store.CallState) *store.Call {
	c := newCall(principal, key, state)
	c.Fingerprint = fp
	return c
}

func findParked(t *testing.T, s store.Store, principal, tool, action, fp string) (*store.Call, error) {
	t.Helper()
	return s.FindParkedCall(t.Context(), store.FindParkedCallParams{PrincipalID: principal, Tool: tool, Action: action, Fingerprint: fp})
}

func wantParked(t *testing.T, s store.Store, what, principal, fp string, want *store.Call) {
	t.Helper()
	got, err := findParked(t, s, principal, "files", "write", fp)
	if want == nil {
		wantErr(t, what, err, store.ErrNotFound)
		return
	}
	noErr(t, what, err)
	wantCall(t, what, got, getCall(t, s, want.ID))
}

func testFindParked(t *testing.T, s store.Store) {
	ctx := t.Context()
	// Two parked calls of the same principal with the same arguments: the
	// newer (by id) is found, whatever their order of claiming.
	ids := []string{newID(), newID()}
	slices.Sort(ids)
	newer := parkedCall("agent-1", "key-b", "fp-same", store.CallAwaitingPreview)
	newer.ID = ids[1]
	older := parkedCall("agent-1", "key-a", "fp-same", store.CallAwaitingApproval)
	older.ID = ids[0]
	claim(t, s, newer)
	claim(t, s, older)
	wantParked(t, s, "the newer of two parked calls", "agent-1", "fp-same", newer)

	// What is not the same call is never found: another principal, tool,
	// action or fingerprint, or a call that is not parked.
	other := parkedCall("agent-2", "key-a", "fp-other", store.CallAwaitingApproval)
	claim(t, s, other)
	running := parkedCall("agent-1", "key-r", "fp-running", store.CallInProgress)
	claim(t, s, running)
	wantParked(t, s, "another principal's parked call", "agent-1", "fp-other", nil)
	wantParked(t, s, "the principal's call of another principal", "agent-2", "fp-same", nil)
	wantParked(t, s, "a running call", "agent-1", "fp-running", nil)
	for _, tc := range []struct{ tool, action string }{{"files", "read"}, {"notes", "write"}} {
		_, err := findParked(t, s, "agent-1", tc.tool, tc.action, "fp-same")
		wantErr(t, "a parked call of "+tc.tool+"."+tc.action, err, store.ErrNotFound)
	}
	wantParked(t, s, "agent-2's own parked call", "agent-2", "fp-other", other)

	for _, p := range []store.FindParkedCallParams{
		{Tool: "files", Action: "write", Fingerprint: "fp"},
		{PrincipalID: "agent-1", Action: "write", Fingerprint: "fp"},
		{PrincipalID: "agent-1", Tool: "files", Fingerprint: "fp"},
		{PrincipalID: "agent-1", Tool: "files", Action: "write"},
	} {
		_, err := s.FindParkedCall(ctx, p)
		wantErr(t, fmt.Sprintf("FindParkedCall(%+v)", p), err, store.ErrInvalid)
	}
}

// testFindParkedLeaves follows parked calls through every way out of
// parking: approved-but-unused calls are still found, started, released,
// denied and expired ones are not.
func testFindParkedLeaves(t *testing.T, s store.Store) {
	ctx := t.Context()
	approved := parkedCall("agent-1", "key-ok", "fp-ok", store.CallAwaitingApproval)
	claim(t, s, approved)
	approve(t, s, approved.ApprovalID)
	wantParked(t, s, "an approved, unused call", "agent-1", "fp-ok", approved)
	_, err := s.StartParkedCall(ctx, store.StartParkedCallParams{
		CallID: approved.ID, ApprovalID: approved.ApprovalID, Now: at(2 * time.Minute), Lease: longLease,
		Risk: approved.Risk, Decision: approved.Decision, ClaimToken: "claim-" + newID(),
	})
	noErr(t, "StartParkedCall", err)
	wantParked(t, s, "a call started from its approval", "agent-1", "fp-ok", nil)

	preview := parkedCall("agent-1", "key-pv", "fp-pv", store.CallAwaitingPreview)
	claim(t, s, preview)
	wantParked(t, s, "a call parked behind a preview", "agent-1", "fp-pv", preview)
	_, err = s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: preview.ID, From: store.CallAwaitingPreview,
		PreviewState: store.PreviewExpired, Now: at(time.Minute), ExpiresAt: at(time.Hour)})
	noErr(t, "ReleaseParkedCall", err)
	wantParked(t, s, "a released call", "agent-1", "fp-pv", nil)

	denied := parkedCall("agent-1", "key-no", "fp-no", store.CallAwaitingApproval)
	claim(t, s, denied)
	_, err = s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: denied.ApprovalID, State: store.ApprovalDenied,
		Resolver: "approver-1", Comment: "no", Now: at(time.Minute), CallResult: &store.Result{Message: "denied: no"},
		CallExpiresAt: at(time.Hour)})
	noErr(t, "ResolveApproval (deny)", err)
	wantParked(t, s, "a denied call", "agent-1", "fp-no", nil)

	expiring := parkedCall("agent-1", "key-exp", "fp-exp", store.CallAwaitingApproval)
	claim(t, s, expiring)
	_, err = s.ExpireApprovals(ctx, store.ExpireParams{Now: at(2 * time.Hour), ExpiresAt: at(3 * time.Hour)})
	noErr(t, "ExpireApprovals", err)
	wantParked(t, s, "a call whose approval expired", "agent-1", "fp-exp", nil)
}

// testFindParkedTakeover parks a key again after its release: the record
// taken over is found under its (unchanged) arguments.
func testFindParkedTakeover(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := parkedCall("agent-1", "key-t", "fp-t", store.CallAwaitingApproval)
	claim(t, s, first)
	_, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: first.ID, From: store.CallAwaitingApproval,
		ApprovalState: store.ApprovalExpired, Now: at(time.Minute), ExpiresAt: at(time.Hour)})
	noErr(t, "ReleaseParkedCall", err)
	wantParked(t, s, "the released call", "agent-1", "fp-t", nil)
	again := parkedCall("agent-1", "key-t", "fp-t", store.CallAwaitingApproval)
	got := claim(t, s, again)
	if got.ID != first.ID {
		t.Fatalf("takeover kept id %s, want %s", got.ID, first.ID)
	}
	wantParked(t, s, "the call parked again", "agent-1", "fp-t", got)
}

// Signing keys and single-use tokens.

func keyTests() []test {
	return []test{
		{"SigningKey", testSigningKey},
		{"SigningKeyConcurrent", testSigningKeyConcurrent},
		{"UseToken", testUseToken},
		{"UseTokenConcurrent", testUseTokenConcurrent},
		{"DeleteUsedTokens", testDeleteUsedTokens},
	}
}

func key(b byte) []byte { return bytes.Repeat([]byte{b}, store.MinSigningKeyBytes) }

func testSigningKey(t *testing.T, s store.Store) {
	ctx := t.Context()
	// Every byte value survives.
	first := make([]byte, 64)
	for i := range first {
		first[i] = byte(i * 7)
	}
	got, err := s.SigningKey(ctx, "mcp-state", first)
	noErr(t, "SigningKey", err)
	if !bytes.Equal(got, first) {
		t.Fatalf("first SigningKey returned %x, want the key given %x", got, first)
	}
	got, err = s.SigningKey(ctx, "mcp-state", key(9))
	noErr(t, "SigningKey again", err)
	if !bytes.Equal(got, first) {
		t.Fatalf("second SigningKey returned %x, want the stored %x", got, first)
	}
	// The returned key is a copy.
	got[0] ^= 0xff
	again, err := s.SigningKey(ctx, "mcp-state", key(9))
	noErr(t, "SigningKey a third time", err)
	if !bytes.Equal(again, first) {
		t.Fatal("changing a returned key changed the stored one")
	}
	// Names are independent.
	other, err := s.SigningKey(ctx, "other", key(3))
	noErr(t, "SigningKey of another name", err)
	if !bytes.Equal(other, key(3)) {
		t.Fatalf("another name's key is %x", other)
	}
	_, err = s.SigningKey(ctx, "", key(1))
	wantErr(t, "SigningKey without a name", err, store.ErrInvalid)
	_, err = s.SigningKey(ctx, "short", key(1)[:store.MinSigningKeyBytes-1])
	wantErr(t, "SigningKey with a short key", err, store.ErrInvalid)
	_, err = s.SigningKey(ctx, "short", key(1))
	noErr(t, "SigningKey after a refused one", err)
}

func testSigningKeyConcurrent(t *testing.T, s store.Store) {
	const n = 12
	got := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = s.SigningKey(t.Context(), "race", key(byte(i+1))) })
	}
	wg.Wait()
	for i := range n {
		noErr(t, "concurrent SigningKey", errs[i])
		if !bytes.Equal(got[i], got[0]) {
			t.Fatalf("concurrent callers got different keys: %x and %x", got[0], got[i])
		}
	}
	if got[0][0] < 1 || got[0][0] > n || !bytes.Equal(got[0], key(got[0][0])) {
		t.Fatalf("the stored key %x is none of those given", got[0])
	}
}

func testUseToken(t *testing.T, s store.Store) {
	ctx := t.Context()
	first, err := s.UseToken(ctx, "tok-1", at(time.Hour))
	noErr(t, "UseToken", err)
	if !first {
		t.Fatal("a new token was reported spent")
	}
	for range 2 {
		again, err := s.UseToken(ctx, "tok-1", at(2*time.Hour))
		noErr(t, "UseToken again", err)
		if again {
			t.Fatal("a spent token was spent again")
		}
	}
	other, err := s.UseToken(ctx, "tok-2", at(time.Hour))
	noErr(t, "UseToken of another token", err)
	if !other {
		t.Fatal("another token was reported spent")
	}
	_, err = s.UseToken(ctx, "", at(time.Hour))
	wantErr(t, "UseToken without an id", err, store.ErrInvalid)
}

func testUseTokenConcurrent(t *testing.T, s store.Store) {
	const n = 16
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		wins  int
		first error
	)
	for range n {
		wg.Go(func() {
			ok, err := s.UseToken(t.Context(), "race", at(time.Hour))
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			if ok {
				wins++
			}
		})
	}
	wg.Wait()
	noErr(t, "concurrent UseToken", first)
	if wins != 1 {
		t.Fatalf("%d concurrent callers spent the same token, want 1", wins)
	}
}

func testDeleteUsedTokens(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i, d := range []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute, time.Hour} {
		ok, err := s.UseToken(ctx, fmt.Sprintf("tok-%d", i), at(d))
		noErr(t, "UseToken", err)
		if !ok {
			t.Fatalf("token %d reported spent", i)
		}
	}
	_, err := s.DeleteUsedTokens(ctx, at(time.Hour), -1)
	wantErr(t, "DeleteUsedTokens with a negative limit", err, store.ErrInvalid)
	// Two of the three expired before now, earliest first.
	n, err := s.DeleteUsedTokens(ctx, at(time.Hour), 2)
	noErr(t, "DeleteUsedTokens", err)
	if n != 2 {
		t.Fatalf("DeleteUsedTokens deleted %d, want 2", n)
	}
	spent := func(id string) bool {
		t.Helper()
		first, err := s.UseToken(ctx, id, at(time.Hour))
		noErr(t, "UseToken", err)
		return !first
	}
	// tok-2 and tok-3 are still remembered; the deleted ones are not (and
	// are spent again here, until an hour).
	if !spent("tok-2") || !spent("tok-3") {
		t.Fatal("a token not yet due was forgotten")
	}
	if spent("tok-0") || spent("tok-1") {
		t.Fatal("a deleted token is still remembered")
	}
	n, err = s.DeleteUsedTokens(ctx, at(time.Hour), 0)
	noErr(t, "DeleteUsedTokens", err)
	// tok-2 (3 minutes) is due; the others expire at the hour, which is not
	// before now.
	if n != 1 {
		t.Fatalf("DeleteUsedTokens deleted %d, want 1", n)
	}
	if !spent("tok-3") {
		t.Fatal("a token expiring exactly now was forgotten")
	}
}
