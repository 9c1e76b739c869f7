package connhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools/httpconn"
	"github.com/toolsvc/toolsvc/toolkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const canary = "mcp-C4NARY-t0ken/+="

// fakeServer is an MCP server as the fake sessions see it.
type fakeServer struct {
	mu       sync.Mutex
	tools    []connector.ServerTool
	toolsErr error
	calls    []string
	sessions []*fakeSession
	dialErr  error
	// problem is what the sessions' Problem says: why none could open.
	problem string
}

type fakeSession struct {
	srv      *fakeServer
	cfg      MCPConfig
	env      map[string]string
	mu       sync.Mutex
	onChange func()
	closed   bool
}

func (s *fakeServer) dial(cfg MCPConfig, st secrets.Store, _ *slog.Logger) (MCPClient, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dialErr != nil {
		return nil, s.dialErr
	}
	// As the real client does when it starts a stdio server: the
	// environment's secrets are fetched for the connection.
	env := map[string]string{}
	for k, v := range cfg.Env {
		sec, err := v.Resolve(context.Background(), st, cfg.ID)
		if err != nil {
			return nil, err
		}
		env[k] = sec.Reveal()
	}
	fs := &fakeSession{srv: s, cfg: cfg, env: env}
	s.sessions = append(s.sessions, fs)
	return fs, nil
}

func (s *fakeServer) set(list []connector.ServerTool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tools, s.toolsErr = list, err
}

func (s *fakeServer) current() *fakeSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[len(s.sessions)-1]
}

func (f *fakeSession) Tools(ctx context.Context) ([]connector.ServerTool, error) {
	f.srv.mu.Lock()
	defer f.srv.mu.Unlock()
	if f.srv.toolsErr != nil {
		return nil, f.srv.toolsErr
	}
	out := make([]connector.ServerTool, len(f.srv.tools))
	copy(out, f.srv.tools)
	return out, nil
}

func (f *fakeSession) Call(ctx context.Context, name string, args json.RawMessage) (*toolkit.Result, error) {
	f.srv.mu.Lock()
	f.srv.calls = append(f.srv.calls, name+" "+string(args))
	f.srv.mu.Unlock()
	token := f.env["API_TOKEN"]
	switch name {
	case "Fail Hard":
		return &toolkit.Result{Success: false, Message: "server refused, token " + token}, nil
	case "Cut":
		return nil, toolkit.OutcomeUnknown(fmt.Errorf("connection reset after sending with %s", token))
	case "Down":
		return nil, toolkit.Retryable(fmt.Errorf("dial failed with env API_TOKEN=%s", token))
	case "Boom":
		panic("server tool exploded holding " + token)
	}
	return toolkit.OK(map[string]any{"tool": name, "echo": token}, "ok from "+name+" with "+token), nil
}

func (f *fakeSession) OnListChanged(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onChange = fn
}

func (f *fakeSession) changed() {
	f.mu.Lock()
	fn := f.onChange
	f.mu.Unlock()
	fn()
}

func (f *fakeSession) Problem() string {
	f.srv.mu.Lock()
	defer f.srv.mu.Unlock()
	return f.srv.problem
}

// setProblem makes the sessions unable to open (problem says why) or, with
// problem "", open but failing tools/list with err (nil: answering).
func (s *fakeServer) setProblem(problem string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.problem, s.toolsErr = problem, err
}

// logBuffer is a log sink safe for concurrent writers.
type logBuffer = testutil.Buffer

func (f *fakeSession) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

func (f *fakeSession) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

func b(v bool) *bool { return &v }

func serverTools() []connector.ServerTool {
	obj := json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)
	return []connector.ServerTool{
		{Action: "read_file", Name: "Read File", Description: "Read a file", InputSchema: obj, Annotations: connector.Annotations{ReadOnly: b(true)}},
		{Action: "delete_file", Name: "Delete File", Description: "Delete a file", InputSchema: obj, Annotations: connector.Annotations{Destructive: b(true)}},
		{Action: "fetch_url", Name: "fetch", InputSchema: obj, Annotations: connector.Annotations{ReadOnly: b(true), OpenWorld: b(true)}},
		{Action: "post", Name: "post", InputSchema: obj, Annotations: connector.Annotations{OpenWorld: b(true)}},
		{Action: "fail_hard", Name: "Fail Hard", InputSchema: obj},
		{Action: "cut", Name: "Cut", InputSchema: obj},
		{Action: "down", Name: "Down", InputSchema: obj},
		{Action: "boom", Name: "Boom", InputSchema: obj},
	}
}

func secretsStore() secrets.Store {
	return secrets.NewEnv(func(k string) (string, bool) { return canary, k == "TOOLSVC_SECRET_FILES_API_TOKEN" })
}

type rig struct {
	srv *fakeServer
	m   *Host
	reg *registry.Registry
	st  store.Store
	// resyncs counts the re-discoveries that have finished.
	resyncs *atomic.Int32
	// logs is what the Manager logged, at every level.
	logs *logBuffer
}

func newRig(t *testing.T) *rig {
	t.Helper()
	srv := &fakeServer{tools: serverTools()}
	trust := testTrust(t)
	logs := &logBuffer{}
	m := New(Options{Secrets: secretsStore(), MCP: srv.dial, Trust: trust,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	m.retryBase = 20 * time.Millisecond
	st := memory.New()
	reg, err := registry.New(registry.Options{Store: st, ConnectorHost: m, Trust: trust})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := reg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	resyncs := new(atomic.Int32)
	m.SetResync(func(ctx context.Context, id string) error {
		_, _, err := reg.Rediscover(ctx, id, "toolsvc")
		resyncs.Add(1)
		return err
	})
	t.Cleanup(func() {
		m.Close()
		cancel()
		st.Close()
	})
	return &rig{srv: srv, m: m, reg: reg, st: st, resyncs: resyncs, logs: logs}
}

// testTrust lets the API run files-server (found at /usr/bin/files-server)
// with its secrets.
func testTrust(t *testing.T) *connector.Trust {
	t.Helper()
	tr, err := connector.NewTrust(connector.TrustConfig{
		AllowedCommands: []string{"files-server"},
		Destinations:    []connector.Destination{{Connector: "files", Commands: []string{"files-server"}}},
		LookPath: func(name string) (string, error) {
			if name == "files-server" {
				return "/usr/bin/files-server", nil
			}
			return "", errors.New("not found")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func filesTool() *store.Tool {
	return &store.Tool{
		Name: "files", Description: "Files",
		Connector: &connector.Spec{
			Type: connector.TypeMCP, Command: []string{"files-server"},
			Env: map[string]secrets.Value{"API_TOKEN": {Secret: &secrets.Ref{Key: "api_token"}}},
			Actions: []connector.Action{
				{Name: "delete_file", Risk: toolkit.RiskMedium, Description: "Delete one file", PreviewAction: "read_file"},
				{Name: "fetch_url", Risk: toolkit.RiskCritical},
			},
		},
	}
}

func (r *rig) register(t *testing.T) *store.Tool {
	t.Helper()
	got, _, err := r.reg.Register(context.Background(), registry.RegisterParams{Tool: filesTool(), Actor: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func leaks(s string) bool { return strings.Contains(s, canary) || strings.Contains(s, "C4NARY") }

func TestDiscoveryGivesActionsWithRisks(t *testing.T) {
	r := newRig(t)
	got := r.register(t)
	want := map[string]toolkit.RiskLevel{
		"read_file":   toolkit.RiskLow,      // readOnlyHint
		"delete_file": toolkit.RiskMedium,   // destructiveHint says HIGH; the operator's MEDIUM wins
		"fetch_url":   toolkit.RiskCritical, // read-only and open world (MEDIUM); the operator's CRITICAL wins
		"post":        toolkit.RiskHigh,     // no hint (MEDIUM), open world +1
		"fail_hard":   toolkit.RiskMedium,   // no hint
	}
	risks := map[string]toolkit.RiskLevel{}
	for _, a := range got.Actions {
		risks[a.Name] = a.Risk
	}
	for n, w := range want {
		if risks[n] != w {
			t.Errorf("%s: risk %s, want %s", n, risks[n], w)
		}
	}
	if a := got.Action("delete_file"); a == nil || a.Description != "Delete one file" {
		t.Fatalf("the operator's description does not win: %+v", a)
	}
	if got.Connector.ServerTool("delete_file").Name != "Delete File" || !got.SupportsPreview {
		t.Fatalf("mapping or preview: %+v", got.Connector)
	}
	// The session holds the secret; the definition holds its reference.
	b, _ := json.Marshal(got)
	if leaks(string(b)) {
		t.Fatal("the stored definition holds the secret")
	}
	if r.srv.current().env["API_TOKEN"] != canary {
		t.Fatal("the session did not get its secret")
	}
}

func TestCallsGoToTheServerToolAndAreScrubbed(t *testing.T) {
	r := newRig(t)
	r.register(t)
	e, ok := r.reg.Lookup("files")
	if !ok || e.Impl == nil {
		t.Fatal("not bound")
	}
	ctx := context.Background()
	call := func(action string) (*toolkit.Result, error) {
		return e.Impl.Execute(ctx, &toolkit.Call{Tool: "files", Action: action, Arguments: json.RawMessage(`{"path":"/a"}`)})
	}
	res, err := call("delete_file")
	if err != nil || !res.Success || res.Value.(map[string]any)["tool"] != "Delete File" {
		t.Fatalf("delete_file: %v %v", res, err)
	}
	if leaks(res.Message) || res.Value.(map[string]any)["echo"] != secrets.Redacted {
		t.Fatalf("the result is not scrubbed: %+v", res)
	}
	r.srv.mu.Lock()
	last := r.srv.calls[len(r.srv.calls)-1]
	r.srv.mu.Unlock()
	if last != `Delete File {"path":"/a"}` {
		t.Fatalf("the server got %q", last)
	}

	res, err = call("fail_hard")
	if err != nil || res.Success || leaks(res.Message) || !strings.Contains(res.Message, "server refused") {
		t.Fatalf("isError: %+v %v", res, err)
	}
	_, err = call("cut")
	var un *toolkit.UnknownOutcomeError
	if !errors.As(err, &un) || leaks(err.Error()) {
		t.Fatalf("cut: %v", err)
	}
	_, err = call("down")
	if !toolkit.IsRetryable(err) || leaks(err.Error()) {
		t.Fatalf("down: %v", err)
	}
	func() {
		defer func() {
			p := recover()
			if p == nil || leaks(fmt.Sprint(p)) || !strings.Contains(fmt.Sprint(p), "exploded") {
				t.Fatalf("panic: %v", p)
			}
		}()
		_, _ = call("boom")
	}()

	// Preview: delete_file is previewed by read_file with the same arguments.
	pv := e.Impl.(toolkit.Previewer)
	pr, err := pv.Preview(ctx, &toolkit.Call{Tool: "files", Action: "delete_file", Arguments: json.RawMessage(`{"path":"/a"}`)})
	if err != nil || pr.Value.(map[string]any)["tool"] != "Read File" || leaks(pr.Message) {
		t.Fatalf("preview: %+v %v", pr, err)
	}
	if _, err := pv.Preview(ctx, &toolkit.Call{Tool: "files", Action: "post"}); err == nil {
		t.Fatal("an action without a preview mapping previewed")
	}
	// One session served it all.
	r.srv.mu.Lock()
	n := len(r.srv.sessions)
	r.srv.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d sessions", n)
	}
}

func TestListChangedBumpsTheVersion(t *testing.T) {
	r := newRig(t)
	r.register(t)
	ctx := context.Background()
	// A list_changed that changes nothing writes nothing.
	before := r.resyncs.Load()
	r.srv.current().changed()
	testutil.Eventually(t, 5*time.Second, "the re-discovery the list_changed asked for", func() bool { return r.resyncs.Load() > before })
	if got, _ := r.reg.Get(ctx, "files"); got.Version != 1 {
		t.Fatalf("an unchanged list bumped the version to %d", got.Version)
	}
	list := serverTools()
	list[0].Annotations = connector.Annotations{Destructive: b(true)} // read_file turns destructive
	list = append(list, connector.ServerTool{Action: "new_tool", Name: "new_tool", InputSchema: json.RawMessage(`{"type":"object"}`)})
	r.srv.set(list, nil)
	r.srv.current().changed()
	testutil.Eventually(t, 5*time.Second, "the tool's version is bumped", func() bool {
		got, _ := r.reg.Get(ctx, "files")
		return got.Version == 2
	})
	got, _ := r.reg.Get(ctx, "files")
	if got.Action("new_tool") == nil || got.Action("read_file").Risk != toolkit.RiskHigh {
		t.Fatalf("after list_changed: %+v", got.Actions)
	}
	evs, err := r.st.ListAuditEvents(ctx, store.AuditFilter{Tool: "files", Types: []string{audit.ToolUpdated}})
	if err != nil || len(evs) != 1 || evs[0].DetailMap()["reason"] != registry.ReasonDiscovery || evs[0].DetailMap()["version"] != int64(2) && evs[0].DetailMap()["version"] != float64(2) {
		t.Fatalf("audit: %v %+v", err, evs)
	}
}

// TestListChangedBeforeRegistration: a server may say its list changed as
// soon as its session opens, before the tool it serves is stored (the tools
// file's sync discovers first, then stores). That re-discovery finds no
// tool: nothing is wrong, and nothing is logged as a failure.
func TestListChangedBeforeRegistration(t *testing.T) {
	r := newRig(t)
	if _, err := r.m.Discover(context.Background(), filesTool()); err != nil {
		t.Fatal(err)
	}
	r.srv.current().changed()
	testutil.Eventually(t, 5*time.Second, "the re-discovery the list_changed asked for", func() bool { return r.resyncs.Load() > 0 })
	logs := r.logs.String()
	if strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "found no stored tool yet") {
		t.Fatalf("a list_changed before registration logged:\n%s", logs)
	}
}

// TestFailingConnectorLoggedOnce: a connector whose session cannot open
// is logged by the session, at each attempt (why, when it tries again);
// the re-discoveries it fails are not logged again. A server that answers
// but fails to list its tools is logged by the Manager.
func TestFailingConnectorLoggedOnce(t *testing.T) {
	r := newRig(t)
	r.register(t)
	r.srv.setProblem("cannot start files-server: exit status 1", errors.New("no session with the server before the deadline"))
	before := r.resyncs.Load()
	r.m.Resync("files")
	testutil.Eventually(t, 5*time.Second, "a failed re-discovery", func() bool { return r.resyncs.Load() > before })
	if logs := r.logs.String(); strings.Contains(logs, `level=WARN msg="MCP re-discovery failed"`) {
		t.Fatalf("a session's failure logged again by the Manager:\n%s", logs)
	}

	r.srv.setProblem("", errors.New("tools/list: internal error"))
	before = r.resyncs.Load()
	r.m.Resync("files")
	testutil.Eventually(t, 5*time.Second, "a failed re-discovery", func() bool { return r.resyncs.Load() > before })
	if logs := r.logs.String(); !strings.Contains(logs, `level=WARN msg="MCP re-discovery failed"`) || !strings.Contains(logs, "tools/list: internal error") {
		t.Fatalf("a failing tools/list was not logged:\n%s", logs)
	}
}

func TestFailedDiscoveryIsRetried(t *testing.T) {
	r := newRig(t)
	r.srv.set(nil, fmt.Errorf("server crashed printing %s", canary))
	ctx := context.Background()
	_, err := r.m.Discover(ctx, filesTool())
	if err == nil || leaks(err.Error()) {
		t.Fatalf("discovery of a failing server: %v", err)
	}
	// The tools file declares it: registered without actions.
	if _, err := r.reg.Sync(ctx, store.SourceFile, []*store.Tool{filesTool()}, "toolsvc"); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.reg.Get(ctx, "files"); len(got.Actions) != 0 {
		t.Fatalf("actions before discovery: %v", got.Actions)
	}
	r.srv.set(serverTools(), nil)
	testutil.Eventually(t, 5*time.Second, "a retry discovers the tools", func() bool {
		got, _ := r.reg.Get(ctx, "files")
		return len(got.Actions) == len(serverTools())
	})
}

func TestSessionFollowsTheDefinition(t *testing.T) {
	r := newRig(t)
	r.register(t)
	first := r.srv.current()
	def := filesTool()
	def.Connector.Command = []string{"files-server", "--v2"}
	if _, _, err := r.reg.Register(context.Background(), registry.RegisterParams{Tool: def, Actor: "ops"}); err != nil {
		t.Fatal(err)
	}
	second := r.srv.current()
	if second == first || !first.isClosed() || second.cfg.Command[1] != "--v2" {
		t.Fatal("a changed definition kept the old session")
	}
	// A list_changed from the replaced session is ignored.
	first.changed()
	// Deregistering the connector ends its session.
	if _, err := r.reg.Deregister(context.Background(), "files", 0, "ops"); err != nil {
		t.Fatal(err)
	}
	if !second.isClosed() {
		t.Fatal("a deregistered connector kept its session")
	}
	r.register(t)
	third := r.srv.current()
	r.m.Close()
	if !third.isClosed() {
		t.Fatal("Close left a session open")
	}
}

func TestBindWithoutMCPAndHTTP(t *testing.T) {
	m := New(Options{})
	defer m.Close()
	if _, err := m.Bind(filesTool()); !errors.Is(err, ErrNoMCP) {
		t.Fatalf("MCP without a dialer: %v", err)
	}
	impl, err := m.Bind(&store.Tool{Name: "api", Connector: &connector.Spec{Type: "http", BaseURL: "https://api.example.com",
		Actions: []connector.Action{{Name: "get", Description: "Get", Method: "GET", Path: "/x"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := impl.(*httpconn.Tool); !ok {
		t.Fatalf("http binds to %T", impl)
	}
	srv := &fakeServer{dialErr: errors.New("exec: server.js: not found")}
	m2 := New(Options{MCP: srv.dial, Trust: testTrust(t)})
	defer m2.Close()
	impl, err = m2.Bind(filesTool())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := impl.Execute(context.Background(), &toolkit.Call{Action: "read_file"}); err == nil {
		t.Fatal("an action that was never discovered ran")
	}
}

// TestFailedDialIsRetried: a session that cannot be opened (a program not
// installed yet, a secret not set yet) is tried again.
func TestFailedDialIsRetried(t *testing.T) {
	r := newRig(t)
	r.srv.mu.Lock()
	r.srv.dialErr = errors.New("exec: files-server: not found")
	r.srv.mu.Unlock()
	ctx := context.Background()
	if _, err := r.reg.Sync(ctx, store.SourceFile, []*store.Tool{filesTool()}, "toolsvc"); err != nil {
		t.Fatal(err)
	}
	r.srv.mu.Lock()
	r.srv.dialErr = nil
	r.srv.mu.Unlock()
	testutil.Eventually(t, 5*time.Second, "a retry opens the session and discovers", func() bool {
		got, _ := r.reg.Get(ctx, "files")
		return len(got.Actions) == len(serverTools())
	})
}

// TestProbeLeavesNothingBehind: a probe of a server that does not answer
// closes what it opened and schedules nothing; one that answers is closed
// unless the definition was stored, and then replaces the connector's
// session.
func TestProbeLeavesNothingBehind(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.srv.set(nil, fmt.Errorf("no MCP here, token %s", canary))
	_, done, err := r.m.Probe(ctx, filesTool())
	done(true) // a no-op after a failure
	if err == nil || leaks(err.Error()) {
		t.Fatalf("a probe of a failing server: %v", err)
	}
	if s := r.srv.current(); !s.isClosed() {
		t.Fatal("the failed probe's session is open")
	}
	r.m.mu.Lock()
	sessions, timers := len(r.m.sessions), 0
	for _, st := range r.m.syncs {
		if st.timer != nil {
			timers++
		}
	}
	r.m.mu.Unlock()
	if sessions != 0 || timers != 0 {
		t.Fatalf("after a failed probe: %d sessions, %d retries scheduled", sessions, timers)
	}

	r.srv.set(serverTools(), nil)
	list, done, err := r.m.Probe(ctx, filesTool())
	if err != nil || len(list) != len(serverTools()) {
		t.Fatalf("probe: %d tools, %v", len(list), err)
	}
	probed := r.srv.current()
	done(false)
	if !probed.isClosed() {
		t.Fatal("a probe whose definition was not stored kept its session")
	}
	stored := r.register(t) // probes, and keeps the session
	kept := r.srv.current()
	if kept.isClosed() || stored.Version != 1 {
		t.Fatal("the stored definition's probe session was closed")
	}
	// Its calls use that session: no other is opened.
	e, _ := r.reg.Lookup("files")
	if _, err := e.Impl.Execute(ctx, &toolkit.Call{Tool: "files", Action: "read_file", Arguments: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if r.srv.current() != kept {
		t.Fatal("a call opened another session")
	}
}

// problemSession is a session that cannot be opened.
type problemSession struct{ fakeSession }

func (*problemSession) Problem() string {
	return "cannot start the server: exec: no such file or directory"
}

// TestProblemTellsWhyAConnectorCannotServe: a discovery that fails is the
// connector's problem (told to OnProblem once) until one succeeds; a
// session that cannot be opened says why itself.
func TestProblemTellsWhyAConnectorCannotServe(t *testing.T) {
	var mu sync.Mutex
	var told []string
	srv := &fakeServer{toolsErr: errors.New("listing failed")}
	m := New(Options{Secrets: secretsStore(), Trust: testTrust(t), MCP: srv.dial, OnProblem: func(id, why string) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, id+": "+why)
	}})
	defer m.Close()
	ctx := context.Background()
	def := filesTool()
	def.Source = store.SourceFile
	for range 2 {
		if _, err := m.Discover(ctx, def); err == nil {
			t.Fatal("discovery of a failing server succeeded")
		}
	}
	if p := m.Problem("files"); p != "" {
		// The fake session is open: it has no problem of its own.
		t.Fatalf("Problem = %q while the session is open", p)
	}
	srv.set(serverTools(), nil)
	if _, err := m.Discover(ctx, def); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := strings.Join(told, "\n")
	mu.Unlock()
	if got != "files: listing failed\nfiles: " {
		t.Fatalf("OnProblem was told:\n%s", got)
	}

	// A client that says why it has no session.
	dial := func(cfg MCPConfig, st secrets.Store, log *slog.Logger) (MCPClient, error) {
		return &problemSession{fakeSession{srv: srv, cfg: cfg}}, nil
	}
	m2 := New(Options{Trust: testTrust(t), MCP: dial})
	defer m2.Close()
	if _, err := m2.Discover(ctx, def); err != nil {
		t.Fatal(err)
	}
	if p := m2.Problem("files"); !strings.Contains(p, "no such file or directory") {
		t.Fatalf("Problem = %q", p)
	}
	// A definition the trust rules refuse is never opened.
	api := filesTool()
	api.Connector.Command = []string{"/bin/sh", "-c", "id"}
	if _, err := m.Discover(ctx, api); err == nil || !strings.Contains(err.Error(), "may not run") {
		t.Fatalf("an untrusted definition: %v", err)
	}
	if _, err := m.Bind(api); err == nil {
		t.Fatal("an untrusted definition was bound")
	}
}
