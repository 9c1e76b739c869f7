package mcpserver

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Request states (docs/mcp.md#input-required) carry a parked call from an
// input-required result to the client's retry, on any replica. A state is
//
//	v1.<payload>.<mac>
//
// with payload the base64url JSON of requestState and mac the base64url
// HMAC-SHA256 of "v1.<payload>" under a key every replica reads from the
// store (the first to need it stores it). It binds the principal, the
// exported name, tool and action, the fingerprint of the arguments, the
// idempotency key, the approval and an expiry; its id is spent in the store
// on first use, so that it works once across all replicas. Anything that
// does not verify is refused — never taken for a plain retry.

// signingKeyName names the request states' key in the store.
const signingKeyName = "mcp.request_state.v1"

// stateVersion starts every state.
const stateVersion = "v1"

// b64 decodes a state's parts: strictly, so that one state has one
// spelling.
var b64 = base64.RawURLEncoding.Strict()

// maxStateBytes bounds a state a client sends back.
const maxStateBytes = 4 << 10

// requestState is what a state says.
type requestState struct {
	ID          string `json:"id"`
	Principal   string `json:"sub"`
	Name        string `json:"name"`
	Tool        string `json:"tool"`
	Action      string `json:"action"`
	Fingerprint string `json:"fp"`
	Key         string `json:"key"`
	CallID      string `json:"call"`
	ApprovalID  string `json:"approval"`
	// Expires is when the approval expires, in Unix seconds.
	Expires int64 `json:"exp"`
}

// states mints and verifies request states.
type states struct {
	keys store.KeyStore
	now  func() time.Time

	mu  sync.Mutex
	key []byte
}

func newStates(keys store.KeyStore, now func() time.Time) *states {
	return &states{keys: keys, now: now}
}

// signingKey is the key shared through the store, read once.
func (st *states) signingKey(ctx context.Context) ([]byte, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.key != nil {
		return st.key, nil
	}
	mine := make([]byte, 32)
	_, _ = rand.Read(mine) // crypto/rand.Read never returns an error
	k, err := st.keys.SigningKey(ctx, signingKeyName, mine)
	if err != nil {
		return nil, err
	}
	st.key = k
	return k, nil
}

// fingerprint is the fingerprint of arguments as a client sent them.
func fingerprint(args json.RawMessage) (string, error) {
	if len(strings.TrimSpace(string(args))) == 0 {
		args = json.RawMessage("{}")
	}
	canon, _, err := idempotency.Parse(args)
	if err != nil {
		return "", err
	}
	return idempotency.Fingerprint(canon), nil
}

// mint returns the state of a call parked behind resp's approval.
func (st *states) mint(ctx context.Context, p *auth.Principal, name string, args json.RawMessage, resp *executor.Response) (string, error) {
	ap := resp.Approval
	fp, err := fingerprint(args)
	if err != nil {
		return "", err
	}
	key, err := st.signingKey(ctx)
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(requestState{
		ID: uuid.NewString(), Principal: p.ID, Name: name, Tool: ap.Tool, Action: ap.Action,
		Fingerprint: fp, Key: resp.IdempotencyKey, CallID: resp.CallID, ApprovalID: ap.ID,
		Expires: ap.ExpiresAt.Unix(),
	})
	if err != nil {
		return "", err
	}
	signed := stateVersion + "." + base64.RawURLEncoding.EncodeToString(payload)
	return signed + "." + base64.RawURLEncoding.EncodeToString(sign(key, signed)), nil
}

func sign(key []byte, s string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(s))
	return m.Sum(nil)
}

// verify checks a state a client sent back with a call of name with args,
// and spends it. Every failure is a *fault.Error REQUEST_STATE_INVALID.
func (st *states) verify(ctx context.Context, p *auth.Principal, name string, args json.RawMessage, token string) (*requestState, error) {
	refused := func(why string) (*requestState, error) { return nil, fault.RequestStateInvalid(why) }
	if len(token) > maxStateBytes {
		return refused("it is not one this service issued")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != stateVersion {
		return refused("it is not one this service issued")
	}
	mac, err := b64.DecodeString(parts[2])
	if err != nil {
		return refused("it is not one this service issued")
	}
	key, err := st.signingKey(ctx)
	if err != nil {
		return nil, storeFault(err)
	}
	if !hmac.Equal(mac, sign(key, parts[0]+"."+parts[1])) {
		return refused("its signature does not verify (it was altered, or not issued by this service)")
	}
	payload, err := b64.DecodeString(parts[1])
	if err != nil {
		return refused("it is not one this service issued")
	}
	var rs requestState
	if err := json.Unmarshal(payload, &rs); err != nil || rs.ID == "" {
		return refused("it is not one this service issued")
	}
	exp := time.Unix(rs.Expires, 0)
	if !st.now().Before(exp) {
		return refused("it expired at " + exp.UTC().Format(time.RFC3339))
	}
	if rs.Principal != p.ID {
		return refused("it was issued to another principal")
	}
	if rs.Name != name {
		return refused(fmt.Sprintf("it was issued for a call of another tool (%s)", rs.Name))
	}
	fp, err := fingerprint(args)
	if err != nil || fp != rs.Fingerprint {
		return refused("it was issued for a call with other arguments")
	}
	first, err := st.keys.UseToken(ctx, rs.ID, exp)
	if err != nil {
		return nil, storeFault(err)
	}
	if !first {
		return refused("it was used already (each requestState works once)")
	}
	return &rs, nil
}

// storeFault is a store failure while reading or spending a state.
func storeFault(err error) error {
	return fault.StoreUnavailable(err)
}

// sweepEvery is how often spent states past their expiry are forgotten.
const sweepEvery = time.Minute

// sweepBatch bounds one deletion.
const sweepBatch = 1000

// sweep forgets spent states once they have expired, until ctx ends. Every
// replica sweeps; the deletions are safe to run at once.
func (st *states) sweep(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := st.keys.DeleteUsedTokens(ctx, st.now(), sweepBatch)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("mcp: could not forget spent request states", "error", err.Error())
				}
				break
			}
			if n < sweepBatch {
				break
			}
		}
	}
}

// The input request of an approval, in an input-required result.
const inputApproval = "approval"

// wantsPage reports whether the client of req takes an input-required
// result with the approval's page: it speaks 2026-07-28 or later, declares
// URL elicitation, and there is a page to link.
func (s *Server) wantsPage(req *mcp.CallToolRequest) bool {
	if protocolOf(req) < newProtocol || s.opts.ApprovalURL == nil {
		return false
	}
	caps := req.ClientCapabilities()
	return caps != nil && caps.Elicitation != nil && caps.Elicitation.URL != nil
}

// inputRequired answers a call still parked after the hold with an
// input-required result: a URL request for the approval's page and the
// call's state. ok is false when there is no page or no state could be
// made (the store is out of reach): the plain result is answered instead.
func (s *Server) inputRequired(ctx context.Context, p *auth.Principal, req *mcp.CallToolRequest, resp *executor.Response) (*mcp.CallToolResult, bool) {
	ap := resp.Approval
	page := s.approvalURL(ap.ID)
	if page == "" {
		return nil, false
	}
	token, err := s.states.mint(ctx, p, req.Params.Name, req.Params.Arguments, resp)
	if err != nil {
		s.log.WarnContext(ctx, "mcp: could not make a request state; answering the parked call plainly", "error", err.Error())
		return nil, false
	}
	m := resultMeta(string(store.OutcomeApprovalRequired), resp.CallID, resp.IdempotencyKey)
	m[MetaApprovalID] = ap.ID
	m[MetaExpireTime] = ap.ExpiresAt.UTC().Format(time.RFC3339)
	return &mcp.CallToolResult{
		Meta: m,
		InputRequests: mcp.InputRequestMap{inputApproval: &mcp.ElicitParams{
			Mode: "url", URL: page, ElicitationID: ap.ID,
			Message: fmt.Sprintf("%s needs a person's approval (%s risk) before it runs; nothing has been done. "+
				"Open the page to see the call; an approver other than %s decides there. Approval %s is pending until %s.",
				ap.Tool+"."+ap.Action, resp.Risk, p.ID, ap.ID, ap.ExpiresAt.UTC().Format(time.RFC3339)),
		}},
		RequestState: token,
	}, true
}

// declined reports whether the client's answer to the approval's input
// request is not "accept" (its user dismissed the page).
func declined(responses mcp.InputResponseMap) bool {
	r, ok := responses[inputApproval].(*mcp.ElicitResult)
	return ok && r.Action != "accept"
}

// declinedResult answers a retry whose user did not open the approval
// page: nothing ran, and the approval stays as it was.
func (s *Server) declinedResult(st *requestState) *mcp.CallToolResult {
	m := resultMeta(string(store.OutcomeApprovalRequired), st.CallID, st.Key)
	m[MetaApprovalID] = st.ApprovalID
	exp := time.Unix(st.Expires, 0).UTC().Format(time.RFC3339)
	m[MetaExpireTime] = exp
	return &mcp.CallToolResult{IsError: true, Meta: m, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
		"The approval page was not opened, and the call has not run: nothing was done. Approval %s stays pending until %s. "+
			"Once a person approves it, call this tool again with exactly the same arguments: that call runs it, once.",
		st.ApprovalID, exp)}}}
}

// rejectState audits a refused request state (a forged, altered, replayed
// or misused one is worth an operator's attention), at most the refusal
// throttle's share per principal.
func (s *Server) rejectState(ctx context.Context, p *auth.Principal, r executor.Request, refusal error) {
	if t := s.opts.RefusalAudit; t != nil {
		if ok, _ := t.Allow("principal " + p.ID); !ok {
			return
		}
	}
	reason, why := fault.ReasonInternal, ""
	if f, ok := fault.As(refusal); ok {
		reason, why = f.Reason, f.Message
	}
	ev := audit.NewDetail(audit.ToolCallRejected, store.AuditEvent{
		Time: s.now(), Principal: p.ID, Tool: r.Tool, TraceID: r.TraceID, TaskID: r.TaskID, StepID: r.StepID,
	}, map[string]any{"reason": reason, "message": why, "method": operation})
	if err := s.opts.Store.AppendAuditEvents(context.WithoutCancel(ctx), []store.AuditEvent{ev}); err != nil {
		s.log.ErrorContext(ctx, "could not audit a refused request state", "error", err)
	}
}
