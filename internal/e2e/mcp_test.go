package e2e_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// notesServer is a real MCP server (the official SDK) over streamable HTTP
// that accepts only requests bearing the canary token, and echoes that
// token in the failure of its whoami tool.
func notesServer(t *testing.T) (*sdk.Server, string) {
	t.Helper()
	yes, no := true, false
	srv := sdk.NewServer(&sdk.Implementation{Name: "notes", Version: "1.0"}, &sdk.ServerOptions{
		Capabilities: &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{ListChanged: true}},
	})
	schema := json.RawMessage(`{"type":"object","properties":{"title":{"type":"string"}},"required":["title"]}`)
	srv.AddTool(&sdk.Tool{Name: "Read Note", Description: "Read a note \u2014 by its title.", InputSchema: schema,
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no}},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			var args map[string]any
			_ = json.Unmarshal(req.Params.Arguments, &args)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "the note"}},
				StructuredContent: map[string]any{"title": args["title"], "text": "hello"}}, nil
		})
	srv.AddTool(&sdk.Tool{Name: "delete_note", Description: "Delete a note.", InputSchema: schema,
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no}},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "deleted"}}}, nil
		})
	srv.AddTool(&sdk.Tool{Name: "whoami", Description: "Who calls.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			auth := ""
			if req.Extra != nil && req.Extra.Header != nil {
				auth = req.Extra.Header.Get("Authorization")
			}
			return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "refusing " + auth}}}, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+connectorCanary {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
	})
	return srv, hs.URL + "/mcp"
}

// TestMCPServerThroughTheAPI: a real MCP server over streamable HTTP, its
// token only in the secrets directory, registered and called through the
// API with the MCP client toolsvc ships: actions mapped from the server's
// names with risks from its annotations, a failure that quotes the token
// answered scrubbed, and a tool the server adds at run time arriving as a
// new version.
func TestMCPServerThroughTheAPI(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		srv, url := notesServer(t)
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "notes"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "notes", "token"), []byte(connectorCanary), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		cfg.Secrets.Dir = dir
		cfg.Secrets.Destinations = []config.SecretDestinationConfig{{Connector: "notes", Hosts: []string{strings.TrimSuffix(url, "/mcp")}}}
		logs := &lockedBuffer{}
		conn, a := apptest.Start(t, cfg, app.Options{
			Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
		scan := &leakScan{}
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		ops, agent := apptest.As(ctx, "ops-1"), apptest.As(ctx, "agent-1")

		rr, err := reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{
			Name: "notes", RequiredScopes: []string{"notes"},
			Connector: &toolsvcv1.Connector{
				Type: toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP, Url: url,
				Headers: map[string]*toolsvcv1.ConfigValue{"Authorization": {Secret: "token", Prefix: "Bearer "}},
			},
		}})
		scan.addRPC("RegisterTool", rr, err)
		if err != nil {
			t.Fatalf("RegisterTool: %v", err)
		}
		tool := rr.GetTool()
		risks := map[string]toolsvcv1.RiskLevel{}
		for _, act := range tool.GetActions() {
			risks[act.GetName()] = act.GetRisk()
		}
		if len(risks) != 3 || risks["read_note"] != toolsvcv1.RiskLevel_RISK_LEVEL_LOW ||
			risks["delete_note"] != toolsvcv1.RiskLevel_RISK_LEVEL_HIGH || risks["whoami"] != toolsvcv1.RiskLevel_RISK_LEVEL_MEDIUM {
			t.Fatalf("actions and risks: %v", risks)
		}
		var mapped string
		for _, d := range tool.GetConnector().GetDiscovered() {
			if d.GetAction() == "read_note" {
				mapped = d.GetServerTool()
			}
		}
		if mapped != "Read Note" || tool.GetActions()[1].GetDescription() != "Read a note - by its title." {
			t.Fatalf("mapping %q, description %q", mapped, tool.GetActions()[1].GetDescription())
		}

		call := func(action, key string, args map[string]any) *toolsvcv1.ExecuteToolResponse {
			t.Helper()
			r := req(t, "notes", action, args, key)
			r.Context.AutonomyLevel = autonomous
			resp, err := exec.ExecuteTool(agent, r)
			scan.addRPC("ExecuteTool "+key, resp, err)
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			return resp
		}
		resp := call("read_note", "read", map[string]any{"title": "a"})
		if resp.GetOutcome() != succeeded || resp.GetResult().GetValue().GetStructValue().GetFields()["text"].GetStringValue() != "hello" {
			t.Fatalf("read_note: %v", resp)
		}
		resp = call("whoami", "whoami", nil)
		if resp.GetOutcome() != failed || !strings.HasPrefix(resp.GetResult().GetMessage(), "refusing ") || !strings.Contains(resp.GetResult().GetMessage(), "[REDACTED]") {
			t.Fatalf("whoami: %v", resp)
		}

		// The server adds a tool: notifications/tools/list_changed.
		srv.AddTool(&sdk.Tool{Name: "archive_note", Description: "Archive a note.", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
				return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "archived"}}}, nil
			})
		testutil.Eventually(t, 15*time.Second, "the added tool as version 2", func() bool {
			g, err := reg.GetTool(agent, &toolsvcv1.GetToolRequest{Name: "notes"})
			return err == nil && g.GetTool().GetVersion() == 2 && len(g.GetTool().GetActions()) == 4
		})
		resp = call("archive_note", "archive", nil)
		if resp.GetOutcome() != succeeded || resp.GetResult().GetMessage() != "archived" {
			t.Fatalf("archive_note: %v", resp)
		}
		evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		scan.addJSON(t, "audit rows", evs)
		for _, key := range []string{"read", "whoami", "archive"} {
			c, err := a.Store().GetCallByKey(ctx, "agent-1", key)
			if err != nil {
				t.Fatal(err)
			}
			scan.addJSON(t, "stored call "+key, c)
		}
		h, err := a.Store().GetToolHealth(ctx, "notes")
		if err != nil {
			t.Fatal(err)
		}
		scan.addJSON(t, "stored health", h)
		g, err := reg.GetTool(agent, &toolsvcv1.GetToolRequest{Name: "notes"})
		scan.addRPC("GetTool", g, err)
		scan.add("server log", logs.Bytes())
		scan.check(t)
	})
}
