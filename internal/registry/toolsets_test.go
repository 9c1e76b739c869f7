package registry

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/toolkit"
)

func violations(t *testing.T, err error) string {
	t.Helper()
	f, ok := fault.As(err)
	if !ok {
		t.Fatalf("not a fault: %v", err)
	}
	var out []string
	for _, v := range f.Violations {
		out = append(out, v.Field+": "+v.Description)
	}
	return strings.Join(out, "\n")
}

func TestToolsetRegistration(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)
	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	ts := &store.Toolset{Name: "talk", Title: " Talking ", Guidance: " Say it **once**.\n", Tools: []string{"echo", "echo.shout"}}
	got, created, err := r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: ts, Actor: "ops"})
	if err != nil || !created {
		t.Fatalf("RegisterToolset: %v %v", got, err)
	}
	if got.Title != "Talking" || got.Guidance != "Say it **once**." || got.Version != 1 || got.Source != store.SourceAPI {
		t.Fatalf("stored %+v", got)
	}
	if cached, err := r.GetToolset("talk"); err != nil || !reflect.DeepEqual(cached.Tools, []string{"echo", "echo.shout"}) {
		t.Fatalf("cache: %+v %v", cached, err)
	}
	evs, _ := st.ListAuditEvents(ctx, store.AuditFilter{Types: []string{audit.ToolsetRegistered}})
	if len(evs) != 1 || evs[0].Principal != "ops" || evs[0].DetailMap()["toolset"] != "talk" {
		t.Fatalf("events: %v", evs)
	}
	// Unchanged: no new version.
	if again, created, err := r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: ts}); err != nil || created || again.Version != 1 {
		t.Fatalf("unchanged: %+v %v %v", again, created, err)
	}
	// Disabled: a new version, in the cache at once.
	off := *ts
	off.Disabled = true
	if v2, _, err := r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: &off, ExpectedVersion: 1}); err != nil || v2.Version != 2 || !v2.Disabled {
		t.Fatalf("disable: %+v %v", v2, err)
	}
	if c, _ := r.GetToolset("talk"); !c.Disabled {
		t.Fatal("the cache still has it enabled")
	}
	_, _, err = r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: ts, ExpectedVersion: 1})
	wantFault(t, err, fault.FailedPrecondition, fault.ReasonVersionConflict)

	// A toolset naming an unknown tool, or an unknown action, is refused,
	// naming the toolset and the tool; nothing is written.
	bad := &store.Toolset{Name: "bad", Title: "Bad", Tools: []string{"echo.whisper", "ghost", "echo", "echo", "No.Way"}}
	_, _, err = r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: bad})
	wantFault(t, err, fault.InvalidArgument, fault.ReasonInvalidRequest)
	got2 := violations(t, err)
	for _, want := range []string{
		`toolset.tools[0]: toolset "bad" names "echo.whisper", but tool "echo" has no action "whisper"`,
		`toolset.tools[1]: toolset "bad" names tool "ghost", which is not registered`,
		`toolset.tools[3]: "echo" is listed twice`,
		`toolset.tools[4]: must be a tool's name or tool.action`,
	} {
		if !strings.Contains(got2, want) {
			t.Errorf("violations:\n%s\nwant %s", got2, want)
		}
	}
	if _, err := st.GetToolset(ctx, "bad"); err == nil {
		t.Fatal("a refused toolset was stored")
	}
	for _, tc := range []struct {
		ts   store.Toolset
		want string
	}{
		{store.Toolset{Name: "x", Tools: []string{"echo"}}, "toolset.title: is required"},
		{store.Toolset{Name: "x", Title: "a\nb", Tools: []string{"echo"}}, "toolset.title: must be one line"},
		{store.Toolset{Name: "x", Title: "T"}, "toolset.tools: at least one tool is required"},
		{store.Toolset{Name: "X!", Title: "T", Tools: []string{"echo"}}, "toolset.name: must match"},
		{store.Toolset{Name: "x", Title: "T", Guidance: strings.Repeat("é", MaxGuidance), Tools: []string{"echo"}}, "toolset.guidance: must be at most 4096 bytes"},
		{store.Toolset{Name: "x", Title: "T", Guidance: "ok \u202eevil", Tools: []string{"echo"}}, "toolset.guidance: must not contain control or bidirectional"},
		{store.Toolset{Name: "x", Title: "T", Guidance: "nul \x00", Tools: []string{"echo"}}, "toolset.guidance: must not contain NUL"},
	} {
		_, _, err := r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: &tc.ts})
		if got := violations(t, err); !strings.Contains(got, tc.want) {
			t.Errorf("%+v: %s, want %s", tc.ts, got, tc.want)
		}
	}

	// Deregistering leaves the tools alone.
	if _, err := r.DeregisterToolset(ctx, "talk", 0, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.GetToolset("talk"); err == nil {
		t.Fatal("still cached")
	}
	if _, ok := r.Lookup("echo"); !ok {
		t.Fatal("the tool went with the toolset")
	}
	_, err = r.DeregisterToolset(ctx, "talk", 0, "ops")
	wantFault(t, err, fault.NotFound, fault.ReasonToolsetNotFound)
}

func TestGuidanceValidated(t *testing.T) {
	r := newTestRegistry(t, nil)
	tool := goodTool()
	tool.Guidance = "Use it *sparingly*.\n\n- one\n- two\tthree"
	tool.Actions[0].Guidance = "Say it in English. 日本語も可。"
	if v := r.Validate(tool); len(v) > 0 {
		t.Fatalf("good guidance refused: %v", v)
	}
	tool.Guidance = strings.Repeat("x", MaxGuidance+1)
	tool.Actions[0].Guidance = "bell \a"
	tool.Actions[1].Guidance = "\xff"
	got := map[string]string{}
	for _, v := range r.Validate(tool) {
		got[v.Field] = v.Description
	}
	if !strings.Contains(got["tool.guidance"], "at most 4096 bytes") ||
		!strings.Contains(got["tool.actions[0].guidance"], "control") ||
		!strings.Contains(got["tool.actions[1].guidance"], "UTF-8") {
		t.Fatalf("violations: %v", got)
	}
}

// Two actions whose exported names would be the same are refused, naming
// both; calls by exported name resolve through the cache.
func TestExportedNames(t *testing.T) {
	ctx := context.Background()
	r := newTestRegistry(t, nil, demoProviderWith(map[string]toolkit.Tool{
		"a": impl("b__c", "a"), "a__b": impl("c"),
	}))
	mk := func(name string, actions ...string) *store.Tool {
		t := &store.Tool{Name: name, Description: "d", ProviderID: "demo", DefaultRisk: toolkit.RiskLow}
		for _, a := range actions {
			t.Actions = append(t.Actions, store.Action{Name: a, Description: "d"})
		}
		return t
	}
	if _, _, err := r.Register(ctx, RegisterParams{Tool: mk("a", "b__c", "a")}); err != nil {
		t.Fatal(err)
	}
	_, _, err := r.Register(ctx, RegisterParams{Tool: mk("a__b", "c")})
	wantFault(t, err, fault.InvalidArgument, fault.ReasonInvalidRequest)
	if got := violations(t, err); !strings.Contains(got, `tool.actions[0].name: action a__b.c would be exported as "a__b__c", which is already the exported name of a.b__c`) {
		t.Fatalf("violations: %s", got)
	}
	if _, ok := r.Lookup("a__b"); ok {
		t.Fatal("the refused tool was registered")
	}
	for name, want := range map[string]ActionRef{"a__b__c": {"a", "b__c"}, "a": {"a", "a"}} {
		ref, found, err := r.ResolveExported(name)
		if err != nil || !found || ref != want {
			t.Errorf("ResolveExported(%q) = %v %v %v", name, ref, found, err)
		}
	}
	if _, found, _ := r.ResolveExported("a__zzz"); found {
		t.Fatal("an unknown name resolved")
	}
	// Re-registering the tool itself is no collision with its own actions.
	if _, _, err := r.Register(ctx, RegisterParams{Tool: mk("a", "b__c")}); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := r.ResolveExported("a"); found {
		t.Fatal("the removed action still resolves")
	}
}

// A name two replicas registered at once resolves to neither.
func TestSharedExportedNameRefused(t *testing.T) {
	idx := exportedIndex(map[string]*Entry{
		"a":    {Tool: &store.Tool{Name: "a", Actions: []store.Action{{Name: "b__c"}}}},
		"a__b": {Tool: &store.Tool{Name: "a__b", Actions: []store.Action{{Name: "c"}}}},
	})
	r := newTestRegistry(t, nil)
	r.exported.Store(&idx)
	_, found, err := r.ResolveExported("a__b__c")
	if !found {
		t.Fatal("not found")
	}
	f := wantFault(t, err, fault.FailedPrecondition, fault.ReasonExportedNameShared)
	if !strings.Contains(f.Message, "a.b__c and a__b.c") {
		t.Fatalf("message: %s", f.Message)
	}
}

// The nulls a model writes against the strict form for optional
// properties are dropped, at every depth; required ones stay.
func TestDropNulls(t *testing.T) {
	ctx := context.Background()
	r := newTestRegistry(t, nil)
	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	e, _ := r.Lookup("echo")
	var args any
	_ = json.Unmarshal([]byte(`{"text":"hi","count":null,"colours":[{"name":null}]}`), &args)
	if !e.DropNulls("say", args) {
		t.Fatal("nothing dropped")
	}
	if got, _ := json.Marshal(args); string(got) != `{"colours":[{}],"text":"hi"}` {
		t.Fatalf("got %s", got)
	}
	if err := e.ValidateValue("say", args); err != nil {
		t.Fatalf("after dropping: %v", err)
	}
	_ = json.Unmarshal([]byte(`{"text":null}`), &args)
	if e.DropNulls("say", args) || e.DropNulls("nope", args) {
		t.Fatal("dropped a required property's null, or an unknown action's")
	}
}

func TestToolsetsFollowOtherReplicas(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := newMemoryStore(t)
	r1 := newTestRegistry(t, st)
	r2 := newTestRegistry(t, st)
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r1.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r1.RegisterToolset(ctx, RegisterToolsetParams{Toolset: &store.Toolset{Name: "t", Title: "T", Tools: []string{"echo"}}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, "replica 2 sees the toolset", func() bool {
		ts, err := r2.GetToolset("t")
		return err == nil && ts.Version == 1
	})
	if _, err := r1.DeregisterToolset(ctx, "t", 0, "ops"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, "replica 2 drops it", func() bool {
		_, err := r2.GetToolset("t")
		return err != nil
	})
	snap := r2.Snapshot()
	if len(snap.Tools) != 1 || snap.Tools[0].Name != "echo" || len(snap.Toolsets) != 0 {
		t.Fatalf("snapshot %+v", snap)
	}
}

// Concurrent registrations of toolsets leave the cache equal to the store.
func TestConcurrentToolsets(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)
	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 5 {
				ts := &store.Toolset{Name: "t", Title: "T", Tools: []string{"echo"}, Disabled: (i+j)%2 == 0}
				if _, _, err := r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: ts}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	stored, err := st.GetToolset(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	cached, _ := r.GetToolset("t")
	if cached.Version != stored.Version || cached.Disabled != stored.Disabled {
		t.Fatalf("cache %+v, store %+v", cached, stored)
	}
}

func TestToolsetsInTheToolsFile(t *testing.T) {
	defs, err := parseFileDefs("tools.yaml", []byte(`
tools:
  - name: weather
    description: Weather
    connector_id: demo
    default_risk: LOW
    guidance: Ask for the city.
    actions:
      - {name: current, description: Now, guidance: "Metric units."}
toolsets:
  - name: outdoors
    title: Outdoors
    guidance: |
      Check the weather before you plan.
    tools: [weather, echo.say]
  - name: off
    title: Off
    tools: [weather]
    disabled: true
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(defs.Toolsets) != 2 || defs.Toolsets[0].Guidance != "Check the weather before you plan.\n" || !defs.Toolsets[1].Disabled ||
		defs.Toolsets[0].Source != store.SourceFile {
		t.Fatalf("toolsets %+v", defs.Toolsets)
	}
	if defs.Tools[0].Guidance != "Ask for the city." || defs.Tools[0].Actions[0].Guidance != "Metric units." {
		t.Fatalf("tool guidance %+v", defs.Tools[0])
	}
	_, err = parseFileDefs("tools.yaml", []byte(`
toolsets:
  - name: Bad!
    tools: []
  - name: dup
    title: D
    tools: [a]
  - name: dup
    title: D
    tools: [a]
`))
	var fe *FileError
	if !errorsAs(err, &fe) {
		t.Fatalf("want a FileError, got %v", err)
	}
	all := strings.Join(fe.Problems, "\n")
	for _, want := range []string{`tools.yaml:3: toolsets[0] (name "Bad!"): toolset.name: must match`, `toolset.title: is required`,
		`toolset.tools: at least one tool is required`, `toolsets[2] (name "dup"): toolset.name: "dup" is also defined by toolsets[1]`} {
		if !strings.Contains(all, want) {
			t.Errorf("problems:\n%s\nwant %s", all, want)
		}
	}

	// Synced, the unknown tool is refused naming the toolset and the tool.
	ctx := context.Background()
	r := newTestRegistry(t, nil)
	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	rep, err := r.SyncToolsets(ctx, store.SourceFile, []*store.Toolset{
		{Name: "good", Title: "G", Tools: []string{"echo"}, Source: store.SourceFile},
		{Name: "bad", Title: "B", Tools: []string{"weather"}, Source: store.SourceFile},
	}, "toolsvc")
	if err == nil || !strings.Contains(err.Error(), `toolset "bad": toolset.tools[0]: toolset "bad" names tool "weather", which is not registered`) {
		t.Fatalf("sync error: %v", err)
	}
	if strings.Join(rep.Created, ",") != "good" {
		t.Fatalf("report %+v", rep)
	}
	// The next sync without it removes it; an API toolset stays.
	if _, _, err := r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: &store.Toolset{Name: "api", Title: "A", Tools: []string{"echo"}}}); err != nil {
		t.Fatal(err)
	}
	rep, err = r.SyncToolsets(ctx, store.SourceFile, nil, "toolsvc")
	if err != nil || strings.Join(rep.Deleted, ",") != "good" {
		t.Fatalf("second sync: %+v %v", rep, err)
	}
	if _, err := r.GetToolset("api"); err != nil {
		t.Fatal("the API toolset went")
	}
}
