package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/auth/pkitest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
)

// rpc is one toolsvc method called with a harmless request: its success or
// its own error (NOT_FOUND, INVALID_ARGUMENT) shows it got past
// authentication and the role check.
type rpc struct {
	method string // full method name, as audited (without the leading slash)
	roles  []string
	call   func(ctx context.Context, c clients) error
}

// keys makes idempotency keys unique within a test binary.
var keys atomic.Int64

// recvOne opens a stream and receives its first message. A stream that was
// let in but has nothing to send yet ends with the test's short deadline.
func recvOne[T any](ctx context.Context, open func(context.Context) (interface{ Recv() (T, error) }, error)) error {
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	s, err := open(ctx)
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) == codes.DeadlineExceeded {
		return nil
	}
	return err
}

// everyRPC lists every toolsvc RPC with the roles that may call it: the
// contract of docs/auth.md#roles-and-ownership, stated here independently of the server's table.
func everyRPC() []rpc {
	const (
		ag = "agent"
		ap = "approver"
		op = "operator"
	)
	return []rpc{
		{"toolsvc.v1.ToolExecutionService/ExecuteTool", []string{ag}, func(ctx context.Context, c clients) error {
			_, err := c.exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{Tool: "risk-low", Action: "act",
				Context: &toolsvcv1.CallContext{IdempotencyKey: fmt.Sprint("m-", keys.Add(1)), AutonomyLevel: autonomous}})
			return err
		}},
		{"toolsvc.v1.ToolExecutionService/GetCall", []string{ag, op}, func(ctx context.Context, c clients) error {
			_, err := c.exec.GetCall(ctx, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_CallId{CallId: "no-such-call"}})
			return err
		}},
		{"toolsvc.v1.ToolExecutionService/ResolveCall", []string{op}, func(ctx context.Context, c clients) error {
			_, err := c.exec.ResolveCall(ctx, &toolsvcv1.ResolveCallRequest{CallId: "no-such-call", Outcome: succeeded, Comment: "checked"})
			return err
		}},
		{"toolsvc.v1.RegistryService/RegisterTool", []string{op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{})
			return err
		}},
		{"toolsvc.v1.RegistryService/DeregisterTool", []string{op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.DeregisterTool(ctx, &toolsvcv1.DeregisterToolRequest{Name: "no-such-tool"})
			return err
		}},
		{"toolsvc.v1.RegistryService/GetTool", []string{ag, op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: "risk-low"})
			return err
		}},
		{"toolsvc.v1.RegistryService/ListTools", []string{ag, op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
			return err
		}},
		{"toolsvc.v1.RegistryService/RegisterToolset", []string{op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.RegisterToolset(ctx, &toolsvcv1.RegisterToolsetRequest{})
			return err
		}},
		{"toolsvc.v1.RegistryService/DeregisterToolset", []string{op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.DeregisterToolset(ctx, &toolsvcv1.DeregisterToolsetRequest{Name: "no-such-toolset"})
			return err
		}},
		{"toolsvc.v1.RegistryService/GetToolset", []string{ag, op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.GetToolset(ctx, &toolsvcv1.GetToolsetRequest{Name: "no-such-toolset"})
			return err
		}},
		{"toolsvc.v1.RegistryService/ListToolsets", []string{ag, op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.ListToolsets(ctx, &toolsvcv1.ListToolsetsRequest{})
			return err
		}},
		{"toolsvc.v1.RegistryService/ExportTools", []string{ag, op}, func(ctx context.Context, c clients) error {
			_, err := c.registry.ExportTools(ctx, &toolsvcv1.ExportToolsRequest{Format: toolsvcv1.ExportFormat_EXPORT_FORMAT_MCP})
			return err
		}},
		{"toolsvc.v1.ToolHealthService/GetToolHealth", []string{op, ag}, func(ctx context.Context, c clients) error {
			_, err := c.health.GetToolHealth(ctx, &toolsvcv1.GetToolHealthRequest{Tool: "risk-low"})
			return err
		}},
		{"toolsvc.v1.ToolHealthService/ListToolHealth", []string{op, ag}, func(ctx context.Context, c clients) error {
			_, err := c.health.ListToolHealth(ctx, &toolsvcv1.ListToolHealthRequest{})
			return err
		}},
		{"toolsvc.v1.ToolHealthService/WatchToolHealth", []string{op, ag}, func(ctx context.Context, c clients) error {
			return recvOne(ctx, func(ctx context.Context) (interface {
				Recv() (*toolsvcv1.WatchToolHealthResponse, error)
			}, error) {
				return c.health.WatchToolHealth(ctx, &toolsvcv1.WatchToolHealthRequest{})
			})
		}},
		{"toolsvc.v1.ToolHealthService/SetToolHealth", []string{op}, func(ctx context.Context, c clients) error {
			_, err := c.health.SetToolHealth(ctx, &toolsvcv1.SetToolHealthRequest{Tool: "no-such-tool",
				Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, Reason: "matrix"})
			return err
		}},
		{"toolsvc.v1.ApprovalService/ListApprovals", []string{ag, ap, op}, func(ctx context.Context, c clients) error {
			_, err := c.approvals.ListApprovals(ctx, &toolsvcv1.ListApprovalsRequest{})
			return err
		}},
		{"toolsvc.v1.ApprovalService/GetApproval", []string{ag, ap, op}, func(ctx context.Context, c clients) error {
			_, err := c.approvals.GetApproval(ctx, &toolsvcv1.GetApprovalRequest{ApprovalId: "no-such-approval"})
			return err
		}},
		{"toolsvc.v1.ApprovalService/ResolveApproval", []string{ap}, func(ctx context.Context, c clients) error {
			_, err := c.approvals.ResolveApproval(ctx, &toolsvcv1.ResolveApprovalRequest{ApprovalId: "no-such-approval", Decision: approve})
			return err
		}},
		{"toolsvc.v1.ApprovalService/WatchApprovals", []string{ag, ap, op}, func(ctx context.Context, c clients) error {
			return recvOne(ctx, func(ctx context.Context) (interface {
				Recv() (*toolsvcv1.WatchApprovalsResponse, error)
			}, error) {
				return c.approvals.WatchApprovals(ctx, &toolsvcv1.WatchApprovalsRequest{})
			})
		}},
		{"toolsvc.v1.AuditService/ListAuditEvents", []string{ag, ap, op}, func(ctx context.Context, c clients) error {
			_, err := c.audit.ListAuditEvents(ctx, &toolsvcv1.ListAuditEventsRequest{})
			return err
		}},
	}
}

// reasonOf returns an error's ErrorInfo reason and metadata.
func reasonOf(err error) (string, map[string]string) {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(interface {
			GetReason() string
			GetMetadata() map[string]string
		}); ok {
			return info.GetReason(), info.GetMetadata()
		}
	}
	return "", nil
}

// TestAuthenticationMatrix: every RPC × every role, and every RPC × every
// way of failing to authenticate, through real TLS connections: the exact
// status, reason and cause, and the refusal's one audit row, which never
// holds the credential presented.
func TestAuthenticationMatrix(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newAuthEnv(t, backend, nil)
		ctx := testCtx(t)
		plain := clientsOf(e.dial(t, nil))
		rpcs := everyRPC()
		if len(rpcs) != 21 {
			t.Fatalf("%d RPCs listed; the API has 21", len(rpcs))
		}

		// Roles, with tokens.
		for _, role := range []string{"agent", "approver", "operator"} {
			principal := map[string]string{"agent": agentA, "approver": approver, "operator": operator}[role]
			for _, r := range rpcs {
				err := r.call(e.as(ctx, principal), plain)
				reason, md := reasonOf(err)
				if slices.Contains(r.roles, role) {
					if status.Code(err) == codes.Unauthenticated || reason == "ROLE_REQUIRED" {
						t.Errorf("%s as %s: refused: %v", r.method, role, err)
					}
					continue
				}
				if status.Code(err) != codes.PermissionDenied || reason != "ROLE_REQUIRED" || md["roles"] != strings.Join(r.roles, ",") {
					t.Errorf("%s as %s: want PERMISSION_DENIED ROLE_REQUIRED roles=%s, got %v %v", r.method, role, strings.Join(r.roles, ","), err, md)
				}
			}
		}

		// Ways of failing to authenticate, each on its own connection.
		canary := auth.TokenPrefix + "CANARYcanaryCANARYcanaryCANARYcanaryCANARY0"
		revoked, _, err := auth.NewToken(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tokenOnly := func(tok string) func(context.Context) context.Context {
			return func(ctx context.Context) context.Context {
				return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
			}
		}
		none := func(ctx context.Context) context.Context { return ctx }
		cases := []struct {
			name  string
			conn  *grpc.ClientConn
			ctx   func(context.Context) context.Context
			cause auth.Cause
		}{
			{"no credentials", e.dial(t, nil), none, auth.CauseNoCredentials},
			{"bad token", e.dial(t, nil), tokenOnly(canary), auth.CauseUnknownToken},
			{"revoked token", e.dial(t, nil), tokenOnly(revoked), auth.CauseUnknownToken},
			{"principal header", e.dial(t, nil), func(ctx context.Context) context.Context {
				return metadata.AppendToOutgoingContext(ctx, auth.PrincipalHeader, operator)
			}, auth.CausePrincipalHeader},
			{"unknown certificate", e.dial(t, e.ca.Client(t, "spiffe://toolsvc.test/stranger")), none, auth.CauseCertificateUnmapped},
			{"expired certificate", e.dial(t, e.ca.Issue(t, pkitest.Options{Names: []string{approverURI},
				NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})), none, auth.CauseCertificateExpired},
			{"wrong CA", e.dial(t, e.otherCA.Client(t, approverURI)), none, auth.CauseCertificateUntrusted},
		}
		for _, tc := range cases {
			c := clientsOf(tc.conn)
			for _, r := range rpcs {
				err := r.call(tc.ctx(ctx), c)
				reason, md := reasonOf(err)
				if status.Code(err) != codes.Unauthenticated || reason != "UNAUTHENTICATED" || md[auth.CauseKey] != string(tc.cause) {
					t.Errorf("%s, %s: want UNAUTHENTICATED cause %s, got %v %v", tc.name, r.method, tc.cause, err, md)
				}
				if strings.Contains(err.Error(), "CANARY") || strings.Contains(err.Error(), revoked) {
					t.Errorf("%s, %s: the error repeats the token: %v", tc.name, r.method, err)
				}
			}
		}

		// The audit rows: one per refusal, saying who (or, unauthenticated,
		// from where), what and why, never with what was presented.
		perCause := map[auth.Cause]int{}
		for _, tc := range cases {
			perCause[tc.cause]++
		}
		type key struct{ principal, method, why string }
		rows := map[key]int{}
		for _, ev := range e.refusals(t, ctx) {
			b, _ := json.Marshal(ev)
			if strings.Contains(string(b), "CANARY") || strings.Contains(string(b), revoked) {
				t.Errorf("audit row holds a token: %s", b)
			}
			wantType := "access.denied"
			if detail(ev, "method") == "toolsvc.v1.ToolExecutionService/ExecuteTool" {
				wantType = "tool_call.rejected"
			}
			if ev.Type != wantType {
				t.Errorf("%s refused with a %s event", detail(ev, "method"), ev.Type)
			}
			why := detail(ev, "reason")
			if ev.Principal == "" {
				why = detail(ev, "cause")
				if detail(ev, "reason") != "UNAUTHENTICATED" || detail(ev, "peer") != "127.0.0.1" {
					t.Errorf("unauthenticated refusal row %v", ev.Detail)
				}
			}
			rows[key{ev.Principal, detail(ev, "method"), why}]++
		}
		want := 0
		for _, r := range rpcs {
			for role, principal := range map[string]string{"agent": agentA, "approver": approver, "operator": operator} {
				if !slices.Contains(r.roles, role) {
					want++
					if n := rows[key{principal, r.method, "ROLE_REQUIRED"}]; n != 1 {
						t.Errorf("%s refused to %s: %d audit rows, want 1", r.method, role, n)
					}
				}
			}
			for cause, times := range perCause {
				if n := rows[key{"", r.method, string(cause)}]; n != times {
					t.Errorf("%s refused for %s: %d audit rows, want %d", r.method, cause, n, times)
				}
			}
			want += len(cases)
		}
		total := 0
		for _, n := range rows {
			total += n
		}
		if total != want {
			t.Errorf("%d refusal rows, want %d", total, want)
		}

		// No token, valid or not, reaches the log.
		logs := e.logs.String()
		for name, tok := range e.tokens {
			if strings.Contains(logs, tok) {
				t.Errorf("%s's token is in the log", name)
			}
		}
		if strings.Contains(logs, "CANARY") || strings.Contains(logs, revoked) {
			t.Errorf("the log holds a presented token:\n%s", logs)
		}
		if !strings.Contains(logs, "the bearer token is not valid") {
			t.Errorf("the log does not say why a token was refused:\n%s", logs)
		}

		// Health and reflection stay open without credentials.
		if _, err := healthpb.NewHealthClient(e.dial(t, nil)).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("health without credentials: %v", err)
		}
	})
}

// TestMalformedAuthorization: authorization metadata given twice, with
// another scheme, empty or huge is refused as malformed, never echoed, and
// does not disturb the connection.
func TestMalformedAuthorization(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newAuthEnv(t, backend, nil)
		ctx := testCtx(t)
		c := clientsOf(e.dial(t, nil))
		secret := "CANARY" + strings.Repeat("x", 40)
		for name, vals := range map[string][]string{
			"twice":            {"Bearer " + e.tokens[agentA], "Bearer " + secret},
			"twice, same":      {"Bearer " + e.tokens[agentA], "Bearer " + e.tokens[agentA]},
			"basic":            {"Basic " + secret},
			"no scheme":        {secret},
			"scheme only":      {"Bearer"},
			"too long":         {"Bearer " + secret + strings.Repeat("A", 2000)},
			"not a b64token":   {"Bearer " + secret + "!*"},
			"valid and header": {"Bearer " + e.tokens[agentA], "x"},
		} {
			md := metadata.MD{}
			for _, v := range vals {
				md.Append("authorization", v)
			}
			_, err := c.registry.ListTools(metadata.NewOutgoingContext(ctx, md), &toolsvcv1.ListToolsRequest{})
			reason, info := reasonOf(err)
			if status.Code(err) != codes.Unauthenticated || reason != "UNAUTHENTICATED" || info[auth.CauseKey] != string(auth.CauseMalformedAuthorization) {
				t.Errorf("%s: got %v %v", name, err, info)
			}
			if strings.Contains(err.Error(), "CANARY") || strings.Contains(err.Error(), e.tokens[agentA]) {
				t.Errorf("%s: echoed: %v", name, err)
			}
		}
		// The connection still serves a well-formed call.
		if _, err := c.registry.ListTools(e.as(ctx, agentA), &toolsvcv1.ListToolsRequest{}); err != nil {
			t.Fatal(err)
		}
		for _, ev := range e.refusals(t, ctx) {
			b, _ := json.Marshal(ev)
			if strings.Contains(string(b), "CANARY") || strings.Contains(string(b), e.tokens[agentA]) {
				t.Errorf("audit row holds a credential: %s", b)
			}
		}
		if strings.Contains(e.logs.String(), "CANARY") || strings.Contains(e.logs.String(), e.tokens[agentA]) {
			t.Error("the log holds a credential")
		}
	})
}

// TestClientCertificates: the principal comes from the certificate's URI or
// DNS SAN; one known name among several will do; a certificate without
// names, or with names of two principals, is refused. A token of the same
// principal may come along; one of another principal may not.
func TestClientCertificates(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newAuthEnv(t, backend, nil)
		ctx := testCtx(t)
		whoAmI := func(conn *grpc.ClientConn, ctx context.Context) (string, error) {
			// Neither the approver nor the operator may execute: the
			// refusal is audited under the caller's id.
			_, err := clientsOf(conn).exec.ExecuteTool(ctx, req(t, "risk-low", "act", nil, "who"))
			if status.Code(err) != codes.PermissionDenied {
				return "", err
			}
			return principalOfLastEvent(t, ctx, e), nil
		}
		for _, tc := range []struct {
			name  string
			cert  *pkitest.Leaf
			token string
			want  string
			cause auth.Cause
		}{
			{"URI SAN", e.ca.Client(t, approverURI), "", approver, ""},
			{"DNS SAN", e.ca.Client(t, operatorDNS), "", operator, ""},
			{"DNS SAN in capitals", e.ca.Client(t, strings.ToUpper(operatorDNS)), "", operator, ""},
			{"several SANs, one known", e.ca.Client(t, "stranger.toolsvc.test", "spiffe://toolsvc.test/x", approverURI), "", approver, ""},
			{"certificate and token of one principal", e.ca.Client(t, operatorDNS), operator, operator, ""},
			{"no SAN", e.ca.Issue(t, pkitest.Options{CommonName: approver}), "", "", auth.CauseCertificateUnmapped},
			{"SANs of two principals", e.ca.Client(t, approverURI, operatorDNS), "", "", auth.CauseCertificateAmbiguous},
			{"certificate and token of two principals", e.ca.Client(t, operatorDNS), agentA, "", auth.CauseConflictingCredentials},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cctx := ctx
				if tc.token != "" {
					cctx = e.as(ctx, tc.token)
				}
				got, err := whoAmI(e.dial(t, tc.cert), cctx)
				if tc.cause != "" {
					_, md := reasonOf(err)
					if status.Code(err) != codes.Unauthenticated || md[auth.CauseKey] != string(tc.cause) {
						t.Fatalf("want UNAUTHENTICATED %s, got %v %v", tc.cause, err, md)
					}
					return
				}
				if err != nil || got != tc.want {
					t.Fatalf("authenticated as %q (%v), want %q", got, err, tc.want)
				}
			})
		}
	})
}

// principalOfLastEvent returns the principal of the newest audit event.
func principalOfLastEvent(t *testing.T, ctx context.Context, e *authEnv) string {
	t.Helper()
	evs, err := e.app.Store().ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil || len(evs) == 0 {
		t.Fatalf("audit: %v", err)
	}
	return evs[len(evs)-1].Principal
}

// TestOwnership: agent B cannot read agent A's call (by id or by key), its
// approval (get, list, watch) or its audit events; approvers see both
// agents' approvals, operators everything.
func TestOwnership(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newAuthEnv(t, backend, nil)
		ctx := testCtx(t)
		c := clientsOf(e.dial(t, nil))
		asA, asB := e.as(ctx, agentA), e.as(ctx, agentB)

		// B watches approvals before A's call is parked.
		wctx, stopWatch := context.WithCancel(asB)
		defer stopWatch()
		watchB, err := c.approvals.WatchApprovals(wctx, &toolsvcv1.WatchApprovalsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		seenByB := make(chan *toolsvcv1.Approval, 10)
		go func() {
			for {
				m, err := watchB.Recv()
				if err != nil {
					close(seenByB)
					return
				}
				seenByB <- m.Approval
			}
		}()
		time.Sleep(100 * time.Millisecond) // let the watch subscribe

		parkedA, err := c.exec.ExecuteTool(asA, at(req(t, "risk-high", "act", nil, "shared-key"), supervised))
		if err != nil || parkedA.Outcome != approvalRequired {
			t.Fatalf("A's call: %v %v", parkedA, err)
		}
		callA, approvalA := parkedA.CallId, parkedA.Approval.ApprovalId

		// By id and by key, B finds nothing; A finds its own.
		_, err = c.exec.GetCall(asB, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_CallId{CallId: callA}})
		wantError(t, err, codes.NotFound, "CALL_NOT_FOUND")
		_, err = c.exec.GetCall(asB, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "shared-key"}})
		wantError(t, err, codes.NotFound, "CALL_NOT_FOUND")
		if got, err := c.exec.GetCall(asA, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "shared-key"}}); err != nil || got.Call.CallId != callA {
			t.Fatalf("A's own call by key: %v %v", got, err)
		}
		_, err = c.approvals.GetApproval(asB, &toolsvcv1.GetApprovalRequest{ApprovalId: approvalA})
		wantError(t, err, codes.NotFound, "APPROVAL_NOT_FOUND")
		if got, err := c.approvals.GetApproval(asA, &toolsvcv1.GetApprovalRequest{ApprovalId: approvalA}); err != nil || got.Approval.ApprovalId != approvalA {
			t.Fatalf("A's own approval: %v %v", got, err)
		}

		// B parks a call of its own, under the same key: keys are per
		// principal.
		parkedB, err := c.exec.ExecuteTool(asB, at(req(t, "risk-high", "act", map[string]any{"note": "b"}, "shared-key"), supervised))
		if err != nil || parkedB.Outcome != approvalRequired || parkedB.CallId == callA {
			t.Fatalf("B's call: %v %v", parkedB, err)
		}
		approvalB := parkedB.Approval.ApprovalId

		// B's watch shows B's approval, never A's (which came first).
		select {
		case a := <-seenByB:
			if a.GetApprovalId() != approvalB {
				t.Fatalf("B's watch sent approval %s (A's is %s)", a.GetApprovalId(), approvalA)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("B's watch sent nothing")
		}

		listed := func(ctx context.Context) []string {
			t.Helper()
			resp, err := c.approvals.ListApprovals(ctx, &toolsvcv1.ListApprovalsRequest{PageSize: 1})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for {
				for _, a := range resp.Approvals {
					ids = append(ids, a.ApprovalId)
				}
				if resp.NextPageToken == "" {
					break
				}
				if resp, err = c.approvals.ListApprovals(ctx, &toolsvcv1.ListApprovalsRequest{PageSize: 1, PageToken: resp.NextPageToken}); err != nil {
					t.Fatal(err)
				}
			}
			slices.Sort(ids)
			return ids
		}
		both := []string{approvalA, approvalB}
		slices.Sort(both)
		if got := listed(asB); !slices.Equal(got, []string{approvalB}) {
			t.Fatalf("B lists %v, want only %s", got, approvalB)
		}
		if got := listed(asA); !slices.Equal(got, []string{approvalA}) {
			t.Fatalf("A lists %v", got)
		}
		for _, p := range []string{approver, operator} {
			if got := listed(e.as(ctx, p)); !slices.Equal(got, both) {
				t.Fatalf("%s lists %v, want both", p, got)
			}
		}
		// A page token of B's listing does not page through anyone else's.
		first, err := c.approvals.ListApprovals(e.as(ctx, approver), &toolsvcv1.ListApprovalsRequest{PageSize: 1})
		if err != nil || first.NextPageToken == "" {
			t.Fatalf("approver's first page: %v %v", first, err)
		}
		_, err = c.approvals.ListApprovals(asB, &toolsvcv1.ListApprovalsRequest{PageSize: 1, PageToken: first.NextPageToken})
		wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST")

		// Audit: B reads only its own events, whatever it asks for.
		events := func(ctx context.Context, r *toolsvcv1.ListAuditEventsRequest) []*toolsvcv1.AuditEvent {
			t.Helper()
			resp, err := c.audit.ListAuditEvents(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			return resp.Events
		}
		own := events(asB, &toolsvcv1.ListAuditEventsRequest{})
		if len(own) == 0 {
			t.Fatal("B reads none of its events")
		}
		for _, ev := range own {
			if ev.Principal != agentB {
				t.Fatalf("B read an event of %q", ev.Principal)
			}
		}
		for _, r := range []*toolsvcv1.ListAuditEventsRequest{{Principal: agentA}, {Principal: "AGENT-A"}, {CallId: callA}} {
			if got := events(asB, r); len(got) != 0 {
				t.Fatalf("B read %d of A's events with %v", len(got), r)
			}
		}
		if got := events(asA, &toolsvcv1.ListAuditEventsRequest{CallId: callA}); len(got) == 0 {
			t.Fatal("A cannot read its own call's events")
		}
		if got := events(e.as(ctx, operator), &toolsvcv1.ListAuditEventsRequest{Principal: "Agent-A"}); len(got) == 0 {
			t.Fatal("the operator cannot read A's events (filter in another spelling)")
		}
		// The approver reads its own events only: it has none yet.
		if got := events(e.as(ctx, approver), &toolsvcv1.ListAuditEventsRequest{CallId: callA}); len(got) != 0 {
			t.Fatalf("the approver read %d of A's events", len(got))
		}
	})
}

// TestSelfApproval: the requester of a call may not resolve its approval,
// however its id is spelled. Authentication on: karl, configured as
// " \u212aARL " (a Kelvin sign, which NFC makes a K, capitals, spaces),
// requests and cannot approve with his token. Authentication off: every
// spelling a gRPC header can carry that canonicalises to karl is refused
// SELF_APPROVAL, and one that does not canonicalise is refused before
// anything else. (Headers are printable ASCII; the Unicode spellings —
// NFD, confusables, invisible spaces — reach ids only through the
// configuration, and are tested in package auth and config.)
func TestSelfApproval(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)

		t.Run("authentication on", func(t *testing.T) {
			e := newAuthEnv(t, backend, func(c *config.Config) { c.Principals[4].ID = " \u212aARL " })
			c := clientsOf(e.dial(t, nil))
			resp, err := c.exec.ExecuteTool(e.as(ctx, karl), at(req(t, "risk-high", "act", nil, "self"), supervised))
			if err != nil || resp.Outcome != approvalRequired {
				t.Fatalf("%v %v", resp, err)
			}
			id := resp.Approval.ApprovalId
			if ap, err := e.app.Store().GetApproval(ctx, id); err != nil || ap.Requester != karl {
				t.Fatalf("requester stored as %q (%v), want %q", ap.Requester, err, karl)
			}
			_, err = c.approvals.ResolveApproval(e.as(ctx, karl), &toolsvcv1.ResolveApprovalRequest{ApprovalId: id, Decision: approve})
			wantError(t, err, codes.PermissionDenied, "SELF_APPROVAL")
			if _, err := c.approvals.ResolveApproval(e.as(ctx, approver), &toolsvcv1.ResolveApprovalRequest{ApprovalId: id, Decision: approve}); err != nil {
				t.Fatalf("another approver: %v", err)
			}
		})

		t.Run("authentication off", func(t *testing.T) {
			e := newEnv(t, backend, nil)
			resp := e.park(t, ctx, "karl", at(req(t, "risk-high", "act", nil, "self"), supervised))
			id := resp.Approval.ApprovalId
			for name, spelling := range map[string]string{
				"same":              "karl",
				"capitals":          "KARL",
				"mixed case":        "Karl",
				"surrounding space": "  karl ",
			} {
				_, err := e.resolve(ctx, spelling, id, approve, "")
				if err == nil {
					t.Fatalf("%s (%q) approved its own call", name, spelling)
				}
				wantError(t, err, codes.PermissionDenied, "SELF_APPROVAL")
			}
			for name, spelling := range map[string]string{
				"inner space":  "ka rl",
				"separator":    "karl/",
				"punctuation":  "karl!",
				"percent-form": "k%C3%A1rl",
			} {
				_, err := e.resolve(ctx, spelling, id, approve, "")
				r := wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
				if r.info.Metadata[auth.CauseKey] != string(auth.CauseBadPrincipalHeader) {
					t.Fatalf("%s: %v", name, r.info)
				}
			}
			if a := e.storedApproval(t, ctx, id); a.State != store.ApprovalPending {
				t.Fatalf("approval is %s", a.State)
			}
			if _, err := e.resolve(ctx, "someone-else", id, approve, ""); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// TestPrincipalLimits: calls per second with a burst and concurrent
// executions, per principal, refused RESOURCE_EXHAUSTED with RetryInfo and
// their own reasons, audited (throttled per principal).
func TestPrincipalLimits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		rate, burst := 0.5, 3
		one := 1
		e := newAuthEnv(t, backend, func(c *config.Config) {
			c.PrincipalLimits = config.LimitsConfig{CallsPerSecond: rate, Burst: burst, ConcurrentExecutions: 4}
			c.Principals[1].Limits = &config.PrincipalLimitsConfig{ConcurrentExecutions: &one, CallsPerSecond: new(float64)}
			c.Auth.FailureAudit = config.FailureAuditConfig{PerSourcePerMinute: 2}
		})
		ctx := testCtx(t)
		c := clientsOf(e.dial(t, nil))

		// agent-a: three calls at once, then refused until a token is back.
		for i := range burst {
			if _, err := c.registry.ListTools(e.as(ctx, agentA), &toolsvcv1.ListToolsRequest{}); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
		for range 5 {
			_, err := c.registry.ListTools(e.as(ctx, agentA), &toolsvcv1.ListToolsRequest{})
			r := wantError(t, err, codes.ResourceExhausted, "PRINCIPAL_RATE_LIMITED")
			if d := r.retryDelay(t); d <= 0 || d > 2*time.Second {
				t.Fatalf("retry after %s", d)
			}
		}
		// Streams count as calls too; other principals are not affected.
		stream, err := c.health.WatchToolHealth(e.as(ctx, agentA), &toolsvcv1.WatchToolHealthRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		wantError(t, err, codes.ResourceExhausted, "PRINCIPAL_RATE_LIMITED")
		if _, err := c.registry.ListTools(e.as(ctx, operator), &toolsvcv1.ListToolsRequest{}); err != nil {
			t.Fatalf("operator: %v", err)
		}
		e.clock.Advance(2 * time.Second)
		if _, err := c.registry.ListTools(e.as(ctx, agentA), &toolsvcv1.ListToolsRequest{}); err != nil {
			t.Fatalf("after the refill: %v", err)
		}

		// Audited, two per minute for the principal; the next one counts
		// those left out.
		limited := func() []*store.AuditEvent {
			var out []*store.AuditEvent
			for _, ev := range e.refusals(t, ctx) {
				if detail(ev, "reason") == "PRINCIPAL_RATE_LIMITED" {
					out = append(out, ev)
				}
			}
			return out
		}
		if got := limited(); len(got) != 2 || got[0].Principal != agentA {
			t.Fatalf("%d rate-limit rows: %s", len(got), dump(got))
		}
		e.clock.Advance(time.Minute)
		for range burst + 1 {
			c.registry.ListTools(e.as(ctx, agentA), &toolsvcv1.ListToolsRequest{})
		}
		got := limited()
		if len(got) != 3 || detail(got[2], "suppressed") != "4" { // three ListTools and the stream
			t.Fatalf("after a minute: %s", dump(got))
		}

		// agent-b (no rate limit, one execution at a time): a slow call
		// holds its slot.
		slow := make(chan error, 1)
		go func() {
			_, err := c.exec.ExecuteTool(e.as(ctx, agentB), req(t, "risk-low", "act", map[string]any{"delay_ms": 1500}, "slow"))
			slow <- err
		}()
		deadline := time.Now().Add(10 * time.Second)
		for e.tools["risk-low"].runs.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		_, err = c.exec.ExecuteTool(e.as(ctx, agentB), req(t, "risk-low", "act", nil, "second"))
		r := wantError(t, err, codes.ResourceExhausted, "TOO_MANY_EXECUTIONS")
		if r.retryDelay(t) <= 0 || r.info.Metadata["concurrent_executions"] != "1" {
			t.Fatalf("%v", r.info)
		}
		// Reads do not take an execution slot.
		if _, err := c.exec.GetCall(e.as(ctx, agentB), &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "slow"}}); err != nil {
			t.Fatalf("GetCall during an execution: %v", err)
		}
		if err := <-slow; err != nil {
			t.Fatal(err)
		}
		if _, err := c.exec.ExecuteTool(e.as(ctx, agentB), req(t, "risk-low", "act", nil, "second")); err != nil {
			t.Fatalf("after the slow call: %v", err)
		}
		// The refused call was never reserved: nothing is stored under its
		// key but the later success, and its rejection is audited.
		rejected := 0
		for _, ev := range e.refusals(t, ctx) {
			if ev.Type == "tool_call.rejected" && detail(ev, "reason") == "TOO_MANY_EXECUTIONS" && ev.Principal == agentB && ev.Tool == "risk-low" {
				rejected++
			}
		}
		if rejected != 1 {
			t.Fatalf("%d TOO_MANY_EXECUTIONS rows", rejected)
		}
		if runs := e.tools["risk-low"].runs.Load(); runs != 2 {
			t.Fatalf("the tool ran %d times, want 2", runs)
		}
	})
}

// TestPrincipalLimitsArePerReplica: two replicas on one database each admit
// a principal's whole burst — the limits are per replica (README).
func TestPrincipalLimitsArePerReplica(t *testing.T) {
	t.Parallel()
	first := newAuthEnv(t, "postgres", func(c *config.Config) {
		c.PrincipalLimits = config.LimitsConfig{CallsPerSecond: 0.01, Burst: 2}
	})
	tokens := first.tokens
	second := newAuthEnv(t, "postgres", func(c *config.Config) {
		c.DatabaseURL = first.app.Config().DatabaseURL
		c.PrincipalLimits = config.LimitsConfig{CallsPerSecond: 0.01, Burst: 2}
		for i := range c.Principals {
			c.Principals[i].TokenSHA256 = auth.HashToken(tokens[[]string{agentA, agentB, approver, operator, karl}[i]]).String()
		}
	})
	second.tokens = tokens
	ctx := testCtx(t)
	admitted := 0
	for _, e := range []*authEnv{first, second} {
		c := clientsOf(e.dial(t, nil))
		for range 3 {
			if _, err := c.registry.ListTools(e.as(ctx, agentA), &toolsvcv1.ListToolsRequest{}); err == nil {
				admitted++
			} else {
				wantError(t, err, codes.ResourceExhausted, "PRINCIPAL_RATE_LIMITED")
			}
		}
	}
	if admitted != 4 {
		t.Fatalf("%d calls admitted by two replicas with a burst of 2 each, want 4", admitted)
	}
}

// TestFailedAuthenticationThrottled: failed authentication from one peer is
// audited at most per_source_per_minute times a minute; the answer stays
// UNAUTHENTICATED, and the next audited failure counts those left out.
func TestFailedAuthenticationThrottled(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newAuthEnv(t, backend, func(c *config.Config) {
			c.Auth.FailureAudit = config.FailureAuditConfig{PerSourcePerMinute: 3, PerMinute: 100}
		})
		ctx := testCtx(t)
		c := clientsOf(e.dial(t, nil))
		for range 50 {
			_, err := c.registry.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
			wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
		}
		if got := e.refusals(t, ctx); len(got) != 3 {
			t.Fatalf("%d rows for 50 failures, want 3", len(got))
		}
		// An authenticated principal is not held back by its peer's failures.
		if _, err := c.registry.ListTools(e.as(ctx, agentA), &toolsvcv1.ListToolsRequest{}); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Minute)
		_, err := c.registry.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
		wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
		got := e.refusals(t, ctx)
		if len(got) != 4 || detail(got[3], "suppressed") != "47" || detail(got[3], "peer") != "127.0.0.1" {
			t.Fatalf("after a minute: %s", dump(got))
		}
	})
}

// TestRevokedToken: a token removed from the configuration stops working at
// the next start; what it did stays in the trail.
func TestRevokedToken(t *testing.T) {
	t.Parallel()
	first := newAuthEnv(t, "postgres", nil)
	ctx := testCtx(t)
	c := clientsOf(first.dial(t, nil))
	if _, err := c.exec.ExecuteTool(first.as(ctx, agentB), req(t, "risk-low", "act", nil, "before")); err != nil {
		t.Fatal(err)
	}
	second := newAuthEnv(t, "postgres", func(c *config.Config) {
		c.DatabaseURL = first.app.Config().DatabaseURL
		c.Principals = slices.DeleteFunc(c.Principals, func(p config.PrincipalConfig) bool { return p.ID == agentB })
	})
	second.tokens[agentB] = first.tokens[agentB]
	_, err := clientsOf(second.dial(t, nil)).exec.GetCall(second.as(ctx, agentB), &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "before"}})
	r := wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
	if r.info.Metadata[auth.CauseKey] != string(auth.CauseUnknownToken) {
		t.Fatal(r.info)
	}
	if evs, err := second.app.Store().ListAuditEvents(ctx, store.AuditFilter{Principal: agentB}); err != nil || len(evs) == 0 {
		t.Fatalf("the revoked principal's trail: %v %v", evs, err)
	}
}

// TestClosedHealthAndReflection: with auth.public_health and
// auth.public_reflection off, health checks and reflection need the
// credentials of some principal (any role).
func TestClosedHealthAndReflection(t *testing.T) {
	t.Parallel()
	e := newAuthEnv(t, "memory", func(c *config.Config) {
		c.Auth.PublicHealth, c.Auth.PublicReflection = false, false
	})
	ctx := testCtx(t)
	conn := e.dial(t, nil)
	hc := healthpb.NewHealthClient(conn)
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
	if _, err := hc.Check(e.as(ctx, approver), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health with an approver's token: %v", err)
	}
	reflect := func(ctx context.Context) error {
		s, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	wantError(t, reflect(ctx), codes.Unauthenticated, "UNAUTHENTICATED")
	if err := reflect(e.as(ctx, agentB)); err != nil {
		t.Fatalf("reflection with an agent's token: %v", err)
	}
}
