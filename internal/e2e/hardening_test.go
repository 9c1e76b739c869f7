package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// The attacks of a hostile operator and agent on connectors, through the
// API, against the MCP client toolsvc ships (no fakes): each must fail with
// a clear error or a documented behaviour, on both stores.

// hardeningCanary is the secret the attacks are after: letters whose case
// an upstream can change, and characters every escape changes.
const hardeningCanary = "Hrdn-C4nary/Tok+en=XyZ"

// recorder is an HTTP listener that records the Authorization header of
// every request it gets: where a connector's secret would land.
type recorder struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newRecorder(t *testing.T) *recorder {
	r := &recorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		r.auths = append(r.auths, req.Header.Get("Authorization"))
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auths...)
}

// hostPort is the host:port of a test server's URL.
func hostPort(raw string) string {
	u, _ := url.Parse(raw)
	return u.Host
}

// refusals returns the tool.refused events of tool.
func refusals(t *testing.T, ctx context.Context, a *app.App, tool string) []*store.AuditEvent {
	t.Helper()
	evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Tool: tool, Types: []string{"tool.refused"}})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// shortDir is a new directory with a short path: the registry takes a path
// segment as long and mixed as t.TempDir's for a random token (a
// credential) in a command.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "th")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// writeFile writes a file (0644) and returns its path.
func writeFile(t *testing.T, path, content string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestStdioCommandsComeFromTheServersConfiguration: an operator token is
// not a shell. A stdio connector whose command is /bin/sh -c (words split
// with ${IFS} to pass the whitespace checks) is refused before anything
// runs, validate_only too, and the refusal is audited; an allowed program
// is refused an environment that would make it load other code; nothing is
// stored.
func TestStdioCommandsComeFromTheServersConfiguration(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		dir := shortDir(t)
		marker := filepath.Join(dir, "pwned")
		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		cfg.Connectors.Stdio.AllowedCommands = []string{"/usr/local/bin/allowed-mcp-server"}
		conn, a := apptest.Start(t, cfg, app.Options{})
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		ops := apptest.As(ctx, "ops-1")

		shell := &toolsvcv1.Tool{Name: "files", Connector: &toolsvcv1.Connector{
			Type:    toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP,
			Command: []string{"/bin/sh", "-c", "touch${IFS}" + marker + ";cat${IFS}/proc/$PPID/environ>" + marker},
		}}
		for _, validateOnly := range []bool{true, false} {
			_, err := reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: shell, ValidateOnly: validateOnly})
			re := wantError(t, err, codes.PermissionDenied, "COMMAND_NOT_ALLOWED")
			if !strings.Contains(re.st.Message(), `"/bin/sh"`) || !strings.Contains(re.st.Message(), "connectors.stdio.allowed_commands") ||
				re.info.Metadata["command"] != "/bin/sh" {
				t.Fatalf("refusal: %s %v", re.st.Message(), re.info.Metadata)
			}
		}
		if _, err := os.Stat(marker); !os.IsNotExist(err) {
			t.Fatalf("the refused command ran: %v", err)
		}
		// A program that is allowed, but with an environment that loads
		// other code into it.
		preload := &toolsvcv1.Tool{Name: "files", Connector: &toolsvcv1.Connector{
			Type:    toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP,
			Command: []string{"/usr/local/bin/allowed-mcp-server"},
			Env:     map[string]*toolsvcv1.ConfigValue{"LD_PRELOAD": {Value: dir + "/evil.so"}},
		}}
		_, err := reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: preload})
		re := wantError(t, err, codes.PermissionDenied, "COMMAND_NOT_ALLOWED")
		if !strings.Contains(re.st.Message(), "LD_PRELOAD") {
			t.Fatalf("refusal: %s", re.st.Message())
		}
		// A relative path that would resolve against the working directory.
		rel := &toolsvcv1.Tool{Name: "files", Connector: &toolsvcv1.Connector{
			Type: toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP, Command: []string{"./allowed-mcp-server"},
		}}
		_, err = reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: rel})
		wantError(t, err, codes.PermissionDenied, "COMMAND_NOT_ALLOWED")

		_, err = reg.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "files"})
		wantError(t, err, codes.NotFound, "TOOL_NOT_FOUND")
		evs := refusals(t, ctx, a, "files")
		if len(evs) != 4 {
			t.Fatalf("%d tool.refused events, want 4: %+v", len(evs), evs)
		}
		d := evs[0].DetailMap()
		cmd, _ := d["command"].([]any)
		if evs[0].Principal != "ops-1" || d["reason"] != "COMMAND_NOT_ALLOWED" || d["validate_only"] != true ||
			len(cmd) != 3 || cmd[0] != "/bin/sh" {
			t.Fatalf("the refusal's event: %s %v", evs[0].Principal, d)
		}
	})
}

// TestRefusedRegistrationLeavesNothingRunning: a stdio server that cannot
// be spoken to, and an MCP URL that refuses, are refused as unreachable;
// the program ran once (to be asked), the URL was dialled for that one
// probe, and nothing is restarted or redialled afterwards. Each refusal is
// audited.
func TestRefusedRegistrationLeavesNothingRunning(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		dir := shortDir(t)
		starts := filepath.Join(dir, "starts")
		server := writeFile(t, filepath.Join(dir, "not-an-mcp-server"),
			"#!/bin/sh\necho started >> "+starts+"\necho 'not MCP' >&2\nexit 3\n", 0o755)
		// A listener that closes every connection it accepts, counting them.
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lis.Close() })
		var dials atomic.Int64
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				dials.Add(1)
				c.Close()
			}
		}()

		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		cfg.Connectors.Stdio.AllowedCommands = []string{server}
		conn, a := apptest.Start(t, cfg, app.Options{})
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		ops := apptest.As(ctx, "ops-1")

		_, err = reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{Name: "stdio", Connector: &toolsvcv1.Connector{
			Type: toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP, Command: []string{server}, ConnectTimeout: durationpb.New(5 * time.Second),
		}}})
		re := wantError(t, err, codes.Unavailable, "CONNECTOR_UNAVAILABLE")
		if !strings.Contains(re.st.Message(), `connector "stdio" is unavailable`) {
			t.Fatalf("refusal: %s", re.st.Message())
		}
		_, err = reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{Name: "remote", Connector: &toolsvcv1.Connector{
			Type: toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP, Url: "http://" + lis.Addr().String() + "/mcp",
			ConnectTimeout: durationpb.New(5 * time.Second),
		}}})
		wantError(t, err, codes.Unavailable, "CONNECTOR_UNAVAILABLE")
		startsNow := func() int {
			b, _ := os.ReadFile(starts)
			return strings.Count(string(b), "started")
		}
		if startsNow() != 1 || dials.Load() == 0 {
			t.Fatalf("the probes: %d starts, %d dials", startsNow(), dials.Load())
		}
		// Nothing comes back: a restart or a redial would come within the
		// first backoff (at most 250 ms), so two seconds of quiet prove it.
		probeDials := dials.Load()
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if n, d := startsNow(), dials.Load(); n != 1 || d != probeDials {
				t.Fatalf("a refused registration is still running: %d starts, %d dials (%d at the refusal)", n, d, probeDials)
			}
		}
		for _, name := range []string{"stdio", "remote"} {
			evs := refusals(t, ctx, a, name)
			if len(evs) != 1 || evs[0].DetailMap()["reason"] != "CONNECTOR_UNAVAILABLE" || evs[0].Principal != "ops-1" {
				t.Fatalf("%s: tool.refused events %+v", name, evs)
			}
			_, err := reg.GetTool(ops, &toolsvcv1.GetToolRequest{Name: name})
			wantError(t, err, codes.NotFound, "TOOL_NOT_FOUND")
		}
	})
}

// TestSecretsStayWithTheirDestination: the tools file declares the HTTP
// connector "billing" with its token; an operator tries to send that token
// to a listener of its own — by re-pointing billing, by deregistering and
// registering it again, by turning it into a stdio server, and by a new
// connector whose secret's environment variable is billing's. Every
// attempt is refused and audited, the listener never sees a request, and
// the legitimate API keeps getting the token. Changes that keep the
// destination (scopes, risks), and one the configuration allows, are
// recorded in tool.updated with what changed, never the token.
func TestSecretsStayWithTheirDestination(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		legit, second, attacker := newRecorder(t), newRecorder(t), newRecorder(t)
		toolsFile := writeFile(t, filepath.Join(t.TempDir(), "tools.yaml"), `connectors:
  - id: billing
    type: http
    base_url: `+legit.URL+`/v1
    auth: {bearer: {secret: api_key}}
    audit_payloads: true
    actions:
      - {name: get, description: Get, method: GET, path: /x, risk: LOW}
`, 0o600)
		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		cfg.ToolsFile = toolsFile
		cfg.Secrets.Destinations = []config.SecretDestinationConfig{
			// billing may also move to the second API.
			{Connector: "billing", Hosts: []string{hostPort(second.URL)}},
		}
		env := map[string]string{"TOOLSVC_SECRET_BILLING_API_KEY": hardeningCanary}
		logs := &lockedBuffer{}
		conn, a := apptest.Start(t, cfg, app.Options{
			Env:    func(k string) (string, bool) { v, ok := env[k]; return v, ok },
			Logger: slogTo(logs),
		})
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		ops := apptest.As(ctx, "ops-1")
		scan := &leakScan{}

		got, err := reg.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		fileDef := got.GetTool()
		repoint := func(base string) *toolsvcv1.Tool {
			d := protoClone(fileDef)
			d.Connector.BaseUrl = base
			return d
		}
		// 1. Re-point the file's connector.
		_, err = reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: repoint(attacker.URL + "/v1")})
		re := wantError(t, err, codes.PermissionDenied, "SECRET_DESTINATION_NOT_ALLOWED")
		if re.info.Metadata["secrets"] != "api_key" || !strings.Contains(re.st.Message(), attacker.URL) {
			t.Fatalf("refusal: %s %v", re.st.Message(), re.info.Metadata)
		}
		// 2. Turn it into a stdio server that is handed the token.
		stdio := &toolsvcv1.Tool{Name: "billing", Connector: &toolsvcv1.Connector{
			Type: toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP, Command: []string{"/usr/bin/env"},
			Env: map[string]*toolsvcv1.ConfigValue{"KEY": {Secret: "api_key"}},
		}}
		_, err = reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: stdio})
		wantError(t, err, codes.PermissionDenied, "COMMAND_NOT_ALLOWED")
		// 3. A new connector whose secret is read from billing's variable:
		// billing-api + key is TOOLSVC_SECRET_BILLING_API_KEY.
		collide := repoint(attacker.URL)
		collide.Name, collide.ConnectorId = "billing-api", ""
		collide.Connector.Auth = &toolsvcv1.HttpAuth{Kind: &toolsvcv1.HttpAuth_Bearer{Bearer: &toolsvcv1.SecretRef{Secret: "key"}}}
		_, err = reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: collide})
		re = wantError(t, err, codes.FailedPrecondition, "SECRET_NAME_COLLISION")
		if re.info.Metadata["variable"] != "TOOLSVC_SECRET_BILLING_API_KEY" || re.info.Metadata["other"] != "billing" {
			t.Fatalf("collision: %v", re.info.Metadata)
		}
		// 4. Deregister billing and register it again, pointing elsewhere:
		// the tools file still says where its token goes.
		if _, err := reg.DeregisterTool(ops, &toolsvcv1.DeregisterToolRequest{Name: "billing"}); err != nil {
			t.Fatal(err)
		}
		_, err = reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: repoint(attacker.URL + "/v1")})
		wantError(t, err, codes.PermissionDenied, "SECRET_DESTINATION_NOT_ALLOWED")
		_, err = reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: collide})
		wantError(t, err, codes.FailedPrecondition, "SECRET_NAME_COLLISION")

		// Registered again as the file has it; then changes that keep the
		// destination, and one the configuration allows.
		if _, err := reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: repoint(legit.URL + "/v1")}); err != nil {
			t.Fatal(err)
		}
		scoped := repoint(legit.URL + "/v1")
		scoped.RequiredScopes = []string{"billing"}
		scoped.Connector.Actions[0].Risk = toolsvcv1.RiskLevel_RISK_LEVEL_MEDIUM
		if _, err := reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: scoped}); err != nil {
			t.Fatal(err)
		}
		moved := protoClone(scoped)
		moved.Connector.BaseUrl = second.URL + "/v2"
		if _, err := reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: moved}); err != nil {
			t.Fatal(err)
		}
		call := req(t, "billing", "get", nil, "after-move")
		call.Context.AutonomyLevel = autonomous
		resp, err := exec.ExecuteTool(apptest.As(ctx, "ops-1"), call)
		scan.addRPC("ExecuteTool", resp, err)
		if err != nil || resp.GetOutcome() != succeeded {
			t.Fatalf("the call after the allowed move: %v %v", resp, err)
		}
		if g := second.got(); len(g) != 1 || g[0] != "Bearer "+hardeningCanary {
			t.Fatalf("the second API got %q", g)
		}
		if g := attacker.got(); len(g) != 0 {
			t.Fatalf("the attacker's listener got %d requests: %q", len(g), g)
		}

		// The trail: each refusal, and what each update changed.
		evs := refusals(t, ctx, a, "billing")
		reasons := map[string]int{}
		for _, ev := range evs {
			reasons[fmt.Sprint(ev.DetailMap()["reason"])]++
		}
		if reasons["SECRET_DESTINATION_NOT_ALLOWED"] != 2 || reasons["COMMAND_NOT_ALLOWED"] != 1 || len(evs) != 3 {
			t.Fatalf("billing's refusals: %v", reasons)
		}
		if d := evs[0].DetailMap(); d["destination"] != attacker.URL+"/v1" || fmt.Sprint(d["secrets"]) != "[api_key]" {
			t.Fatalf("the refusal records %v", d)
		}
		if evs := refusals(t, ctx, a, "billing-api"); len(evs) != 2 || evs[0].DetailMap()["reason"] != "SECRET_NAME_COLLISION" {
			t.Fatalf("billing-api's refusals: %+v", evs)
		}
		updates, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Tool: "billing", Types: []string{"tool.updated"}})
		if err != nil || len(updates) != 2 {
			t.Fatalf("tool.updated: %v %d", err, len(updates))
		}
		var first, last map[string]any
		b, _ := json.Marshal(updates[0].DetailMap()["changes"])
		json.Unmarshal(b, &first)
		b, _ = json.Marshal(updates[1].DetailMap()["changes"])
		json.Unmarshal(b, &last)
		if fmt.Sprint(first["required_scopes"]) != "map[from:<nil> to:[billing]]" ||
			fmt.Sprint(first["action_risks"]) != "map[get:map[from:LOW to:MEDIUM]]" || first["destination"] != nil {
			t.Fatalf("the first update's changes: %v", first)
		}
		if fmt.Sprint(last["destination"]) != fmt.Sprintf("map[from:%s/v1 to:%s/v2]", legit.URL, second.URL) || len(last) != 1 {
			t.Fatalf("the move's changes: %v", last)
		}
		all, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		scan.addJSON(t, "audit", all)
		scan.add("log", logs.Bytes())
		scan.checkFor(t, hardeningCanary)
	})
}

// TestScrubbingIgnoresCaseAndEscapes: an upstream that echoes the token
// upper-cased, lower-cased, JSON-escaped, HTML-escaped or percent-encoded,
// in text/plain bodies of successes and failures, gets none of them into
// the answer, the stored call or the audit trail.
func TestScrubbingIgnoresCaseAndEscapes(t *testing.T) {
	esc := func(s string) string {
		var b strings.Builder
		for _, r := range s {
			fmt.Fprintf(&b, `\u%04X`, r)
		}
		return b.String()
	}
	html := func(s string) string {
		var b strings.Builder
		for _, r := range s {
			fmt.Fprintf(&b, "&#%d;", r)
		}
		return b.String()
	}
	echoes := map[string]string{
		"upper":   strings.ToUpper(hardeningCanary),
		"lower":   strings.ToLower(hardeningCanary),
		"json":    esc(hardeningCanary),
		"html":    html(hardeningCanary),
		"percent": strings.ToLower(url.QueryEscape(strings.ToUpper(hardeningCanary))),
		"slashes": strings.ReplaceAll(hardeningCanary, "/", `\/`),
	}
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			form := strings.TrimPrefix(r.URL.Path, "/v1/")
			if r.Header.Get("Authorization") != "Bearer "+hardeningCanary {
				http.Error(w, "no token", http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if strings.HasPrefix(form, "fail-") {
				w.WriteHeader(http.StatusForbidden)
				form = strings.TrimPrefix(form, "fail-")
			}
			fmt.Fprintf(w, "token in use: %s (end)", echoes[form])
		}))
		t.Cleanup(up.Close)
		var actions strings.Builder
		for form := range echoes {
			fmt.Fprintf(&actions, "      - {name: %s, description: Echo, method: GET, path: /%s, risk: LOW}\n", form, form)
			fmt.Fprintf(&actions, "      - {name: fail-%s, description: Echo, method: GET, path: /fail-%s, risk: LOW}\n", form, form)
		}
		toolsFile := writeFile(t, filepath.Join(t.TempDir(), "tools.yaml"), `connectors:
  - id: echoer
    type: http
    base_url: `+up.URL+`/v1
    auth: {bearer: {secret: token}}
    audit_payloads: true
    actions:
`+actions.String(), 0o600)
		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		cfg.ToolsFile = toolsFile
		logs := &lockedBuffer{}
		conn, a := apptest.Start(t, cfg, app.Options{
			Env:    func(k string) (string, bool) { return hardeningCanary, k == "TOOLSVC_SECRET_ECHOER_TOKEN" },
			Logger: slogTo(logs),
		})
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		agent := apptest.As(ctx, "agent-1")
		scan := &leakScan{}
		for form := range echoes {
			for _, action := range []string{form, "fail-" + form} {
				r := req(t, "echoer", action, nil, "k-"+action)
				r.Context.AutonomyLevel = autonomous
				resp, err := exec.ExecuteTool(agent, r)
				scan.addRPC("ExecuteTool "+action, resp, err)
				want := succeeded
				if strings.HasPrefix(action, "fail-") {
					want = failed
				}
				if err != nil || resp.GetOutcome() != want || !strings.Contains(resp.GetResult().GetMessage()+fmt.Sprint(resp.GetResult().GetValue()), "[REDACTED]") {
					t.Fatalf("%s: %v %v", action, resp, err)
				}
				c, err := exec.GetCall(agent, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "k-" + action}})
				scan.addRPC("GetCall "+action, c, err)
				sc, err := a.Store().GetCallByKey(ctx, "agent-1", "k-"+action)
				if err != nil {
					t.Fatal(err)
				}
				scan.addJSON(t, "stored call "+action, sc)
			}
		}
		evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Limit: 10000})
		if err != nil || len(evs) < 2*len(echoes) {
			t.Fatalf("audit: %v %d", err, len(evs))
		}
		scan.addJSON(t, "audit", evs)
		if backend == apptest.Postgres {
			dumpDatabase(t, ctx, cfg.DatabaseURL, scan)
		}
		scan.add("log", logs.Bytes())
		forms := []string{hardeningCanary}
		for _, e := range echoes {
			forms = append(forms, e)
		}
		scan.checkFor(t, forms...)
	})
}

// TestAgentsDoNotSeeConnectorInternals: GetTool and ListTools show an agent
// a connector's type and what it offers, never how it is reached (a stdio
// command and environment, URLs, headers, auth) or the keys of its
// secrets; an operator sees everything.
func TestAgentsDoNotSeeConnectorInternals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		toolsFile := writeFile(t, filepath.Join(t.TempDir(), "tools.yaml"), `connectors:
  - id: internal-api
    type: http
    base_url: http://billing.internal.example:8443/v1
    auth: {header: {name: X-Api-Key, value: {secret: internal_api_key}}}
    actions:
      - {name: get, description: Get, method: GET, path: /x, risk: LOW}
  - id: local-files
    type: mcp
    command: [/opt/secret-path/bin/files-server, --root, /srv/private]
    env: {FILES_TOKEN: {secret: files_token}, FILES_MODE: ro}
    connect_timeout: 1s
`, 0o600)
		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		cfg.ToolsFile = toolsFile
		cfg.Principals = []config.PrincipalConfig{
			{ID: "agent-1", Roles: []string{"agent"}},
			{ID: "approver-1", Roles: []string{"approver", "agent"}},
			{ID: "ops-1", Roles: []string{"operator"}},
		}
		conn, _ := apptest.Start(t, cfg, app.Options{})
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		internals := []string{"billing.internal.example", "X-Api-Key", "internal_api_key", "/opt/secret-path",
			"/srv/private", "FILES_TOKEN", "files_token", "FILES_MODE"}
		for _, who := range []string{"agent-1", "approver-1", "ops-1"} {
			as := apptest.As(ctx, who)
			var texts []string
			for _, name := range []string{"internal-api", "local-files"} {
				g, err := reg.GetTool(as, &toolsvcv1.GetToolRequest{Name: name})
				if err != nil {
					t.Fatalf("%s GetTool %s: %v", who, name, err)
				}
				if g.GetTool().GetConnector().GetType() == toolsvcv1.ConnectorType_CONNECTOR_TYPE_UNSPECIFIED {
					t.Fatalf("%s does not see that %s is a connector", who, name)
				}
				b, _ := protojson.Marshal(g)
				texts = append(texts, string(b))
			}
			l, err := reg.ListTools(as, &toolsvcv1.ListToolsRequest{})
			if err != nil || len(l.GetTools()) != 2 {
				t.Fatalf("%s ListTools: %v %d", who, err, len(l.GetTools()))
			}
			if len(l.GetTools()[0].GetActions()) != 1 {
				t.Fatalf("%s does not see internal-api's actions", who)
			}
			b, _ := protojson.Marshal(l)
			texts = append(texts, string(b))
			all := strings.Join(texts, "\n")
			for _, s := range internals {
				switch {
				case who == "ops-1" && !strings.Contains(all, s):
					t.Errorf("the operator does not see %q", s)
				case who != "ops-1" && strings.Contains(all, s):
					t.Errorf("%s sees %q", who, s)
				}
			}
		}
	})
}

// TestConnectorThatCannotStart: a stdio connector of the tools file whose
// program is in a directory that does not exist shows UNAVAILABLE with the
// reason as its last error, and a call answers UNAVAILABLE
// CONNECTOR_UNAVAILABLE naming the connector, audited; nothing reaches a
// tool.
func TestConnectorThatCannotStart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		missing := filepath.Join(shortDir(t), "no-such-dir", "server")
		toolsFile := writeFile(t, filepath.Join(t.TempDir(), "tools.yaml"), `connectors:
  - id: broken
    type: mcp
    command: [`+missing+`]
    connect_timeout: 2s
`, 0o600)
		cfg := apptest.Config(t, backend)
		off := false
		cfg.DemoTools = &off
		cfg.ToolsFile = toolsFile
		conn, a := apptest.Start(t, cfg, app.Options{})
		health := toolsvcv1.NewToolHealthServiceClient(conn)
		exec := toolsvcv1.NewToolExecutionServiceClient(conn)
		ops, agent := apptest.As(ctx, "ops-1"), apptest.As(ctx, "agent-1")

		var h *toolsvcv1.ToolHealth
		testutil.Eventually(t, 15*time.Second, "the broken connector's health to say so", func() bool {
			r, err := health.GetToolHealth(ops, &toolsvcv1.GetToolHealthRequest{Tool: "broken"})
			h = r.GetHealth()
			return err == nil && h.GetStatus() == toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE
		})
		if !strings.Contains(h.GetLastError(), "no such file or directory") || !strings.Contains(h.GetLastError(), missing) {
			t.Fatalf("last error %q", h.GetLastError())
		}
		for _, action := range []string{"anything", "read_file"} {
			r := req(t, "broken", action, nil, "k-"+action)
			_, err := exec.ExecuteTool(agent, r)
			re := wantError(t, err, codes.Unavailable, "CONNECTOR_UNAVAILABLE")
			if !strings.Contains(re.st.Message(), `connector "broken" is unavailable`) || !strings.Contains(re.st.Message(), "no such file or directory") ||
				re.info.Metadata["tool"] != "broken" || re.retryDelay(t) <= 0 {
				t.Fatalf("the call's refusal: %s %v", re.st.Message(), re.info.Metadata)
			}
		}
		evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Tool: "broken", Types: []string{"tool_call.rejected", "health.changed"}})
		if err != nil {
			t.Fatal(err)
		}
		var rejected, changed int
		for _, ev := range evs {
			switch ev.Type {
			case "tool_call.rejected":
				if ev.DetailMap()["reason"] == "CONNECTOR_UNAVAILABLE" {
					rejected++
				}
			case "health.changed":
				changed++
			}
		}
		// One health change: said again by every refusal, it is not
		// written again.
		if rejected != 2 || changed != 1 {
			t.Fatalf("%d rejections and %d health changes audited: %+v", rejected, changed, evs)
		}
		if _, err := a.Store().GetCallByKey(ctx, "agent-1", "k-anything"); err == nil {
			t.Fatal("a refused call was stored")
		}
	})
}

// slogTo is a debug-level JSON logger on w.
func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func protoClone(t *toolsvcv1.Tool) *toolsvcv1.Tool { return proto.Clone(t).(*toolsvcv1.Tool) }

// checkFor fails for every text of l that holds one of needles, in any
// letter case (JSON's escapes of <, > and & undone first).
func (l *leakScan) checkFor(t *testing.T, needles ...string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	unescape := strings.NewReplacer(`&`, "&", `<`, "<", `>`, ">")
	for _, text := range l.texts {
		label, body, _ := strings.Cut(text, "\x00")
		low := strings.ToLower(unescape.Replace(body))
		for _, n := range needles {
			if i := strings.Index(low, strings.ToLower(n)); i >= 0 {
				from, to := max(0, i-80), min(len(body), i+len(n)+80)
				t.Errorf("%s holds %q: …%s…", label, n, low[from:to])
			}
		}
	}
}
