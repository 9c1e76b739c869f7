package registry

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// fakeConnectors binds every connector to a fake tool and answers
// discoveries with what the test set.
type fakeConnectors struct {
	mu        sync.Mutex
	list      []connector.ServerTool
	err       error
	discovers int
	asked     []string // the URL or command of each discovery
	forgot    []string
	probes    []bool // what each probe's done was told (kept or not)
	problem   string
}

var _ tools.ConnectorHost = (*fakeConnectors)(nil)

func (f *fakeConnectors) Bind(def *store.Tool) (toolkit.Tool, error) {
	if strings.Contains(def.Connector.BaseURL, "unbindable") {
		return nil, errors.New("cannot serve this base URL")
	}
	return impl(), nil
}

func (f *fakeConnectors) Discover(_ context.Context, def *store.Tool) ([]connector.ServerTool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.discovers++
	f.asked = append(f.asked, def.Connector.URL+strings.Join(def.Connector.Command, " "))
	if f.err != nil {
		return nil, f.err
	}
	out := make([]connector.ServerTool, len(f.list))
	copy(out, f.list)
	return out, nil
}

func (f *fakeConnectors) Probe(ctx context.Context, def *store.Tool) ([]connector.ServerTool, func(bool), error) {
	list, err := f.Discover(ctx, def)
	if err != nil {
		return nil, func(bool) {}, err
	}
	return list, func(keep bool) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.probes = append(f.probes, keep)
	}, nil
}

func (f *fakeConnectors) Problem(string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.problem
}

func (f *fakeConnectors) Forget(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgot = append(f.forgot, id)
}

func (f *fakeConnectors) set(list []connector.ServerTool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list, f.err = list, err
}

func yes() *bool { b := true; return &b }

func serverTools() []connector.ServerTool {
	return []connector.ServerTool{
		{Action: "write_file", Name: "Write File", Description: "Write a file", Annotations: connector.Annotations{Destructive: yes()},
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path"]}`)},
		{Action: "read_file", Name: "read_file", Description: "Read a file", Annotations: connector.Annotations{ReadOnly: yes()},
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)},
		{Action: "search", Name: "search", Annotations: connector.Annotations{ReadOnly: yes(), OpenWorld: yes()}},
		{Action: "bad", Name: "bad", InputSchema: json.RawMessage(`{"type":"string"}`)},
		{Action: "Bad Name", Name: "Bad Name"},
		{Name: "huge", Problem: "its input schema is larger than 65536 bytes"}, // left out by the client
	}
}

func mcpTool() *store.Tool {
	return &store.Tool{
		Name: "files", Description: "Files of the shared drive", RequiredScopes: []string{"files"},
		Connector: &connector.Spec{
			Type: "MCP", URL: "http://127.0.0.1:9/mcp",
			Headers: map[string]secrets.Value{"Authorization": {Secret: &secrets.Ref{Key: "token", Prefix: "Bearer "}}},
			Actions: []connector.Action{{Name: "write_file", Risk: toolkit.RiskCritical, PreviewAction: "read_file"}},
			// What a caller says was discovered is not believed.
			Discovered: []connector.ServerTool{{Action: "fake", Name: "fake"}},
		},
	}
}

func backends(t *testing.T, fn func(t *testing.T, st store.Store)) {
	t.Run("memory", func(t *testing.T) { t.Parallel(); fn(t, memory.New()) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); fn(t, pgtest.NewStore(t)) })
}

func newConnectorRegistry(t *testing.T, st store.Store, fc *fakeConnectors) *Registry {
	t.Helper()
	r, err := New(Options{Store: st, Providers: []tools.Provider{demoProvider()}, ConnectorHost: fc, Now: fixedClock(), Trust: openTrust(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// openTrust lets the connectors of these tests send their secrets where
// they point and run the programs they name.
func openTrust(t *testing.T) *connector.Trust {
	t.Helper()
	tr, err := connector.NewTrust(connector.TrustConfig{
		AllowedCommands: []string{"/usr/bin/files-server"},
		Destinations: []connector.Destination{
			{Connector: "files", Hosts: []string{"127.0.0.1", "files.example.com"}, Commands: []string{"/usr/bin/files-server"}},
			{Connector: "billing", Hosts: []string{"api.example.com", "127.0.0.1"}},
			{Connector: "files3", Hosts: []string{"127.0.0.1"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func actionRisks(tl *store.Tool) map[string]toolkit.RiskLevel {
	out := map[string]toolkit.RiskLevel{}
	for _, a := range tl.Actions {
		out[a.Name] = a.Risk
	}
	return out
}

func TestRegisterMCPConnectorDiscovers(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := t.Context()
		fc := &fakeConnectors{list: serverTools()}
		r := newConnectorRegistry(t, st, fc)
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		got, created, err := r.Register(ctx, RegisterParams{Tool: mcpTool(), Actor: "ops"})
		if err != nil || !created {
			t.Fatalf("Register: %v", err)
		}
		if got.ProviderID != "files" || got.ProviderType != store.ProviderMCP || got.Connector.Type != connector.TypeMCP ||
			got.Connector.Transport != connector.TransportHTTP || got.DefaultRisk != toolkit.RiskLow || !got.SupportsPreview {
			t.Fatalf("derived fields: %+v", got)
		}
		want := map[string]toolkit.RiskLevel{"read_file": toolkit.RiskLow, "search": toolkit.RiskMedium, "write_file": toolkit.RiskCritical}
		if risks := actionRisks(got); len(risks) != 3 || risks["read_file"] != want["read_file"] || risks["search"] != want["search"] || risks["write_file"] != want["write_file"] {
			t.Fatalf("actions and risks: %v, want %v", risks, want)
		}
		var problems []string
		for _, d := range got.Connector.Discovered {
			if d.Problem != "" {
				problems = append(problems, d.Action)
			}
			if d.Action == "fake" {
				t.Fatal("the caller's discovered list was kept")
			}
		}
		if strings.Join(problems, ",") != ",Bad Name,bad" {
			t.Fatalf("problems: %v", got.Connector.Discovered)
		}
		if st := got.Connector.ServerTool("write_file"); st == nil || st.Name != "Write File" {
			t.Fatalf("the mapping of names is not kept: %+v", st)
		}
		// The secret stays a reference.
		if h := got.Connector.Headers["Authorization"]; h.Secret == nil || h.Secret.Key != "token" || h.Literal != "" {
			t.Fatalf("header: %+v", h)
		}
		e, ok := r.Lookup("files")
		if !ok || e.Impl == nil {
			t.Fatal("not bound")
		}
		if err := e.ValidateArguments("write_file", []byte(`{"path":"/a","x":1}`)); err == nil {
			t.Fatal("the discovered schema is not enforced")
		}

		// Registering the same definition again asks again and changes
		// nothing.
		again, created, err := r.Register(ctx, RegisterParams{Tool: mcpTool(), Actor: "ops"})
		if err != nil || created || again.Version != 1 {
			t.Fatalf("re-register: version %d, %v", again.Version, err)
		}

		// The server is down: an override change still registers, with
		// what was discovered before from the same server.
		fc.set(nil, errors.New("connection refused"))
		def := mcpTool()
		def.Description = "Files, described anew"
		upd, _, err := r.Register(ctx, RegisterParams{Tool: def, Actor: "ops"})
		if err != nil || upd.Version != 2 || len(upd.Actions) != 3 {
			t.Fatalf("register while the server is down: %v %+v", err, upd)
		}
		// Another server that cannot be reached: refused, nothing written.
		def = mcpTool()
		def.Connector.URL = "http://127.0.0.1:10/mcp"
		_, _, err = r.Register(ctx, RegisterParams{Tool: def, Actor: "ops"})
		if f, ok := fault.As(err); !ok || f.Reason != fault.ReasonConnectorUnavailable || !strings.Contains(f.Message, "connection refused") {
			t.Fatalf("unreachable new server: %v", err)
		}
		if cur, _ := r.Get(ctx, "files"); cur.Version != 2 || cur.Connector.URL != "http://127.0.0.1:9/mcp" {
			t.Fatalf("a refused registration changed the tool: %+v", cur)
		}
	})
}

func TestRediscoverBumpsVersionOnChange(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := t.Context()
		fc := &fakeConnectors{list: serverTools()}
		r := newConnectorRegistry(t, st, fc)
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.Register(ctx, RegisterParams{Tool: mcpTool(), Actor: "ops"}); err != nil {
			t.Fatal(err)
		}
		// Unchanged: no new version, no event.
		got, changed, err := r.Rediscover(ctx, "files", "toolsvc")
		if err != nil || changed || got.Version != 1 {
			t.Fatalf("unchanged rediscovery: %v %v %d", err, changed, got.Version)
		}
		// The same schema with its keys in another order is no change.
		list := serverTools()
		list[1].InputSchema = json.RawMessage(`{"properties":{"path":{"type":"string"}},"type":"object"}`)
		fc.set(list, nil)
		if _, changed, _ := r.Rediscover(ctx, "files", "toolsvc"); changed {
			t.Fatal("reordered keys bumped the version")
		}
		// A changed annotation: read_file becomes destructive.
		list[1].Annotations = connector.Annotations{Destructive: yes()}
		fc.set(list, nil)
		got, changed, err = r.Rediscover(ctx, "files", "toolsvc")
		if err != nil || !changed || got.Version != 2 || actionRisks(got)["read_file"] != toolkit.RiskHigh {
			t.Fatalf("changed annotation: %v %v %+v", err, changed, got)
		}
		// A changed schema.
		list[0].InputSchema = json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)
		fc.set(list, nil)
		got, changed, err = r.Rediscover(ctx, "files", "toolsvc")
		if err != nil || !changed || got.Version != 3 {
			t.Fatalf("changed schema: %v %v %d", err, changed, got.Version)
		}
		evs, err := st.ListAuditEvents(ctx, store.AuditFilter{Tool: "files", Types: []string{audit.ToolUpdated}})
		if err != nil || len(evs) != 2 {
			t.Fatalf("tool.updated events: %d, %v", len(evs), err)
		}
		for _, ev := range evs {
			if ev.DetailMap()["reason"] != ReasonDiscovery || ev.Principal != "toolsvc" {
				t.Fatalf("event %+v", ev)
			}
		}
		// A server that does not answer: the tool stays as it was.
		fc.set(nil, errors.New("dial tcp: connection refused"))
		if _, _, err := r.Rediscover(ctx, "files", "toolsvc"); !isReason(err, fault.ReasonConnectorUnavailable) {
			t.Fatalf("rediscovery of a dead server: %v", err)
		}
		if _, _, err := r.Rediscover(ctx, "nope", "toolsvc"); !isReason(err, fault.ReasonToolNotFound) {
			t.Fatalf("unknown tool: %v", err)
		}
		if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool(), Actor: "ops"}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.Rediscover(ctx, "echo", "toolsvc"); !isReason(err, fault.ReasonNotAConnector) {
			t.Fatalf("a native tool: %v", err)
		}
	})
}

func isReason(err error, reason string) bool {
	f, ok := fault.As(err)
	return ok && f.Reason == reason
}

// TestSyncMCPConnectorWhileServerIsDown: the file's connector is registered
// without actions, and gets them from the first discovery that succeeds.
func TestSyncMCPConnectorWhileServerIsDown(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := t.Context()
		fc := &fakeConnectors{err: errors.New("no such file: server.js")}
		r := newConnectorRegistry(t, st, fc)
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defs, err := parseFile("tools.yaml", []byte(`
connectors:
  - id: files
    type: mcp
    command: [node, server.js]
    env: {API_TOKEN: {secret: api_token}}
`))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := r.Sync(ctx, store.SourceFile, defs, "toolsvc")
		if err != nil || len(rep.Created) != 1 {
			t.Fatalf("sync: %+v %v", rep, err)
		}
		got, _ := r.Get(ctx, "files")
		if len(got.Actions) != 0 || got.Source != store.SourceFile {
			t.Fatalf("undiscovered tool: %+v", got)
		}
		fc.set(serverTools(), nil)
		got, changed, err := r.Rediscover(ctx, "files", "toolsvc")
		if err != nil || !changed || len(got.Actions) != 3 || got.Source != store.SourceFile {
			t.Fatalf("first discovery: %v %+v", err, got)
		}
		// The next start with the server down keeps what it discovered.
		fc.set(nil, errors.New("down"))
		rep, err = r.Sync(ctx, store.SourceFile, defs, "toolsvc")
		if err != nil || len(rep.Unchanged) != 1 {
			t.Fatalf("sync while down: %+v %v", rep, err)
		}
		if got, _ := r.Get(ctx, "files"); len(got.Actions) != 3 {
			t.Fatal("a sync while the server is down dropped the actions")
		}
	})
}

func TestRegisterHTTPConnector(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := t.Context()
		r := newConnectorRegistry(t, st, &fakeConnectors{})
		def := &store.Tool{
			Name: "billing", Description: "Billing API",
			Connector: &connector.Spec{
				Type: connector.TypeHTTP, BaseURL: "https://api.example.com/v1",
				Auth: &connector.Auth{Bearer: &secrets.Ref{Key: "api_key"}},
				Actions: []connector.Action{
					{Name: "get_invoice", Description: "Read an invoice", Method: "get", Path: "/invoices/{id}", Risk: toolkit.RiskLow},
					{Name: "pay", Description: "Pay an invoice", Method: "POST", Path: "/invoices/{id}/pay", Body: []string{"amount"},
						InputSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"number"}},"required":["id","amount"]}`)},
				},
			},
		}
		got, created, err := r.Register(ctx, RegisterParams{Tool: def, Actor: "ops"})
		if err != nil || !created {
			t.Fatalf("Register: %v", err)
		}
		if got.ProviderType != store.ProviderInProcess || got.DefaultRisk != toolkit.RiskMedium || !got.SupportsPreview || len(got.Actions) != 2 ||
			got.Actions[0].Risk != toolkit.RiskLow || got.Actions[1].Risk != toolkit.RiskUnspecified || got.Connector.Actions[0].Method != "GET" {
			t.Fatalf("stored: %+v", got)
		}
		if _, _, err := r.Rediscover(ctx, "billing", "ops"); err != nil {
			t.Fatalf("an http connector has nothing to discover: %v", err)
		}
		// Problems are named where the definition has them.
		bad := def.Clone()
		bad.ProviderID = "other"
		bad.ProviderType = store.ProviderMCP
		bad.Connector.Actions[1].InputSchema = json.RawMessage(`{"type":"object","properties":{"id":{"type":"strin"}},"required":["id"]}`)
		bad.Connector.Auth.Bearer.Prefix = "Token "
		bad.Connector.Headers = map[string]secrets.Value{"X-Api-Key": {Literal: "abc"}}
		_, _, err = r.Register(ctx, RegisterParams{Tool: bad, Actor: "ops"})
		f, ok := fault.As(err)
		if !ok {
			t.Fatalf("bad: %v", err)
		}
		fields := map[string]bool{}
		for _, v := range f.Violations {
			fields[v.Field] = true
		}
		for _, want := range []string{"tool.connector_id", "tool.provider_type", "tool.connector.actions[1].input_schema",
			"tool.connector.auth.bearer.prefix", "tool.connector.headers.X-Api-Key"} {
			if !fields[want] {
				t.Errorf("no violation of %s: %v", want, f.Violations)
			}
		}
		unbindable := def.Clone()
		unbindable.Connector.BaseURL = "https://unbindable.example.com"
		if _, _, err := r.Register(ctx, RegisterParams{Tool: unbindable, Actor: "ops"}); !isReason(err, fault.ReasonInvalidRequest) {
			t.Fatalf("an unbindable definition: %v", err)
		}
	})
}

const connectorsFile = `
tools:
  - name: echo
    description: Echo
    connector_id: demo
    default_risk: LOW
    actions: [{name: say, description: Say}]
connectors:
  - id: files
    type: mcp
    command: [node, server.js, /srv/data]
    env: {API_TOKEN: {secret: api_token}, LOG_LEVEL: info}
    connect_timeout: 5s
    required_scopes: [files]
    default_risk: medium
    expose: [read_file]
    actions:
      - name: write_file
        risk: HIGH
        preview_action: read_file
  - id: search
    type: mcp
    transport: http
    url: http://127.0.0.1:9000/mcp
    headers: {Authorization: {secret: token, prefix: "Bearer "}}
  - id: billing
    type: http
    description: Invoices
    base_url: https://api.example.com/v1
    auth: {basic: {username: svc, password: {secret: password}}}
    headers: {X-Tenant: acme}
    timeout: 20s
    max_response_bytes: 4096
    actions:
      - name: get_invoice
        description: Read one invoice
        method: GET
        path: /invoices/{id}
        query: [expand]
        risk: LOW
        input_schema:
          type: object
          properties: {id: {type: string}, expand: {type: boolean}}
          required: [id]
`

func TestLoadFileConnectors(t *testing.T) {
	defs, err := parseFile("tools.yaml", []byte(connectorsFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(defs) != 4 {
		t.Fatalf("%d definitions", len(defs))
	}
	files, search, billing := defs[1], defs[2], defs[3]
	if files.Name != "files" || files.DefaultRisk != toolkit.RiskMedium ||
		files.Source != store.SourceFile || files.Connector.ConnectTimeout.Seconds() != 5 {
		t.Fatalf("files: %+v", files)
	}
	if v := files.Connector.Env["API_TOKEN"]; v.Secret == nil || v.Secret.Key != "api_token" {
		t.Fatalf("env ref: %+v", v)
	}
	if files.Connector.Env["LOG_LEVEL"].Literal != "info" || files.Connector.Actions[0].PreviewAction != "read_file" {
		t.Fatalf("files: %+v", files.Connector)
	}
	if h := search.Connector.Headers["Authorization"]; h.Secret == nil || h.Secret.Prefix != "Bearer " {
		t.Fatalf("search header: %+v", h)
	}
	b := billing.Connector
	if b.Auth.Basic == nil || b.Auth.Basic.Username.Literal != "svc" || b.Auth.Basic.Password.Key != "password" ||
		b.MaxResponseBytes != 4096 || billing.Timeout.Seconds() != 20 || len(b.Actions[0].InputSchema) == 0 {
		t.Fatalf("billing: %+v", b)
	}
	// The definitions validate as the registry stores them.
	r := newConnectorRegistry(t, memory.New(), &fakeConnectors{list: serverTools()})
	rep, err := r.Sync(t.Context(), store.SourceFile, defs, "toolsvc")
	if err != nil || len(rep.Created) != 4 {
		t.Fatalf("sync: %+v %v", rep, err)
	}
	got, _ := r.Get(t.Context(), "files")
	if len(got.Actions) != 1 || got.Actions[0].Name != "read_file" || got.Actions[0].Risk != toolkit.RiskMedium {
		t.Fatalf("files after discovery (expose, floor): %+v", got.Actions)
	}
	if got.Description != "Tools of the MCP server files" {
		t.Fatalf("default description %q", got.Description)
	}
}

func TestLoadFileConnectorProblems(t *testing.T) {
	_, err := parseFile("tools.yaml", []byte(`
tools:
  - name: billing
    description: Clash
    connector_id: demo
    default_risk: LOW
    actions: [{name: say, description: Say}]
connectors:
  - id: files
    type: mcp
    command: [node]
    env: {API_TOKEN: literal-token}
    colour: red
  - id: billing
    type: http
    base_url: https://user:pw@api.example.com
    auth: {bearer: {secret: "../x"}}
    actions:
      - {name: get, description: Get, method: GET, path: "/a?b={c}"}
  - id: web
    type: mcp
    url: https://h/mcp
    headers: {X-Token: {secret: t, colour: x}}
`))
	var fe *FileError
	if !errors.As(err, &fe) {
		t.Fatalf("want a FileError, got %v", err)
	}
	all := strings.Join(fe.Problems, "\n")
	for _, want := range []string{
		`connectors[0] (id "files"): unknown field "colour"`,
		`connectors[0] (id "files"): env.API_TOKEN:`,
		`connectors[1] (id "billing"): base_url: must not hold a user name or password`,
		`connectors[1] (id "billing"): auth.bearer.secret:`,
		`connectors[1] (id "billing"): actions[0].path:`,
		`connectors[1] (id "billing"): id: "billing" is also defined by tools[0]`,
		`connectors[2] (id "web")`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no problem %q in:\n%s", want, all)
		}
	}
}

// TestRegisterKeepsWhatItProbedOnlyWhenStored: what a probe opened serves
// the connector only if the definition was stored; a dry run, a refusal
// after the probe and an unreachable server leave it closed, and each
// refusal is a tool.refused event.
func TestRegisterKeepsWhatItProbedOnlyWhenStored(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := t.Context()
		fc := &fakeConnectors{list: serverTools()}
		r := newConnectorRegistry(t, st, fc)
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.Register(ctx, RegisterParams{Tool: mcpTool(), Actor: "ops", ValidateOnly: true}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.Register(ctx, RegisterParams{Tool: mcpTool(), Actor: "ops"}); err != nil {
			t.Fatal(err)
		}
		// A version that does not match: refused after the probe.
		bad := mcpTool()
		bad.Description = "changed"
		if _, _, err := r.Register(ctx, RegisterParams{Tool: bad, Actor: "ops", ExpectedVersion: 7}); !isReason(err, fault.ReasonVersionConflict) {
			t.Fatalf("a version conflict: %v", err)
		}
		fc.mu.Lock()
		probes := slices.Clone(fc.probes)
		fc.mu.Unlock()
		if !slices.Equal(probes, []bool{false, true, false}) {
			t.Fatalf("probes were told %v, want dry run, stored, refused", probes)
		}
		fc.set(nil, errors.New("connection refused"))
		other := mcpTool()
		other.Name = "files3"
		_, _, err := r.Register(ctx, RegisterParams{Tool: other, Actor: "ops-2"})
		if !isReason(err, fault.ReasonConnectorUnavailable) {
			t.Fatalf("an unreachable server: %v", err)
		}
		evs, err := st.ListAuditEvents(ctx, store.AuditFilter{Types: []string{audit.ToolRefused}})
		if err != nil || len(evs) != 1 || evs[0].Tool != "files3" || evs[0].Principal != "ops-2" ||
			evs[0].DetailMap()["reason"] != fault.ReasonConnectorUnavailable || evs[0].DetailMap()["destination"] != "http://127.0.0.1:9/mcp" {
			t.Fatalf("tool.refused: %v %+v", err, evs)
		}
		if _, err := st.GetTool(ctx, "files3"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the refused tool was stored: %v", err)
		}
	})
}
