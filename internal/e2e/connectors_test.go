package e2e_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools/connhost"
	"github.com/toolsvc/toolsvc/toolkit"
)

// connectorCanary is the API token of the connector tests: characters that
// every encoding changes, so that each encoding is a distinct needle.
const connectorCanary = "e2e-C4NARY+t0k/en=v@l ue"

// canaryForms are the forms a leak of the canary could take.
func canaryForms() map[string]string {
	c := connectorCanary
	return map[string]string{
		"value":            c,
		"base64":           base64.StdEncoding.EncodeToString([]byte(c)),
		"base64 raw":       base64.RawStdEncoding.EncodeToString([]byte(c)),
		"base64 url":       base64.URLEncoding.EncodeToString([]byte(c)),
		"base64 url raw":   base64.RawURLEncoding.EncodeToString([]byte(c)),
		"query escaped":    url.QueryEscape(c),
		"path escaped":     url.PathEscape(c),
		"bearer in base64": base64.StdEncoding.EncodeToString([]byte("Bearer " + c)),
	}
}

// leakScan collects everything toolsvc said or kept, labelled, and finds
// the canary in it.
type leakScan struct {
	mu    sync.Mutex
	texts []string
}

func (l *leakScan) add(label string, b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.texts = append(l.texts, label+"\x00"+string(b))
}

func (l *leakScan) addJSON(t *testing.T, label string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: %v", label, err)
	}
	l.add(label, b)
}

func (l *leakScan) addProto(label string, m proto.Message) {
	if b, err := protojson.Marshal(m); err == nil {
		l.add(label+" (json)", b)
	}
	if b, err := proto.Marshal(m); err == nil {
		l.add(label+" (wire)", b)
	}
}

// addRPC records a response or an error with all its details.
func (l *leakScan) addRPC(label string, m proto.Message, err error) {
	if err != nil {
		st, _ := status.FromError(err)
		l.addProto(label+" error", st.Proto())
		l.add(label+" error text", []byte(err.Error()))
		return
	}
	l.addProto(label, m)
}

func (l *leakScan) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, text := range l.texts {
		label, body, _ := strings.Cut(text, "\x00")
		for form, needle := range canaryForms() {
			if i := strings.Index(body, needle); i >= 0 {
				from, to := max(0, i-80), min(len(body), i+len(needle)+80)
				t.Errorf("%s holds the canary (%s): …%s…", label, form, body[from:to])
			}
		}
	}
}

// lockedBuffer is a log sink safe for concurrent writers.
type lockedBuffer = testutil.Buffer

// upstream is an HTTP API that echoes the credentials it receives in every
// answer: the worst an upstream can do.
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	gotToken int // requests that carried the canary, in header and query
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		auth := r.Header.Get("Authorization")
		if auth == "Bearer "+connectorCanary && r.URL.Query().Get("api_key") == connectorCanary {
			u.mu.Lock()
			u.gotToken++
			u.mu.Unlock()
		}
		echo := fmt.Sprintf("%s %s", auth, r.URL.String())
		w.Header().Set("Content-Type", "application/json")
		switch strings.TrimPrefix(r.URL.Path, "/v1") {
		case "/fail":
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": "bad request from " + echo}})
		case "/boom":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, "crashed while serving "+echo)
		case "/limited":
			w.Header().Set("Retry-After", "300")
			w.WriteHeader(http.StatusTooManyRequests)
			json.NewEncoder(w).Encode(map[string]any{"message": "slow down, " + echo})
		case "/slow":
			<-r.Context().Done()
		default:
			json.NewEncoder(w).Encode(map[string]any{"auth": auth, "url": r.URL.String(), "b64": base64.StdEncoding.EncodeToString([]byte(auth))})
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) tokens() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gotToken
}

// panicky is the connectors' transport: it panics, quoting the request's
// credentials, on /panic, and sends every other request.
type panicky struct{ next http.RoundTripper }

func (p panicky) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/panic") {
		panic("transport exploded on " + r.Header.Get("Authorization") + " " + r.URL.String())
	}
	return p.next.RoundTrip(r)
}

// billingTool is the HTTP connector of the canary test, as an operator
// registers it: the token only as references.
func billingTool(base string) *toolsvcv1.Tool {
	token := &toolsvcv1.SecretRef{Secret: "token"}
	act := func(name, method, path string, risk toolsvcv1.RiskLevel) *toolsvcv1.ConnectorAction {
		return &toolsvcv1.ConnectorAction{Name: name, Description: "The " + name + " action", Method: method, Path: path, Risk: risk}
	}
	write := act("write", "POST", "/items/{id}", toolsvcv1.RiskLevel_RISK_LEVEL_MEDIUM)
	write.Body = []string{"amount"}
	return &toolsvcv1.Tool{
		Name: "billing", Description: "The billing API",
		Timeout: durationpb.New(time.Second), AuditPayloads: true,
		Connector: &toolsvcv1.Connector{
			Type: toolsvcv1.ConnectorType_CONNECTOR_TYPE_HTTP, BaseUrl: base + "/v1",
			MaxResponseBytes: 4096,
			Auth:             &toolsvcv1.HttpAuth{Kind: &toolsvcv1.HttpAuth_Query{Query: &toolsvcv1.NamedSecret{Name: "api_key", Value: token}}},
			Headers:          map[string]*toolsvcv1.ConfigValue{"Authorization": {Secret: "token", Prefix: "Bearer "}, "X-Tenant": {Value: "acme"}},
			Actions: []*toolsvcv1.ConnectorAction{
				act("get_item", "GET", "/items/{id}", toolsvcv1.RiskLevel_RISK_LEVEL_LOW),
				act("fail", "POST", "/fail", toolsvcv1.RiskLevel_RISK_LEVEL_LOW),
				act("slow", "POST", "/slow", toolsvcv1.RiskLevel_RISK_LEVEL_LOW),
				act("boom", "POST", "/boom", toolsvcv1.RiskLevel_RISK_LEVEL_LOW),
				act("panic", "GET", "/panic", toolsvcv1.RiskLevel_RISK_LEVEL_LOW),
				act("limited", "GET", "/limited", toolsvcv1.RiskLevel_RISK_LEVEL_LOW),
				write,
				act("remove", "DELETE", "/items/{id}", toolsvcv1.RiskLevel_RISK_LEVEL_HIGH),
			},
		},
	}
}

// TestConnectorSecretsNeverLeak drives an HTTP connector whose upstream
// echoes its token in every answer through every path of a call — success,
// failure, timeout, panic, denial, rate limit, UNKNOWN, preview, approval,
// a connection that is refused — and then looks for the token and its
// encodings in everything toolsvc said or kept: every gRPC response and
// error (with details), the server's log at debug level, the audit trail,
// stored calls, previews and approvals, tool health, and on Postgres every
// row of every table.
func TestConnectorSecretsNeverLeak(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		up := newUpstream(t)
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "billing"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "billing", "token"), []byte(connectorCanary+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// A second connector, declared in the tools file, whose token is in
		// the environment and whose API does not listen.
		closed := httptest.NewServer(http.NotFoundHandler())
		closedURL := closed.URL
		closed.Close()
		toolsFile := filepath.Join(t.TempDir(), "tools.yaml")
		if err := os.WriteFile(toolsFile, []byte(`connectors:
  - id: down
    type: http
    base_url: `+closedURL+`
    auth: {query: {name: api_key, value: {secret: token}}}
    audit_payloads: true
    actions:
      - {name: get, description: Get, method: GET, path: /x, risk: LOW}
`), 0o600); err != nil {
			t.Fatal(err)
		}

		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		cfg.Secrets.Dir = dir
		cfg.ToolsFile = toolsFile
		// The operator's billing connector may be sent its token.
		cfg.Secrets.Destinations = []config.SecretDestinationConfig{{Connector: "billing", Hosts: []string{up.URL}}}
		logs := &lockedBuffer{}
		log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		conn, a := apptest.Start(t, cfg, app.Options{
			Logger:             log,
			ConnectorTransport: panicky{http.DefaultTransport},
			Env: func(k string) (string, bool) {
				return connectorCanary, k == "TOOLSVC_SECRET_DOWN_TOKEN"
			},
		})
		scan := &leakScan{}
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		approvals := toolsvcv1.NewApprovalServiceClient(conn)
		health := toolsvcv1.NewToolHealthServiceClient(conn)
		audit := toolsvcv1.NewAuditServiceClient(conn)
		agent := apptest.As(ctx, "agent-1")
		ops := apptest.As(ctx, "ops-1")

		regResp, err := reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: billingTool(up.URL)})
		scan.addRPC("RegisterTool", regResp, err)
		if err != nil {
			t.Fatalf("RegisterTool: %v", err)
		}
		got, err := reg.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "billing"})
		scan.addRPC("GetTool", got, err)
		if err != nil || got.GetTool().GetConnector().GetHeaders()["Authorization"].GetSecret() != "token" ||
			len(got.GetTool().GetActions()) != 8 || !got.GetTool().GetSupportsPreview() {
			t.Fatalf("GetTool: %v %v", got, err)
		}

		var keys []string
		call := func(action string, args map[string]any, autonomy toolsvcv1.AutonomyLevel, key, token string) (*toolsvcv1.ExecuteToolResponse, error) {
			t.Helper()
			keys = append(keys, key)
			r := req(t, "billing", action, args, key)
			if strings.HasPrefix(key, "down-") {
				r.Tool = "down"
			}
			r.Context.AutonomyLevel = autonomy
			r.Context.PreviewToken = token
			resp, err := exec.ExecuteTool(agent, r)
			scan.addRPC("ExecuteTool "+key, resp, err)
			return resp, err
		}
		want := func(key string, resp *toolsvcv1.ExecuteToolResponse, err error, outcome toolsvcv1.Outcome, text string) *toolsvcv1.ExecuteToolResponse {
			t.Helper()
			if err != nil || resp.GetOutcome() != outcome || !strings.Contains(resp.GetResult().GetMessage(), text) {
				t.Fatalf("%s: %v %v; want %s with %q", key, resp, err, outcome, text)
			}
			return resp
		}

		// Success: the upstream echoes the token in the value.
		resp, err := call("get_item", map[string]any{"id": "42"}, autonomous, "ok", "")
		want("ok", resp, err, succeeded, "GET /v1/items/42: 200 OK")
		if v := resp.GetResult().GetValue().GetStructValue().GetFields()["auth"].GetStringValue(); v != "Bearer [REDACTED]" {
			t.Fatalf("the echoed token: %q", v)
		}
		// Failure: a 400 whose message quotes the token.
		resp, err = call("fail", nil, autonomous, "fail", "")
		want("fail", resp, err, failed, "400 Bad Request: bad request from Bearer [REDACTED]")
		// Timeout of a POST: the request was sent.
		resp, err = call("slow", nil, autonomous, "slow", "")
		want("slow", resp, err, unknown, "outcome unknown")
		// A 500 to a POST, its body quoting the token and the URL.
		resp, err = call("boom", nil, autonomous, "boom", "")
		want("boom", resp, err, unknown, "500 Internal Server Error: crashed while serving Bearer [REDACTED]")
		// A panic whose value quotes the request.
		resp, err = call("panic", nil, autonomous, "panic", "")
		want("panic", resp, err, failed, "panicked")
		// Preview: the request it would send, secrets redacted; then run.
		resp, err = call("write", map[string]any{"id": "7", "amount": 3}, supervised, "write", "")
		want("write", resp, err, previewRequired, "Would send POST "+up.URL+"/v1/items/7?api_key=[REDACTED]")
		pv := resp.GetPreview()
		resp, err = call("write", map[string]any{"id": "7", "amount": 3}, supervised, "write", pv.GetToken())
		want("write executed", resp, err, succeeded, "POST /v1/items/7: 200 OK")
		// Approval, then run.
		resp, err = call("remove", map[string]any{"id": "7"}, supervised, "remove", "")
		want("remove", resp, err, approvalRequired, "approval")
		apResp, err := approvals.ResolveApproval(apptest.As(ctx, "alice"), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: resp.GetApproval().GetApprovalId(), Decision: approve, Comment: "ok"})
		scan.addRPC("ResolveApproval", apResp, err)
		if err != nil {
			t.Fatal(err)
		}
		resp, err = call("remove", map[string]any{"id": "7"}, supervised, "remove", "")
		want("remove executed", resp, err, succeeded, "DELETE /v1/items/7: 200 OK")
		// Denial by the gate.
		resp, err = call("write", map[string]any{"id": "8"}, readOnly, "denied", "")
		want("denied", resp, err, denied, "")
		// A refused connection: url.Error quotes the URL, token and all.
		resp, err = call("get", nil, autonomous, "down-1", "")
		want("down-1", resp, err, failed, "api_key=[REDACTED]")
		// Rate limited, and every call until the reset.
		_, err = call("limited", nil, autonomous, "limited", "")
		if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted {
			t.Fatalf("limited: %v", err)
		}
		_, err = call("get_item", map[string]any{"id": "43"}, autonomous, "after-limit", "")
		if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted {
			t.Fatalf("after the limit: %v", err)
		}
		if up.tokens() < 7 {
			t.Fatalf("the upstream saw the token in %d requests: the test proves nothing", up.tokens())
		}

		// Everything toolsvc kept or says.
		for _, key := range keys {
			c, err := exec.GetCall(agent, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: key}})
			scan.addRPC("GetCall "+key, c, err)
			if sc, err := a.Store().GetCallByKey(ctx, "agent-1", key); err == nil {
				scan.addJSON(t, "stored call "+key, sc)
				if sc.PreviewToken != "" {
					p, err := a.Store().GetPreview(ctx, sc.PreviewToken)
					if err != nil {
						t.Fatal(err)
					}
					scan.addJSON(t, "stored preview "+key, p)
				}
			}
		}
		for _, tool := range []string{"billing", "down"} {
			h, err := health.GetToolHealth(ops, &toolsvcv1.GetToolHealthRequest{Tool: tool})
			scan.addRPC("GetToolHealth "+tool, h, err)
			sh, err := a.Store().GetToolHealth(ctx, tool)
			if err != nil {
				t.Fatal(err)
			}
			scan.addJSON(t, "stored health "+tool, sh)
			if tool == "down" && !strings.Contains(sh.LastError, "api_key=[REDACTED]") {
				t.Fatalf("the health of down does not show the scrubbed error: %q", sh.LastError)
			}
		}
		hl, err := health.ListToolHealth(ops, &toolsvcv1.ListToolHealthRequest{})
		scan.addRPC("ListToolHealth", hl, err)
		al, err := approvals.ListApprovals(apptest.As(ctx, "alice"), &toolsvcv1.ListApprovalsRequest{})
		scan.addRPC("ListApprovals", al, err)
		aps, err := a.Store().ListApprovals(ctx, store.ListApprovalsParams{Limit: 1000})
		if err != nil || len(aps) == 0 {
			t.Fatalf("stored approvals: %d %v", len(aps), err)
		}
		scan.addJSON(t, "stored approvals", aps)
		evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Limit: 10000})
		if err != nil || len(evs) < 20 {
			t.Fatalf("audit: %d events, %v", len(evs), err)
		}
		scan.addJSON(t, "audit rows", evs)
		ae, err := audit.ListAuditEvents(ops, &toolsvcv1.ListAuditEventsRequest{PageSize: 1000})
		scan.addRPC("ListAuditEvents", ae, err)
		lt, err := reg.ListTools(agent, &toolsvcv1.ListToolsRequest{})
		scan.addRPC("ListTools", lt, err)
		if backend == apptest.Postgres {
			dumpDatabase(t, ctx, cfg.DatabaseURL, scan)
		}
		logged := logs.Bytes()
		// The handler takes every level from debug up; the panic is logged
		// with its value at error level.
		if !bytes.Contains(logged, []byte(`"level":"INFO"`)) || !bytes.Contains(logged, []byte(`"msg":"tool panicked"`)) {
			t.Fatalf("the log was not captured:\n%s", logged)
		}
		scan.add("server log", logged)
		scan.check(t)
	})
}

// dumpDatabase adds every row of every table of the database to scan.
func dumpDatabase(t *testing.T, ctx context.Context, dbURL string, scan *leakScan) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT table_schema, table_name FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, pgx.Identifier{schema, name}.Sanitize())
	}
	if rows.Err() != nil || len(tables) < 5 {
		t.Fatalf("tables %v: %v", tables, rows.Err())
	}
	for _, tbl := range tables {
		var dump []byte
		if err := conn.QueryRow(ctx, `SELECT coalesce(json_agg(t)::text, '') FROM `+tbl+` t`).Scan(&dump); err != nil {
			t.Fatalf("dump %s: %v", tbl, err)
		}
		scan.add("table "+tbl, dump)
	}
}

// TestConnectorDefinitionRoundTrip: a connector registered through the API
// comes back from GetTool and ListTools as it was given (references only),
// with its derived actions, and an unchanged registration keeps its
// version.
func TestConnectorDefinitionRoundTrip(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		e := newEnv(t, backend, func(c *config.Config) {
			c.Secrets.Destinations = []config.SecretDestinationConfig{{Connector: "billing", Hosts: []string{"https://api.example.com"}}}
		})
		ops := apptest.As(ctx, "ops-1")
		in := billingTool("https://api.example.com")
		in.Connector.Actions[0].InputSchema, _ = structpb.NewStruct(map[string]any{
			"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string", "pattern": "^[0-9]+$"}}, "required": []any{"id"},
		})
		in.Connector.Actions[6].Query = []string{"dry_run"}
		reg, err := e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: in})
		if err != nil || !reg.GetCreated() {
			t.Fatalf("RegisterTool: %v", err)
		}
		got, err := e.registry.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		gt := got.GetTool()
		if gt.GetConnectorId() != "billing" || gt.GetProviderType() != toolsvcv1.ProviderType_PROVIDER_TYPE_NATIVE ||
			gt.GetDefaultRisk() != toolsvcv1.RiskLevel_RISK_LEVEL_MEDIUM || gt.GetSource() != toolsvcv1.ToolSource_TOOL_SOURCE_API {
			t.Fatalf("derived fields: %v", gt)
		}
		if !proto.Equal(gt.GetConnector(), in.GetConnector()) {
			t.Fatalf("connector changed on the way:\n got %v\nwant %v", gt.GetConnector(), in.GetConnector())
		}
		if a := gt.GetActions()[0]; a.GetName() != "get_item" || !proto.Equal(a.GetInputSchema(), in.Connector.Actions[0].InputSchema) {
			t.Fatalf("action 0: %v", a)
		}
		// The derived schema of a path parameter.
		if p := gt.GetActions()[6].GetInputSchema().GetFields()["required"].GetListValue().GetValues(); len(p) != 1 || p[0].GetStringValue() != "id" {
			t.Fatalf("derived schema: %v", gt.GetActions()[6].GetInputSchema())
		}
		// GetTool's answer registers as it is: same version.
		again, err := e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: gt})
		if err != nil || again.GetCreated() || again.GetTool().GetVersion() != 1 {
			t.Fatalf("re-register: %v %v", again, err)
		}
		// The stored definition holds the reference, on either store.
		st, err := e.app.Store().GetTool(ctx, "billing")
		if err != nil || st.Connector.Auth.Query.Value.Key != "token" || st.Connector.Headers["Authorization"].Secret.Prefix != "Bearer " {
			t.Fatalf("stored: %+v %v", st, err)
		}
		// A literal credential is refused, and nothing is written.
		bad := proto.Clone(in).(*toolsvcv1.Tool)
		bad.Connector.Headers["Authorization"] = &toolsvcv1.ConfigValue{Value: "Bearer abc"}
		bad.Description = "changed"
		_, err = e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: bad})
		re := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST")
		if f := re.fields(); len(f) != 1 || f[0] != "tool.connector.headers.Authorization" {
			t.Fatalf("fields %v", f)
		}
		if cur, _ := e.registry.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "billing"}); cur.GetTool().GetVersion() != 1 {
			t.Fatal("a refused registration changed the tool")
		}
		// SyncTool of an HTTP connector: nothing to discover.
		sy, err := e.registry.SyncTool(ops, &toolsvcv1.SyncToolRequest{Name: "billing"})
		if err != nil || sy.GetChanged() || sy.GetTool().GetVersion() != 1 {
			t.Fatalf("SyncTool: %v %v", sy, err)
		}
	})
}

// fakeMCP is an MCP server behind the connectors' MCPClient interface, for
// the glue's end-to-end test (the protocol itself is tested with real
// servers in internal/tools/mcp).
type fakeMCP struct {
	mu       sync.Mutex
	list     []connector.ServerTool
	calls    []string
	onChange func()
}

func (f *fakeMCP) dial(cfg connhost.MCPConfig, _ secrets.Store, _ *slog.Logger) (connhost.MCPClient, error) {
	return f, nil
}

func (f *fakeMCP) Tools(context.Context) ([]connector.ServerTool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]connector.ServerTool(nil), f.list...), nil
}

func (f *fakeMCP) Call(_ context.Context, name string, args json.RawMessage) (*toolkit.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	return toolkit.OK(map[string]any{"server_tool": name, "args": json.RawMessage(args)}, "done by "+name), nil
}

func (f *fakeMCP) OnListChanged(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onChange = fn
}

func (f *fakeMCP) Close() error { return nil }

func (f *fakeMCP) Problem() string { return "" }

func (f *fakeMCP) change(list []connector.ServerTool) {
	f.mu.Lock()
	f.list = list
	fn := f.onChange
	f.mu.Unlock()
	fn()
}

func (f *fakeMCP) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func mcpList(deleteSchema string) []connector.ServerTool {
	yes := true
	return []connector.ServerTool{
		{Action: "read_file", Name: "Read File", Description: "Read a file", Annotations: connector.Annotations{ReadOnly: &yes},
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)},
		{Action: "delete_file", Name: "Delete File", Description: "Delete a file", Annotations: connector.Annotations{Destructive: &yes},
			InputSchema: json.RawMessage(deleteSchema)},
		{Action: "post", Name: "post", Description: "Post to the web", Annotations: connector.Annotations{OpenWorld: &yes},
			InputSchema: json.RawMessage(`{"type":"object"}`)},
	}
}

// TestMCPConnectorThroughTheAPI: an MCP connector registered through the
// API offers the server's tools with risks from their annotations (the
// operator's override winning), calls reach the server tool they map to,
// and a list_changed that changes a schema makes a new version, so that an
// approval given for the old one is not consumed.
func TestMCPConnectorThroughTheAPI(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		srv := &fakeMCP{list: mcpList(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)}
		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		// The server's configuration lets operators run the files server,
		// and give it its token.
		cfg.Connectors.Stdio.AllowedCommands = []string{"/usr/local/bin/files-server"}
		cfg.Secrets.Destinations = []config.SecretDestinationConfig{{Connector: "files", Commands: []string{"/usr/local/bin/files-server"}}}
		conn, a := apptest.Start(t, cfg, app.Options{MCP: srv.dial})
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		approvals := toolsvcv1.NewApprovalServiceClient(conn)
		ops, agent := apptest.As(ctx, "ops-1"), apptest.As(ctx, "agent-1")

		_, err := reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{
			Name: "files",
			Connector: &toolsvcv1.Connector{
				Type: toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP, Command: []string{"/usr/local/bin/files-server", "/srv"},
				Env:     map[string]*toolsvcv1.ConfigValue{"API_TOKEN": {Secret: "api_token"}},
				Actions: []*toolsvcv1.ConnectorAction{{Name: "post", Risk: toolsvcv1.RiskLevel_RISK_LEVEL_CRITICAL}},
			},
		}})
		if err != nil {
			t.Fatalf("RegisterTool: %v", err)
		}
		got, err := reg.GetTool(agent, &toolsvcv1.GetToolRequest{Name: "files"})
		if err != nil {
			t.Fatal(err)
		}
		risks := map[string]toolsvcv1.RiskLevel{}
		for _, act := range got.GetTool().GetActions() {
			risks[act.GetName()] = act.GetRisk()
		}
		if risks["read_file"] != toolsvcv1.RiskLevel_RISK_LEVEL_LOW || risks["delete_file"] != toolsvcv1.RiskLevel_RISK_LEVEL_HIGH ||
			risks["post"] != toolsvcv1.RiskLevel_RISK_LEVEL_CRITICAL || got.GetTool().GetProviderType() != toolsvcv1.ProviderType_PROVIDER_TYPE_MCP {
			t.Fatalf("risks %v", risks)
		}
		if d := got.GetTool().GetConnector().GetDiscovered(); len(d) != 3 || d[0].GetAction() != "delete_file" || d[0].GetServerTool() != "Delete File" ||
			!d[0].GetAnnotations().GetDestructiveHint() || d[0].GetAnnotations().ReadOnlyHint != nil {
			t.Fatalf("discovered %v", d)
		}

		r := req(t, "files", "read_file", map[string]any{"path": "/a"}, "read-1")
		r.Context.AutonomyLevel = supervised
		resp, err := exec.ExecuteTool(agent, r)
		if err != nil || resp.GetOutcome() != succeeded || resp.GetResult().GetMessage() != "done by Read File" {
			t.Fatalf("read_file: %v %v", resp, err)
		}
		del := req(t, "files", "delete_file", map[string]any{"path": "/a"}, "delete-1")
		del.Context.AutonomyLevel = supervised
		resp, err = exec.ExecuteTool(agent, del)
		if err != nil || resp.GetOutcome() != approvalRequired {
			t.Fatalf("delete_file: %v %v", resp, err)
		}
		if _, err := approvals.ResolveApproval(apptest.As(ctx, "alice"), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: resp.GetApproval().GetApprovalId(), Decision: approve, Comment: "ok"}); err != nil {
			t.Fatal(err)
		}

		// The server's delete_file now takes a "recursive" flag.
		srv.change(mcpList(`{"type":"object","properties":{"path":{"type":"string"},"recursive":{"type":"boolean"}},"required":["path"]}`))
		testutil.Eventually(t, 15*time.Second, "a new version after list_changed", func() bool {
			g, err := reg.GetTool(agent, &toolsvcv1.GetToolRequest{Name: "files"})
			return err == nil && g.GetTool().GetVersion() == 2
		})
		evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Tool: "files", Types: []string{"tool.updated"}})
		if err != nil || len(evs) != 1 || evs[0].DetailMap()["reason"] != "discovery" {
			t.Fatalf("tool.updated: %v %+v", err, evs)
		}
		_, err = exec.ExecuteTool(agent, del)
		wantError(t, err, codes.FailedPrecondition, "APPROVAL_INVALIDATED")
		if calls := srv.called(); len(calls) != 1 || calls[0] != "Read File" {
			t.Fatalf("the server was called: %v", calls)
		}
		sy, err := reg.SyncTool(ops, &toolsvcv1.SyncToolRequest{Name: "files"})
		if err != nil || sy.GetChanged() || sy.GetTool().GetVersion() != 2 {
			t.Fatalf("SyncTool: %v %v", sy, err)
		}
	})
}
