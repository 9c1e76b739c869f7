package e2e_test

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

var updateExports = flag.Bool("update-exports", false, "rewrite testdata/exports from what ExportTools answers")

// buildMCPDemo builds cmd/toolsvc-mcp-demo, a real MCP server, into dir.
func buildMCPDemo(t *testing.T, dir string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(dir, "toolsvc-mcp-demo")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/toolsvc-mcp-demo")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build toolsvc-mcp-demo: %v\n%s", err, out)
	}
	return bin
}

// exportsFile is the tools file of the export tests: toolsvc-mcp-demo as an
// MCP connector over stdio, a toolset with guidance, and a tool with
// guidance on its actions.
func exportsFile(t *testing.T, dir, mcpDemo string) string {
	t.Helper()
	path := filepath.Join(dir, "tools.yaml")
	doc := `connectors:
  - id: notebook
    type: mcp
    command: [` + mcpDemo + `]
    guidance: Notes of the shared notebook, by title.
    actions:
      - name: delete_note
        guidance: Only delete a note the user named.
toolsets:
  - name: writing
    title: Writing notes
    guidance: |
      Notes live in two places: notes (by path) and the notebook (by title).
      Prefer notes for anything longer than a line.
    tools: [notes, notebook.add_note, notebook.list_notes, echo]
`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startExports serves the demo tools and exportsFile on backend.
func startExports(t *testing.T, backend, toolsFile string) (*grpc.ClientConn, *app.App) {
	t.Helper()
	cfg := apptest.Config(t, backend)
	cfg.ToolsFile = toolsFile
	cfg.Principals = []config.PrincipalConfig{
		{ID: "writer", Roles: []string{"agent"}, Scopes: []string{"notes"}},
		{ID: "approver-1", Roles: []string{"approver"}},
	}
	return apptest.Start(t, cfg, app.Options{})
}

var goldenFormats = []struct {
	file   string
	format toolsvcv1.ExportFormat
	strict bool
}{
	{"openai-chat.json", toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_CHAT, false},
	{"openai-chat.strict.json", toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_CHAT, true},
	{"openai-responses.json", toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_RESPONSES, false},
	{"openai-responses.strict.json", toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_RESPONSES, true},
	{"anthropic.json", toolsvcv1.ExportFormat_EXPORT_FORMAT_ANTHROPIC, false},
	{"anthropic.strict.json", toolsvcv1.ExportFormat_EXPORT_FORMAT_ANTHROPIC, true},
	{"mcp.json", toolsvcv1.ExportFormat_EXPORT_FORMAT_MCP, false},
	{"mcp.strict.json", toolsvcv1.ExportFormat_EXPORT_FORMAT_MCP, true},
	{"guidance.md", toolsvcv1.ExportFormat_EXPORT_FORMAT_GUIDANCE, false},
}

// The exports of the demo tools and of a real MCP server (toolsvc-mcp-demo,
// discovered over stdio) are the golden files, byte for byte, on either
// store: identical state, identical bytes.
func TestExportGoldens(t *testing.T) {
	dir := t.TempDir()
	toolsFile := exportsFile(t, dir, buildMCPDemo(t, dir))
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		conn, _ := startExports(t, backend, toolsFile)
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		for _, g := range goldenFormats {
			resp, err := reg.ExportTools(apptest.As(ctx, "dev"), &toolsvcv1.ExportToolsRequest{Format: g.format, Strict: g.strict})
			if err != nil {
				t.Fatalf("%s: %v", g.file, err)
			}
			got := resp.GetToolsJson() + "\n"
			if g.format == toolsvcv1.ExportFormat_EXPORT_FORMAT_GUIDANCE {
				got = resp.GetGuidanceMarkdown()
			} else {
				var parsed []map[string]any
				if err := json.Unmarshal([]byte(resp.GetToolsJson()), &parsed); err != nil || len(parsed) != 15 {
					t.Fatalf("%s: not an array of 15 definitions: %v", g.file, err)
				}
			}
			if len(resp.GetOmitted()) != 0 || len(resp.GetWarnings()) != 0 {
				t.Errorf("%s: omitted %v, warnings %v", g.file, resp.GetOmitted(), resp.GetWarnings())
			}
			path := filepath.Join("testdata", "exports", g.file)
			if *updateExports && backend == apptest.Memory {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update-exports to write it)", err)
			}
			if got != string(want) {
				t.Errorf("%s on %s differs from the golden file (run with -update-exports after checking the change):\n got: %.600s\nwant: %.600s", g.file, backend, got, want)
			}
		}
	})
}

// A strict export's examples are what a model writes against the strict
// form (null for each optional property): called by exported name, each
// one passes the registered schema (the nulls dropped) and runs.
func TestStrictRoundTrip(t *testing.T) {
	dir := t.TempDir()
	toolsFile := exportsFile(t, dir, buildMCPDemo(t, dir))
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := apptest.As(testCtx(t), "writer")
		conn, _ := startExports(t, backend, toolsFile)
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		resp, err := reg.ExportTools(ctx, &toolsvcv1.ExportToolsRequest{Format: toolsvcv1.ExportFormat_EXPORT_FORMAT_ANTHROPIC, Strict: true})
		if err != nil {
			t.Fatal(err)
		}
		// writer holds scope notes: the tools without scopes and notes.
		var names []string
		calls := 0
		for _, e := range resp.GetTools() {
			names = append(names, e.GetName())
			var def struct {
				InputExamples []json.RawMessage `json:"input_examples"`
			}
			if err := json.Unmarshal([]byte(e.GetDefinitionJson()), &def); err != nil {
				t.Fatal(err)
			}
			for i, ex := range def.InputExamples {
				if e.GetTool() == "notes" && e.GetAction() != "list" {
					continue // reads and writes of paths that do not exist yet
				}
				calls++
				r, err := exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{
					Tool: e.GetName(), ArgumentsJson: string(ex),
					Context: &toolsvcv1.CallContext{IdempotencyKey: e.GetName() + "-" + string(rune('a'+i))},
				})
				if err != nil {
					t.Fatalf("%s %s: %v", e.GetName(), ex, err)
				}
				if r.GetOutcome() != succeeded && r.GetOutcome() != approvalRequired && r.GetOutcome() != previewRequired {
					t.Errorf("%s %s: %v %q", e.GetName(), ex, r.GetOutcome(), r.GetResult().GetMessage())
				}
			}
		}
		if got := strings.Join(names, ","); got != "clock__now,echo,notebook__add_note,notebook__delete_note,notebook__list_notes,notebook__read_note,notes__list,notes__read,notes__write,notes__delete" {
			t.Fatalf("writer's export: %s", got)
		}
		if calls < 4 {
			t.Fatalf("only %d examples called", calls)
		}

		// The model-style call and the plain one are the same call: the
		// nulls are dropped before the fingerprint.
		first, err := exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{Tool: "echo",
			ArgumentsJson: `{"message":"same <call> ü","uppercase":null}`, Context: &toolsvcv1.CallContext{IdempotencyKey: "same"}})
		if err != nil || first.GetOutcome() != succeeded || first.GetResult().GetMessage() != "echo: same <call> ü" {
			t.Fatalf("by exported name: %v %v", first, err)
		}
		again, err := exec.ExecuteTool(ctx, req(t, "echo", "echo", map[string]any{"message": "same <call> ü"}, "same"))
		if err != nil || !again.GetDeduped() || again.GetCallId() != first.GetCallId() {
			t.Fatalf("by tool and action: %v %v", again, err)
		}
		// A null for a required property is not dropped: the model is told.
		bad, err := exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{Tool: "echo", ArgumentsJson: `{"message":null,"uppercase":null}`})
		if err != nil || bad.GetOutcome() != failed || !strings.Contains(bad.GetResult().GetMessage(), `argument "message": must be a string, got null`) {
			t.Fatalf("null for a required property: %v %v", bad, err)
		}
		// A parked call by exported name: the approval holds the arguments
		// without the nulls, and the tool and action it stands for.
		parked, err := exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{Tool: "notebook__delete_note",
			ArgumentsJson: `{"title":"welcome"}`, Context: &toolsvcv1.CallContext{IdempotencyKey: "del"}})
		if err != nil || parked.GetOutcome() != approvalRequired || parked.GetApproval().GetTool() != "notebook" || parked.GetApproval().GetAction() != "delete_note" {
			t.Fatalf("parked: %v %v", parked, err)
		}
	})
}

// Names that are not exported names are refused as before; an exported
// name's call is audited under the tool and action it stands for.
func TestCallByExportedName(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := apptest.As(testCtx(t), "dev")
		conn, a := apptest.Start(t, apptest.Config(t, backend), app.Options{})
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		for _, tc := range []struct {
			tool   string
			code   codes.Code
			reason string
		}{
			{"notes__nope", codes.NotFound, fault.ReasonToolNotFound},
			{"Echo", codes.NotFound, fault.ReasonToolNotFound},
			{"notes", codes.InvalidArgument, fault.ReasonInvalidRequest}, // a tool, not an exported name: the action is missing
			{"not valid!", codes.InvalidArgument, fault.ReasonInvalidRequest},
		} {
			_, err := exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{Tool: tc.tool})
			if status.Code(err) != tc.code || reasonOnly(err) != tc.reason {
				t.Errorf("%q: %v", tc.tool, err)
			}
		}
		resp, err := exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{Tool: "clock__now", ArgumentsJson: `{"timezone":null}`})
		if err != nil || resp.GetOutcome() != succeeded || resp.GetResult().GetValueJson() == "" {
			t.Fatalf("clock__now: %v %v", resp, err)
		}
		evs, err := a.Store().ListAuditEvents(ctx, storeFilterCall(resp.GetCallId()))
		if err != nil || len(evs) == 0 {
			t.Fatalf("events: %v %v", evs, err)
		}
		for _, ev := range evs {
			if ev.Tool != "clock" || ev.Action != "now" {
				t.Errorf("event %s is about %s.%s", ev.Type, ev.Tool, ev.Action)
			}
		}
	})
}

// ExecuteTool takes the arguments as JSON text too; the result's value
// comes back as JSON text.
func TestArgumentsAsJSONText(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := apptest.As(testCtx(t), "dev")
		conn, _ := apptest.Start(t, apptest.Config(t, backend), app.Options{})
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		r, err := exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo",
			ArgumentsJson: `{"uppercase": true, "message": "héllo <x>"}`})
		if err != nil || r.GetOutcome() != succeeded || r.GetResult().GetMessage() != "echo: HÉLLO <X>" {
			t.Fatalf("%v %v", r, err)
		}
		var v map[string]string
		if err := json.Unmarshal([]byte(r.GetResult().GetValueJson()), &v); err != nil || v["message"] != "HÉLLO <X>" {
			t.Fatalf("value_json %q: %v", r.GetResult().GetValueJson(), err)
		}
		for _, bad := range []*toolsvcv1.ExecuteToolRequest{
			{Tool: "echo", Action: "echo", ArgumentsJson: `{"message":`},
			{Tool: "echo", Action: "echo", ArgumentsJson: `["message"]`},
			{Tool: "echo", Action: "echo", ArgumentsJson: `{"message":"a"}`, Arguments: mustStruct(t, map[string]any{"message": "b"})},
		} {
			if _, err := exec.ExecuteTool(ctx, bad); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%v: %v", bad, err)
			}
		}
	})
}

// Toolsets through the API: refused when they name an unknown tool, seen
// by each principal as far as it may call their tools, and what exports
// hold.
func TestToolsetsThroughTheAPI(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		cfg := apptest.Config(t, backend)
		cfg.Principals = []config.PrincipalConfig{
			{ID: "writer", Roles: []string{"agent"}, Scopes: []string{"notes"}},
			{ID: "bystander", Roles: []string{"agent"}},
		}
		conn, a := apptest.Start(t, cfg, app.Options{})
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		op := apptest.As(ctx, "ops")

		_, err := reg.RegisterToolset(op, &toolsvcv1.RegisterToolsetRequest{Toolset: &toolsvcv1.Toolset{
			Name: "docs", Title: "Docs", Tools: []string{"notes", "ghost"}}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(violationsOf(err), `toolset "docs" names tool "ghost", which is not registered`) {
			t.Fatalf("unknown tool: %v", err)
		}
		if _, err := reg.GetToolset(op, &toolsvcv1.GetToolsetRequest{Name: "docs"}); status.Code(err) != codes.NotFound {
			t.Fatalf("a refused toolset exists: %v", err)
		}
		created, err := reg.RegisterToolset(op, &toolsvcv1.RegisterToolsetRequest{Toolset: &toolsvcv1.Toolset{
			Name: "docs", Title: "Docs", Guidance: "Read before you write.", Tools: []string{"notes", "pipeline.build"}}})
		if err != nil || !created.GetCreated() || created.GetToolset().GetSource() != toolsvcv1.ToolSource_TOOL_SOURCE_API {
			t.Fatalf("register: %v %v", created, err)
		}
		_, err = reg.RegisterToolset(apptest.As(ctx, "writer"), &toolsvcv1.RegisterToolsetRequest{Toolset: created.GetToolset()})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("an agent registered a toolset: %v", err)
		}
		evs, _ := a.Store().ListAuditEvents(ctx, storeFilterTypes("toolset.registered"))
		if len(evs) != 1 || evs[0].Principal != "ops" {
			t.Fatalf("audit: %v", evs)
		}

		// writer may call notes, not pipeline: it sees the toolset with notes
		// only; bystander (no scopes) does not see it.
		got, err := reg.GetToolset(apptest.As(ctx, "writer"), &toolsvcv1.GetToolsetRequest{Name: "docs"})
		if err != nil || strings.Join(got.GetToolset().GetTools(), ",") != "notes" {
			t.Fatalf("writer sees %v %v", got, err)
		}
		list, err := reg.ListToolsets(apptest.As(ctx, "bystander"), &toolsvcv1.ListToolsetsRequest{})
		if err != nil || len(list.GetToolsets()) != 0 {
			t.Fatalf("bystander lists %v %v", list, err)
		}
		if _, err := reg.GetToolset(apptest.As(ctx, "bystander"), &toolsvcv1.GetToolsetRequest{Name: "docs"}); status.Code(err) != codes.NotFound {
			t.Fatalf("bystander gets it: %v", err)
		}
		x, err := reg.ExportTools(apptest.As(ctx, "writer"), &toolsvcv1.ExportToolsRequest{
			Format: toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_RESPONSES, Toolset: "docs"})
		if err != nil || len(x.GetTools()) != 4 || !strings.HasPrefix(x.GetGuidanceMarkdown(), "## Docs\n\nRead before you write.\n") {
			t.Fatalf("writer's export of docs: %v %v", x, err)
		}

		// Disabled, its tools leave the default export (pipeline.build stays:
		// pipeline's other actions are in no toolset, but build is only in
		// docs).
		ts := created.GetToolset()
		ts.Disabled = true
		if _, err := reg.RegisterToolset(op, &toolsvcv1.RegisterToolsetRequest{Toolset: ts, ExpectedVersion: 1}); err != nil {
			t.Fatal(err)
		}
		x, err = reg.ExportTools(op, &toolsvcv1.ExportToolsRequest{Format: toolsvcv1.ExportFormat_EXPORT_FORMAT_MCP})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range x.GetTools() {
			names = append(names, e.GetName())
		}
		if got := strings.Join(names, ","); got != "clock__now,echo,flaky__run,pipeline__test,pipeline__deploy,release__run" {
			t.Fatalf("export with docs disabled: %s", got)
		}
		_, err = reg.ExportTools(op, &toolsvcv1.ExportToolsRequest{Format: toolsvcv1.ExportFormat_EXPORT_FORMAT_MCP, Toolset: "docs"})
		if status.Code(err) != codes.FailedPrecondition || reasonOnly(err) != fault.ReasonToolsetDisabled {
			t.Fatalf("export of a disabled toolset: %v", err)
		}
		if _, err := reg.ExportTools(op, &toolsvcv1.ExportToolsRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("export without a format: %v", err)
		}
		if _, err := reg.DeregisterToolset(op, &toolsvcv1.DeregisterToolsetRequest{Name: "docs"}); err != nil {
			t.Fatal(err)
		}
		if l, _ := reg.ListToolsets(op, &toolsvcv1.ListToolsetsRequest{}); len(l.GetToolsets()) != 0 {
			t.Fatalf("still listed: %v", l)
		}
	})
}

// GetTool and ListTools carry guidance and exported names.
func TestGuidanceInGetTool(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := apptest.As(testCtx(t), "dev")
		conn, _ := apptest.Start(t, apptest.Config(t, backend), app.Options{})
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		got, err := reg.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: "notes"})
		if err != nil || !strings.Contains(got.GetTool().GetGuidance(), "Notes are addressed by absolute paths") {
			t.Fatalf("%v %v", got, err)
		}
		var write *toolsvcv1.Action
		for _, a := range got.GetTool().GetActions() {
			if a.GetExportedName() != "notes__"+a.GetName() {
				t.Errorf("exported name of %s: %q", a.GetName(), a.GetExportedName())
			}
			if a.GetName() == "write" {
				write = a
			}
		}
		if !strings.HasPrefix(write.GetGuidance(), "Send the whole new content") {
			t.Fatalf("write guidance %q", write.GetGuidance())
		}
		// Guidance registered through the API comes back as registered.
		tool := &toolsvcv1.Tool{Name: "weather", Description: "Weather", ConnectorId: "weather-mcp",
			ProviderType: toolsvcv1.ProviderType_PROVIDER_TYPE_MCP, DefaultRisk: toolsvcv1.RiskLevel_RISK_LEVEL_LOW,
			Guidance: "Always say which city.\n\n**Never** guess.", Actions: []*toolsvcv1.Action{{Name: "current", Description: "Now",
				Guidance: "Metric units — °C."}}}
		if _, err := reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: tool}); err != nil {
			t.Fatal(err)
		}
		list, err := reg.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range list.GetTools() {
			if tl.GetName() == "weather" && (tl.GetGuidance() != tool.Guidance || tl.GetActions()[0].GetGuidance() != "Metric units — °C.") {
				t.Fatalf("listed %v", tl)
			}
		}
		tool.Guidance = strings.Repeat("x", 5000)
		if _, err := reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: tool}); status.Code(err) != codes.InvalidArgument ||
			!strings.Contains(violationsOf(err), "tool.guidance: must be at most 4096 bytes") {
			t.Fatalf("long guidance: %v", err)
		}
	})
}

// WatchApprovals follows one approval, or one call, from where it stands:
// a waiting agent sees the resolution whenever it subscribed.
func TestWatchOneApproval(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		cfg := apptest.Config(t, backend)
		cfg.Principals = []config.PrincipalConfig{
			{ID: "writer", Roles: []string{"agent"}, Scopes: []string{"notes"}},
			{ID: "other", Roles: []string{"agent"}, Scopes: []string{"notes"}},
			{ID: "approver-1", Roles: []string{"approver"}},
		}
		conn, _ := apptest.Start(t, cfg, app.Options{})
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		appr := toolsvcv1.NewApprovalServiceClient(conn)
		writer := apptest.As(ctx, "writer")
		parked, err := exec.ExecuteTool(writer, &toolsvcv1.ExecuteToolRequest{Tool: "notes__write",
			ArgumentsJson: `{"path":"/w.md","content":"hi"}`, Context: &toolsvcv1.CallContext{IdempotencyKey: "w"}})
		if err != nil || parked.GetOutcome() != approvalRequired {
			t.Fatalf("%v %v", parked, err)
		}
		id := parked.GetApproval().GetApprovalId()
		for _, req := range []*toolsvcv1.WatchApprovalsRequest{{ApprovalId: id}, {CallId: parked.GetCallId()}} {
			wctx, cancel := context.WithCancel(writer)
			stream, err := appr.WatchApprovals(wctx, req)
			if err != nil {
				t.Fatal(err)
			}
			first, err := stream.Recv()
			if err != nil || first.GetApproval().GetApprovalId() != id || first.GetApproval().GetState() != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
				t.Fatalf("%v: first %v %v", req, first, err)
			}
			cancel()
		}
		// Another agent may not follow it.
		for _, req := range []*toolsvcv1.WatchApprovalsRequest{{ApprovalId: id}, {CallId: parked.GetCallId()}} {
			stream, err := appr.WatchApprovals(apptest.As(ctx, "other"), req)
			if err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != codes.NotFound {
				t.Fatalf("other follows %v: %v", req, err)
			}
		}
		// Subscribed, the resolution arrives without polling.
		wctx, cancel := context.WithTimeout(writer, 30*time.Second)
		defer cancel()
		stream, err := appr.WatchApprovals(wctx, &toolsvcv1.WatchApprovalsRequest{ApprovalId: id})
		if err != nil {
			t.Fatal(err)
		}
		if first, err := stream.Recv(); err != nil || first.GetApproval().GetState() != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
			t.Fatalf("first: %v %v", first, err)
		}
		if _, err := appr.ResolveApproval(apptest.As(ctx, "approver-1"), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: id, Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE, Comment: "fine"}); err != nil {
			t.Fatal(err)
		}
		next, err := stream.Recv()
		if err != nil || next.GetApproval().GetState() != toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED || next.GetApproval().GetComment() != "fine" {
			t.Fatalf("next: %v %v", next, err)
		}
		// Subscribing after the resolution still gets it first.
		late, err := appr.WatchApprovals(wctx, &toolsvcv1.WatchApprovalsRequest{CallId: parked.GetCallId()})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := late.Recv(); err != nil || got.GetApproval().GetState() != toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED {
			t.Fatalf("late: %v %v", got, err)
		}
		done, err := exec.ExecuteTool(writer, &toolsvcv1.ExecuteToolRequest{Tool: "notes__write",
			ArgumentsJson: `{"path":"/w.md","content":"hi"}`, Context: &toolsvcv1.CallContext{IdempotencyKey: "w"}})
		if err != nil || done.GetOutcome() != succeeded {
			t.Fatalf("after approval: %v %v", done, err)
		}
	})
}

// reasonOnly is an error's ErrorInfo reason.
func reasonOnly(err error) string {
	r, _ := reasonOf(err)
	return r
}

// violationsOf lists an error's field violations, one per line.
func violationsOf(err error) string {
	var out []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField()+": "+v.GetDescription())
			}
		}
	}
	return strings.Join(out, "\n")
}

func storeFilterCall(callID string) store.AuditFilter { return store.AuditFilter{CallID: callID} }

func storeFilterTypes(types ...string) store.AuditFilter { return store.AuditFilter{Types: types} }
