package mcpserver

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var stateArgs = json.RawMessage(`{"path": "/a.md", "content": "hi"}`)

// parked is the answer of a call parked behind an approval expiring in an
// hour from c's time.
func parked(c *clock) *executor.Response {
	return &executor.Response{
		CallID: "call-1", IdempotencyKey: "auto-1", Outcome: store.OutcomeApprovalRequired,
		Approval: &store.Approval{ID: "ap-1", Tool: "notes", Action: "write", ExpiresAt: c.now().Add(time.Hour)},
	}
}

func wantRefused(t *testing.T, what string, err error, why string) {
	t.Helper()
	f, ok := fault.As(err)
	if !ok || f.Reason != fault.ReasonRequestStateInvalid || !strings.Contains(f.Message, why) {
		t.Fatalf("%s: %v, want REQUEST_STATE_INVALID saying %q", what, err, why)
	}
}

// A state verifies once, for the principal, name and arguments it was
// made for, until its approval expires; its fields are what it was made
// of.
func TestRequestState(t *testing.T) {
	c := &clock{t: time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)}
	st := newStates(memory.New(), c.now)
	p := &auth.Principal{ID: "agent-1"}
	ctx := t.Context()
	tok, err := st.mint(ctx, p, "notes__write", stateArgs, parked(c))
	if err != nil {
		t.Fatal(err)
	}
	// Key order and spacing of the arguments do not matter.
	rs, err := st.verify(ctx, p, "notes__write", json.RawMessage(`{"content":"hi","path":"/a.md"}`), tok)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Key != "auto-1" || rs.ApprovalID != "ap-1" || rs.CallID != "call-1" || rs.Tool != "notes" || rs.Action != "write" {
		t.Fatalf("verified %+v", rs)
	}
	_, err = st.verify(ctx, p, "notes__write", stateArgs, tok)
	wantRefused(t, "a spent state", err, "used already")

	// Another replica of the same store verifies it: the key is shared.
	tok, _ = st.mint(ctx, p, "notes__write", stateArgs, parked(c))
	other := newStates(st.keys, c.now)
	if _, err := other.verify(ctx, p, "notes__write", stateArgs, tok); err != nil {
		t.Fatalf("another replica: %v", err)
	}

	// Expired with its approval.
	tok, _ = st.mint(ctx, p, "notes__write", stateArgs, parked(c))
	c.advance(time.Hour)
	_, err = st.verify(ctx, p, "notes__write", stateArgs, tok)
	wantRefused(t, "an expired state", err, "expired")

	// A store's other key (another database) does not verify it.
	tok, _ = st.mint(ctx, p, "notes__write", stateArgs, parked(c))
	stranger := newStates(memory.New(), c.now)
	_, err = stranger.verify(ctx, p, "notes__write", stateArgs, tok)
	wantRefused(t, "a state of another database", err, "signature")

	// Altered: every field is under the MAC.
	parts := strings.Split(tok, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var m map[string]any
	if err := json.Unmarshal(payload, &m); err != nil {
		t.Fatal(err)
	}
	m["exp"] = float64(c.now().Add(48 * time.Hour).Unix())
	altered, _ := json.Marshal(m)
	_, err = st.verify(ctx, p, "notes__write", stateArgs, parts[0]+"."+base64.RawURLEncoding.EncodeToString(altered)+"."+parts[2])
	wantRefused(t, "an altered expiry", err, "signature")
	for _, bad := range []string{"", "v1", "v2." + parts[1] + "." + parts[2], "v1.!!.??", "v1." + parts[1] + ".AAAA",
		strings.Repeat("a", maxStateBytes+1)} {
		_, err = st.verify(ctx, p, "notes__write", stateArgs, bad)
		f, ok := fault.As(err)
		if !ok || f.Reason != fault.ReasonRequestStateInvalid {
			t.Fatalf("token %.40q: %v", bad, err)
		}
	}
}

// FuzzRequestState: whatever a client sends as a state, verification
// refuses it cleanly (no panic, never accepted) unless it is the state
// minted.
func FuzzRequestState(f *testing.F) {
	c := &clock{t: time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)}
	st := newStates(memory.New(), c.now)
	p := &auth.Principal{ID: "agent-1"}
	tok, err := st.mint(f.Context(), p, "notes__write", stateArgs, parked(c))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tok)
	f.Add("v1.e30.")
	f.Add("v1..")
	f.Add(strings.Replace(tok, "v1.", "v1..", 1))
	f.Fuzz(func(t *testing.T, s string) {
		if s == tok {
			return
		}
		rs, err := st.verify(t.Context(), p, "notes__write", stateArgs, s)
		if err == nil {
			t.Fatalf("a state that was never minted verified: %q → %+v", s, rs)
		}
	})
}
