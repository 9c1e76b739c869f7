package e2e_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// restricted configures principals with one role each: two agents and an
// operator (unconfigured ids are development principals with every role).
func restricted(c *config.Config) {
	c.Principals = []config.PrincipalConfig{
		{ID: "agent-only", Roles: []string{"agent"}, Scopes: []string{"*"}},
		{ID: "agent-2", Roles: []string{"agent"}, Scopes: []string{"*"}},
		{ID: "oncall", Roles: []string{"operator"}},
	}
}

func byID(id string) *toolsvcv1.GetCallRequest {
	return &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_CallId{CallId: id}}
}

func byKey(key string) *toolsvcv1.GetCallRequest {
	return &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: key}}
}

// TestCalls: GetCall by id and by key, visible to its agent and operators
// only; ResolveCall settling UNKNOWN calls and nothing else.
func TestCalls(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, restricted)
		ctx := testCtx(t)

		t.Run("GetCall by id and by key", func(t *testing.T) {
			const p = "agent-only"
			r := at(req(t, "echo", "echo", map[string]any{"message": "hi"}, "k-get"), autonomous)
			r.Context.TraceId, r.Context.TaskId, r.Context.StepId = "trace-1", "task-1", "step-1"
			start := e.clock.Now().Add(-time.Second)
			resp := e.mustCall(t, ctx, p, r, succeeded)

			byIDResp, err := e.exec.GetCall(apptest.As(ctx, p), byID(resp.CallId))
			if err != nil {
				t.Fatal(err)
			}
			c := byIDResp.Call
			if c.CallId != resp.CallId || c.Principal != p || c.IdempotencyKey != "k-get" || c.Tool != "echo" || c.Action != "echo" ||
				c.ToolVersion != 1 || c.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || len(c.ArgumentsFingerprint) != 64 ||
				c.TraceId != "trace-1" || c.TaskId != "task-1" || c.StepId != "step-1" ||
				c.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_LOW || c.GateDecision != toolsvcv1.GateDecision_GATE_DECISION_ALLOW ||
				c.Result.GetMessage() != "echo: hi" || !c.Result.Success || c.AttemptCount != 1 || c.LeaseExpireTime != nil ||
				c.CreateTime.AsTime().Before(start) || c.ExpireTime.AsTime().Sub(c.UpdateTime.AsTime()) != 24*time.Hour {
				t.Fatalf("GetCall %v", c)
			}
			byKeyResp, err := e.exec.GetCall(apptest.As(ctx, p), byKey("k-get"))
			if err != nil || byKeyResp.Call.CallId != resp.CallId {
				t.Fatalf("by key: %v, %v", byKeyResp, err)
			}
			// Another agent sees neither, not even that it exists.
			_, err = e.exec.GetCall(apptest.As(ctx, "agent-2"), byID(resp.CallId))
			wantError(t, err, codes.NotFound, "CALL_NOT_FOUND")
			_, err = e.exec.GetCall(apptest.As(ctx, "agent-2"), byKey("k-get"))
			wantError(t, err, codes.NotFound, "CALL_NOT_FOUND")
			// An operator sees any call by id.
			op, err := e.exec.GetCall(apptest.As(ctx, "oncall"), byID(resp.CallId))
			if err != nil || op.Call.CallId != resp.CallId || op.Call.Principal != p {
				t.Fatalf("operator: %v, %v", op, err)
			}
			_, err = e.exec.GetCall(apptest.As(ctx, p), byID("no-such-call"))
			wantError(t, err, codes.NotFound, "CALL_NOT_FOUND")
			_, err = e.exec.GetCall(apptest.As(ctx, p), &toolsvcv1.GetCallRequest{})
			if r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST"); !slices.Equal(r.fields(), []string{"selector"}) {
				t.Fatalf("fields %v", r.fields())
			}
		})

		t.Run("GetCall shows a call in progress and a parked call", func(t *testing.T) {
			const p = "agent-only"
			done := make(chan error, 1)
			go func() {
				_, err := e.call(ctx, p, req(t, "flaky", "run", map[string]any{"mode": "ok", "delay_ms": 1000}, "k-running"))
				done <- err
			}()
			var c *toolsvcv1.Call
			testutil.Eventually(t, 15*time.Second, "the call to run", func() bool {
				got, err := e.exec.GetCall(apptest.As(ctx, p), byKey("k-running"))
				c = got.GetCall()
				return err == nil && c.State == toolsvcv1.CallState_CALL_STATE_IN_PROGRESS
			})
			if c.LeaseExpireTime == nil || !c.LeaseExpireTime.AsTime().After(e.clock.Now()) || c.Result != nil {
				t.Fatalf("running call %v", c)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			parked := e.park(t, ctx, p, at(req(t, "risk-high", "act", nil, "k-parked"), supervised))
			got, err := e.exec.GetCall(apptest.As(ctx, p), byKey("k-parked"))
			if err != nil || got.Call.State != toolsvcv1.CallState_CALL_STATE_AWAITING_APPROVAL ||
				got.Call.ApprovalId != parked.Approval.ApprovalId || got.Call.AttemptCount != 0 {
				t.Fatalf("parked call %v, %v", got, err)
			}
		})

		t.Run("ResolveCall settles an UNKNOWN call", func(t *testing.T) {
			const p = "agent-only"
			before := e.flaky.Executions()
			args := map[string]any{"mode": "unknown", "note": "charge"}
			resp := e.mustCall(t, ctx, p, req(t, "flaky", "run", args, "k-unknown"), unknown)
			// Only operators resolve.
			_, err := e.exec.ResolveCall(apptest.As(ctx, p), &toolsvcv1.ResolveCallRequest{
				CallId: resp.CallId, Outcome: succeeded, Comment: "I am sure"})
			wantError(t, err, codes.PermissionDenied, "ROLE_REQUIRED")
			// A comment and a final outcome are required.
			_, err = e.exec.ResolveCall(apptest.As(ctx, "oncall"), &toolsvcv1.ResolveCallRequest{CallId: resp.CallId, Outcome: succeeded, Comment: "  "})
			if r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST"); !slices.Equal(r.fields(), []string{"comment"}) {
				t.Fatalf("fields %v", r.fields())
			}
			_, err = e.exec.ResolveCall(apptest.As(ctx, "oncall"), &toolsvcv1.ResolveCallRequest{CallId: resp.CallId, Outcome: unknown, Comment: "x"})
			if r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST"); !slices.Equal(r.fields(), []string{"outcome"}) {
				t.Fatalf("fields %v", r.fields())
			}
			if c := e.storedCall(t, ctx, p, "k-unknown"); c.State != store.CallUnknown {
				t.Fatalf("refused resolutions changed the call: %+v", c)
			}

			res, err := e.exec.ResolveCall(apptest.As(ctx, "oncall"), &toolsvcv1.ResolveCallRequest{
				CallId: resp.CallId, Outcome: succeeded, Comment: "the charge is in the upstream ledger"})
			if err != nil {
				t.Fatal(err)
			}
			const msg = "Resolved by operator oncall as SUCCEEDED: the charge is in the upstream ledger"
			c := res.Call
			if c.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || c.ResolvedBy != "oncall" ||
				c.ResolutionComment != "the charge is in the upstream ledger" || !c.Result.Success || c.Result.Message != msg {
				t.Fatalf("resolved %v", c)
			}
			// The agent's retry replays the resolution; the tool never runs again.
			replay := e.mustCall(t, ctx, p, req(t, "flaky", "run", args, "k-unknown"), succeeded)
			if !replay.Deduped || replay.Result.Message != msg {
				t.Fatalf("replay %v", replay)
			}
			if n := e.flaky.Executions() - before; n != 1 {
				t.Fatalf("flaky ran %d times", n)
			}
			sc := e.storedCall(t, ctx, p, "k-unknown")
			if sc.State != store.CallSucceeded || sc.ResolvedBy != "oncall" {
				t.Fatalf("stored %+v", sc)
			}
			evs := e.wantCallEvents(t, ctx, resp.CallId, "tool_call.attempted", "tool_call.unknown", "health.changed",
				"tool_call.resolved", "tool_call.deduped")
			if evs[3].Principal != "oncall" || evs[3].Outcome != store.OutcomeSucceeded {
				t.Fatalf("tool_call.resolved %+v", evs[3])
			}
			wantDetail(t, evs[3], "comment", "the charge is in the upstream ledger")
			wantDetail(t, evs[3], "requester", p)

			// Resolved once: not again.
			_, err = e.exec.ResolveCall(apptest.As(ctx, "oncall"), &toolsvcv1.ResolveCallRequest{
				CallId: resp.CallId, Outcome: failed, Comment: "second thoughts"})
			if r := wantError(t, err, codes.FailedPrecondition, "CALL_NOT_UNKNOWN"); r.info.Metadata["state"] != "SUCCEEDED" {
				t.Fatalf("metadata %v", r.info.Metadata)
			}

			// Another UNKNOWN call, resolved as FAILED.
			other := e.mustCall(t, ctx, p, req(t, "flaky", "run", map[string]any{"mode": "unknown", "note": "refund"}, "k-unknown-2"), unknown)
			res, err = e.exec.ResolveCall(apptest.As(ctx, "oncall"), &toolsvcv1.ResolveCallRequest{
				CallId: other.CallId, Outcome: failed, Comment: "no trace upstream"})
			if err != nil || res.Call.State != toolsvcv1.CallState_CALL_STATE_FAILED || res.Call.Result.Success {
				t.Fatalf("resolve as failed: %v, %v", res, err)
			}
			e.mustCall(t, ctx, p, req(t, "flaky", "run", map[string]any{"mode": "unknown", "note": "refund"}, "k-unknown-2"), failed)
		})

		t.Run("ResolveCall refuses calls that are not UNKNOWN", func(t *testing.T) {
			const p = "agent-only"
			ok := e.mustCall(t, ctx, p, req(t, "echo", "echo", map[string]any{"message": "fine"}, "k-fine"), succeeded)
			bad := e.mustCall(t, ctx, p, req(t, "flaky", "run", map[string]any{"mode": "fail"}, "k-bad"), failed)
			parked := e.park(t, ctx, p, at(req(t, "risk-critical", "act", nil, "k-wait"), supervised))
			for _, row := range []struct{ id, state string }{
				{ok.CallId, "SUCCEEDED"}, {bad.CallId, "FAILED"}, {parked.CallId, "AWAITING_APPROVAL"},
			} {
				before := types(e.events(t, ctx, store.AuditFilter{CallID: row.id}))
				_, err := e.exec.ResolveCall(apptest.As(ctx, "oncall"), &toolsvcv1.ResolveCallRequest{
					CallId: row.id, Outcome: failed, Comment: "nope"})
				if r := wantError(t, err, codes.FailedPrecondition, "CALL_NOT_UNKNOWN"); r.info.Metadata["state"] != row.state {
					t.Fatalf("metadata %v, want state %s", r.info.Metadata, row.state)
				}
				// Refused: no tool_call.resolved, nothing else either.
				e.wantCallEvents(t, ctx, row.id, before...)
			}
			if c := e.storedCall(t, ctx, p, "k-fine"); c.State != store.CallSucceeded || c.ResolvedBy != "" {
				t.Fatalf("stored %+v", c)
			}
			_, err := e.exec.ResolveCall(apptest.As(ctx, "oncall"), &toolsvcv1.ResolveCallRequest{
				CallId: "no-such-call", Outcome: failed, Comment: "nope"})
			wantError(t, err, codes.NotFound, "CALL_NOT_FOUND")
		})
	})
}

// TestAuditEvents: ListAuditEvents filters and pages through the trail.
func TestAuditEvents(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, restricted)
		ctx := testCtx(t)
		ops := apptest.As(ctx, "oncall")

		// Morning: three echo calls and a gate denial by "audited" in one
		// task and trace; one echo call by "audited-2".
		var calls []string
		for _, key := range []string{"k1", "k2", "k3"} {
			r := req(t, "echo", "echo", map[string]any{"message": key}, key)
			r.Context.TraceId, r.Context.TaskId = "trace-a", "task-a"
			calls = append(calls, e.mustCall(t, ctx, "audited", r, succeeded).CallId)
		}
		e.mustCall(t, ctx, "audited", at(req(t, "risk-medium", "act", nil, "k4"), readOnly), denied)
		e.mustCall(t, ctx, "audited-2", req(t, "echo", "echo", map[string]any{"message": "x"}, "k1"), succeeded)
		// Afternoon: one more.
		e.clock.Advance(6 * time.Hour)
		noon := e.clock.Now().Add(-time.Hour)
		late := e.mustCall(t, ctx, "audited", req(t, "echo", "echo", map[string]any{"message": "late"}, "k5"), succeeded)

		list := func(r *toolsvcv1.ListAuditEventsRequest) []*toolsvcv1.AuditEvent {
			t.Helper()
			var all []*toolsvcv1.AuditEvent
			for page := 0; ; page++ {
				resp, err := e.audit.ListAuditEvents(ops, r)
				if err != nil {
					t.Fatal(err)
				}
				if r.PageSize > 0 && len(resp.Events) > int(r.PageSize) {
					t.Fatalf("page of %d, size %d", len(resp.Events), r.PageSize)
				}
				all = append(all, resp.Events...)
				if resp.NextPageToken == "" {
					return all
				}
				if page > 50 {
					t.Fatal("pagination does not end")
				}
				r.PageToken = resp.NextPageToken
			}
		}
		summary := func(evs []*toolsvcv1.AuditEvent) []string {
			var out []string
			for i, ev := range evs {
				if i > 0 && ev.Sequence <= evs[i-1].Sequence {
					t.Fatalf("events out of order: %d after %d", ev.Sequence, evs[i-1].Sequence)
				}
				out = append(out, ev.Type+"@"+ev.Principal)
			}
			return out
		}
		ok := func(p string) []string {
			return []string{"tool_call.attempted@" + p, "tool_call.succeeded@" + p}
		}
		cat := func(parts ...[]string) []string {
			var out []string
			for _, p := range parts {
				out = append(out, p...)
			}
			return out
		}
		all := cat(ok("audited"), ok("audited"), ok("audited"), []string{"gate.denied@audited"}, ok("audited-2"), ok("audited"))
		for _, row := range []struct {
			name string
			req  *toolsvcv1.ListAuditEventsRequest
			want []string
		}{
			{"one principal, by 3", &toolsvcv1.ListAuditEventsRequest{Principal: "audited", PageSize: 3},
				cat(ok("audited"), ok("audited"), ok("audited"), []string{"gate.denied@audited"}, ok("audited"))},
			{"a tool, by 1", &toolsvcv1.ListAuditEventsRequest{Tool: "echo", PageSize: 1},
				cat([]string{"tool.registered@toolsvc"}, ok("audited"), ok("audited"), ok("audited"), ok("audited-2"), ok("audited"))},
			{"types", &toolsvcv1.ListAuditEventsRequest{Types: []string{"gate.denied", "tool_call.succeeded"}, Principal: "audited"},
				[]string{"tool_call.succeeded@audited", "tool_call.succeeded@audited", "tool_call.succeeded@audited", "gate.denied@audited", "tool_call.succeeded@audited"}},
			{"one call", &toolsvcv1.ListAuditEventsRequest{CallId: calls[1]}, ok("audited")},
			{"trace", &toolsvcv1.ListAuditEventsRequest{TraceId: "trace-a", PageSize: 4}, cat(ok("audited"), ok("audited"), ok("audited"))},
			{"task and type", &toolsvcv1.ListAuditEventsRequest{TaskId: "task-a", Types: []string{"tool_call.attempted"}},
				[]string{"tool_call.attempted@audited", "tool_call.attempted@audited", "tool_call.attempted@audited"}},
			{"since noon", &toolsvcv1.ListAuditEventsRequest{StartTime: timestamppb.New(noon)}, ok("audited")},
			{"until noon, principal", &toolsvcv1.ListAuditEventsRequest{EndTime: timestamppb.New(noon), Principal: "audited-2"}, ok("audited-2")},
			{"nothing", &toolsvcv1.ListAuditEventsRequest{Principal: "nobody"}, nil},
		} {
			t.Run(row.name, func(t *testing.T) {
				got := list(row.req)
				if s := summary(got); !slices.Equal(s, row.want) {
					t.Fatalf("got  %v\nwant %v", s, row.want)
				}
			})
		}
		// Everything the two agents did, through the tool-less filter of
		// principal, matches the whole list in order.
		var both []*toolsvcv1.AuditEvent
		for _, ev := range list(&toolsvcv1.ListAuditEventsRequest{PageSize: 2}) {
			if strings.HasPrefix(ev.Principal, "audited") {
				both = append(both, ev)
			}
		}
		if s := summary(both); !slices.Equal(s, all) {
			t.Fatalf("whole trail:\n got  %v\n want %v", s, all)
		}

		// The event as the API shows it.
		evs := list(&toolsvcv1.ListAuditEventsRequest{CallId: late.CallId, Types: []string{"tool_call.succeeded"}})
		if len(evs) != 1 {
			t.Fatalf("%d events", len(evs))
		}
		ev := evs[0]
		if ev.EventId == "" || ev.Tool != "echo" || ev.Action != "echo" || ev.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_LOW ||
			ev.GateDecision != toolsvcv1.GateDecision_GATE_DECISION_ALLOW || ev.Outcome != succeeded ||
			ev.Detail.Fields["message"].GetStringValue() != "echo: late" || ev.Time.AsTime().Before(noon) {
			t.Fatalf("event %v", ev)
		}

		// Arguments and results reach the trail only for tools that allow it.
		withPayload := list(&toolsvcv1.ListAuditEventsRequest{CallId: late.CallId})
		if withPayload[0].Detail.Fields["arguments"].GetStructValue().Fields["message"].GetStringValue() != "late" ||
			withPayload[1].Detail.Fields["value"].GetStructValue().Fields["message"].GetStringValue() != "late" {
			t.Fatalf("echo events %v", withPayload)
		}
		quiet := e.mustCall(t, ctx, "audited-3", req(t, "spare", "act", map[string]any{"note": "private"}, "k-quiet"), succeeded)
		for _, ev := range list(&toolsvcv1.ListAuditEventsRequest{CallId: quiet.CallId}) {
			if _, ok := ev.Detail.Fields["arguments"]; ok {
				t.Fatalf("%s carries the arguments of a tool without audit payloads: %v", ev.Type, ev.Detail)
			}
			if _, ok := ev.Detail.Fields["value"]; ok {
				t.Fatalf("%s carries the result of a tool without audit payloads: %v", ev.Type, ev.Detail)
			}
			if strings.Contains(ev.Detail.String(), "private") {
				t.Fatalf("%s quotes the arguments: %v", ev.Type, ev.Detail)
			}
		}

		// Bad requests.
		first, err := e.audit.ListAuditEvents(ops, &toolsvcv1.ListAuditEventsRequest{Principal: "audited", PageSize: 1})
		if err != nil || first.NextPageToken == "" {
			t.Fatalf("first page: %v, %v", first, err)
		}
		for _, row := range []struct {
			req   *toolsvcv1.ListAuditEventsRequest
			field string
		}{
			{&toolsvcv1.ListAuditEventsRequest{Principal: "audited-2", PageToken: first.NextPageToken}, "page_token"},
			{&toolsvcv1.ListAuditEventsRequest{PageToken: "garbage"}, "page_token"},
			{&toolsvcv1.ListAuditEventsRequest{StartTime: timestamppb.New(noon), EndTime: timestamppb.New(noon.Add(-time.Minute))}, "end_time"},
			{&toolsvcv1.ListAuditEventsRequest{PageSize: -1}, "page_size"},
			{&toolsvcv1.ListAuditEventsRequest{Types: []string{""}}, "types[0]"},
		} {
			_, err := e.audit.ListAuditEvents(ops, row.req)
			if r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST"); !slices.Equal(r.fields(), []string{row.field}) {
				t.Fatalf("fields %v, want %s", r.fields(), row.field)
			}
		}
		// A principal that is not an operator reads its own events only:
		// agent-only has none, and asking for another's finds none.
		for _, req := range []*toolsvcv1.ListAuditEventsRequest{{}, {Principal: "audited-2"}} {
			resp, err := e.audit.ListAuditEvents(apptest.As(ctx, "agent-only"), req)
			if err != nil || len(resp.Events) != 0 {
				t.Fatalf("agent-only read %v, %v; want no events", resp.GetEvents(), err)
			}
		}
	})
}

// TestToolHealth: Get/List/Watch/SetToolHealth, drain and restore with their
// events, and the circuit a run of tool errors opens.
func TestToolHealth(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, restricted)
		ctx := testCtx(t)
		ops := apptest.As(ctx, "oncall")
		set := func(op toolsvcv1.HealthOperation, reason string) *toolsvcv1.ToolHealth {
			t.Helper()
			resp, err := e.health.SetToolHealth(ops, &toolsvcv1.SetToolHealthRequest{Tool: "spare", Operation: op, Reason: reason})
			if err != nil {
				t.Fatal(err)
			}
			return resp.Health
		}
		get := func(tool string) *toolsvcv1.ToolHealth {
			t.Helper()
			resp, err := e.health.GetToolHealth(apptest.As(ctx, "agent-only"), &toolsvcv1.GetToolHealthRequest{Tool: tool})
			if err != nil {
				t.Fatal(err)
			}
			return resp.Health
		}
		listNames := func(r *toolsvcv1.ListToolHealthRequest) []string {
			t.Helper()
			var names []string
			for page := 0; ; page++ {
				resp, err := e.health.ListToolHealth(ops, r)
				if err != nil {
					t.Fatal(err)
				}
				for _, h := range resp.Health {
					names = append(names, h.Tool)
				}
				if resp.NextPageToken == "" {
					return names
				}
				if page > 50 {
					t.Fatal("pagination does not end")
				}
				r.PageToken = resp.NextPageToken
			}
		}

		if h := get("spare"); h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY || h.Drained || h.ConsecutiveErrors != 0 {
			t.Fatalf("spare %v", h)
		}
		_, err := e.health.GetToolHealth(ops, &toolsvcv1.GetToolHealthRequest{Tool: "no-such-tool"})
		wantError(t, err, codes.NotFound, "TOOL_NOT_FOUND")
		allTools := listNames(&toolsvcv1.ListToolHealthRequest{})
		if len(allTools) != 19 || !strings.HasPrefix(strings.Join(allTools, ","), "bulk,bulk-pv,clock,echo,flaky,notes,pipeline,release,risk-critical,") {
			t.Fatalf("tools %v", allTools)
		}
		if paged := listNames(&toolsvcv1.ListToolHealthRequest{PageSize: 4}); !slices.Equal(paged, allTools) {
			t.Fatalf("paged %v", paged)
		}

		// Watch spare while it is drained and restored.
		wctx, cancel := context.WithCancel(apptest.As(ctx, "agent-only"))
		defer cancel()
		stream, err := e.health.WatchToolHealth(wctx, &toolsvcv1.WatchToolHealthRequest{Tools: []string{"spare"}})
		if err != nil {
			t.Fatal(err)
		}
		first, err := stream.Recv()
		if err != nil || first.Health.Tool != "spare" || first.Health.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY {
			t.Fatalf("first watch message %v, %v", first, err)
		}

		h := set(toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, "upstream maintenance")
		if h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE || !h.Drained || h.OverrideBy != "oncall" || h.OverrideReason != "upstream maintenance" {
			t.Fatalf("drained %v", h)
		}
		if g := get("spare"); g.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE || !g.Drained {
			t.Fatalf("after drain %v", g)
		}
		if m, err := stream.Recv(); err != nil || m.Health.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE || !m.Health.Drained {
			t.Fatalf("watch after drain %v, %v", m, err)
		}
		if got := listNames(&toolsvcv1.ListToolHealthRequest{Status: toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE}); !slices.Equal(got, []string{"spare"}) {
			t.Fatalf("unavailable tools %v", got)
		}
		set(toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, "upstream maintenance") // no change, no event
		_, err = e.call(ctx, "agent-only", req(t, "spare", "act", nil, "k-drained"))
		wantError(t, err, codes.Unavailable, "TOOL_UNAVAILABLE")

		h = set(toolsvcv1.HealthOperation_HEALTH_OPERATION_RESTORE, "")
		if h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY || h.Drained || h.OverrideBy != "oncall" {
			t.Fatalf("restored %v", h)
		}
		if m, err := stream.Recv(); err != nil || m.Health.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY {
			t.Fatalf("watch after restore %v, %v", m, err)
		}
		set(toolsvcv1.HealthOperation_HEALTH_OPERATION_RESTORE, "") // nothing to clear, no event
		e.mustCall(t, ctx, "agent-only", req(t, "spare", "act", nil, "k-drained"), succeeded)

		evs := e.wantEvents(t, ctx, "oncall", "health.changed", "health.changed")
		wantDetail(t, evs[0], "operation", "drain")
		wantDetail(t, evs[0], "from", "HEALTHY")
		wantDetail(t, evs[0], "to", "UNAVAILABLE")
		wantDetail(t, evs[0], "reason", "upstream maintenance")
		wantDetail(t, evs[1], "operation", "restore")
		wantDetail(t, evs[1], "to", "HEALTHY")
		if evs[0].Tool != "spare" || evs[1].Tool != "spare" {
			t.Fatalf("events name %s and %s", evs[0].Tool, evs[1].Tool)
		}

		// Refusals.
		_, err = e.health.SetToolHealth(apptest.As(ctx, "agent-only"), &toolsvcv1.SetToolHealthRequest{
			Tool: "spare", Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN})
		wantError(t, err, codes.PermissionDenied, "ROLE_REQUIRED")
		_, err = e.health.SetToolHealth(ops, &toolsvcv1.SetToolHealthRequest{Tool: "no-such-tool", Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN})
		wantError(t, err, codes.NotFound, "TOOL_NOT_FOUND")
		_, err = e.health.SetToolHealth(ops, &toolsvcv1.SetToolHealthRequest{Tool: "spare"})
		if r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST"); !slices.Equal(r.fields(), []string{"operation"}) {
			t.Fatalf("fields %v", r.fields())
		}
		e.wantEvents(t, ctx, "oncall", "health.changed", "health.changed")

		// Five tool errors in a row, of two principals' calls, open the
		// circuit: refused with the cool-down as RetryInfo, then one probe
		// after it, which heals.
		const p = "breaker"
		for i := range 5 {
			who := []string{p, "breaker-2"}[i%2]
			e.mustCall(t, ctx, who, req(t, "flaky", "run", map[string]any{"mode": "error", "note": string(rune('a' + i))}, ""), failed)
		}
		fh := get("flaky")
		if fh.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE || fh.ConsecutiveErrors != 5 || fh.CooldownEndTime == nil || fh.Drained {
			t.Fatalf("flaky after 5 errors %v", fh)
		}
		_, err = e.call(ctx, p, req(t, "flaky", "run", map[string]any{"mode": "ok"}, "k-after"))
		r := wantError(t, err, codes.Unavailable, "TOOL_UNAVAILABLE")
		if d := r.retryDelay(t); d <= 25*time.Second || d > 30*time.Second {
			t.Fatalf("retry after %s, want the 30s cool-down", d)
		}
		if n := e.flaky.Executions(); n != 5 {
			t.Fatalf("flaky ran %d times", n)
		}
		changes := e.events(t, ctx, store.AuditFilter{Tool: "flaky", Types: []string{"health.changed"}})
		var statuses []string
		for _, ev := range changes {
			statuses = append(statuses, detail(ev, "to"))
		}
		if !slices.Equal(statuses, []string{"HEALTHY", "HEALTHY", "DEGRADED", "DEGRADED", "UNAVAILABLE"}) {
			t.Fatalf("health changes %v", statuses)
		}
		e.clock.Advance(31 * time.Second)
		e.mustCall(t, ctx, p, req(t, "flaky", "run", map[string]any{"mode": "ok"}, "k-after"), succeeded)
		if fh := get("flaky"); fh.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY || fh.ConsecutiveErrors != 0 {
			t.Fatalf("flaky after the probe %v", fh)
		}
		probe := e.events(t, ctx, store.AuditFilter{Principal: p, Types: []string{"tool_call.attempted"}})
		wantDetail(t, probe[len(probe)-1], "probe", "true")
	})
}

// TestToolHealthLastErrorForOperators: last_error holds a tool error from
// another principal's call; only operators read it. Agents (also those that
// approve) get the record without it, from Get, List and Watch alike.
func TestToolHealthLastErrorForOperators(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *config.Config) {
			restricted(c)
			c.Principals = append(c.Principals,
				config.PrincipalConfig{ID: "agent-approver", Roles: []string{"agent", "approver"}, Scopes: []string{"*"}})
		})
		ctx := testCtx(t)
		const secret = "customer 4711 at 221B Baker Street"
		e.mustCall(t, ctx, "someone-else", req(t, "flaky", "run", map[string]any{"mode": "error", "note": secret}, ""), failed)

		full := func(h *toolsvcv1.ToolHealth) {
			t.Helper()
			if !strings.Contains(h.LastError, secret) || h.LastErrorTime == nil || h.ConsecutiveErrors != 1 {
				t.Fatalf("operator's view %v", h)
			}
		}
		withheld := func(h *toolsvcv1.ToolHealth) {
			t.Helper()
			if h.LastError != "" || h.LastErrorTime == nil || h.ConsecutiveErrors != 1 || h.Tool != "flaky" ||
				h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY {
				t.Fatalf("non-operator's view %v", h)
			}
		}
		get := func(principal string) *toolsvcv1.ToolHealth {
			t.Helper()
			resp, err := e.health.GetToolHealth(apptest.As(ctx, principal), &toolsvcv1.GetToolHealthRequest{Tool: "flaky"})
			if err != nil {
				t.Fatal(err)
			}
			return resp.Health
		}
		list := func(principal string) *toolsvcv1.ToolHealth {
			t.Helper()
			resp, err := e.health.ListToolHealth(apptest.As(ctx, principal), &toolsvcv1.ListToolHealthRequest{})
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range resp.Health {
				if h.Tool == "flaky" {
					return h
				}
			}
			t.Fatalf("flaky not listed for %s", principal)
			return nil
		}
		watch := func(principal string) *toolsvcv1.ToolHealth {
			t.Helper()
			wctx, cancel := context.WithCancel(apptest.As(ctx, principal))
			defer cancel()
			stream, err := e.health.WatchToolHealth(wctx, &toolsvcv1.WatchToolHealthRequest{Tools: []string{"flaky"}})
			if err != nil {
				t.Fatal(err)
			}
			m, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			return m.Health
		}
		for _, view := range []func(string) *toolsvcv1.ToolHealth{get, list, watch} {
			full(view("oncall"))
			full(view("dev")) // a development principal holds every role, operator included
			withheld(view("agent-only"))
			withheld(view("agent-approver"))
		}
	})
}
