package registry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

func newMemoryStore(t *testing.T) *memory.Store {
	t.Helper()
	st := memory.New()
	t.Cleanup(st.Close)
	return st
}

// toolEvents returns the tool.* audit events of a tool.
func toolEvents(t *testing.T, st store.Store, name string) []*store.AuditEvent {
	t.Helper()
	evs, err := st.ListAuditEvents(context.Background(), store.AuditFilter{Tool: name})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func checkEvent(t *testing.T, ev *store.AuditEvent, typ, actor, tool string, version int64, source store.ToolSource) {
	t.Helper()
	if ev.Type != typ || ev.Principal != actor || ev.Tool != tool {
		t.Fatalf("event %s by %s on %s, want %s by %s on %s", ev.Type, ev.Principal, ev.Tool, typ, actor, tool)
	}
	if fmt.Sprint(ev.DetailMap()["version"]) != fmt.Sprint(version) || ev.DetailMap()["source"] != string(source) {
		t.Fatalf("event detail %v, want version %d source %s", ev.Detail, version, source)
	}
	if ev.ID == "" || ev.Time.IsZero() {
		t.Fatalf("event without id or time: %+v", ev)
	}
}

func wantFault(t *testing.T, err error, kind fault.Kind, reason string) *fault.Error {
	t.Helper()
	f, ok := fault.As(err)
	if !ok || f.Kind != kind || f.Reason != reason {
		t.Fatalf("want fault %v %s, got %#v", kind, reason, err)
	}
	return f
}

func TestRegisterCreateUpdateNoop(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)

	got, created, err := r.Register(ctx, RegisterParams{Tool: goodTool(), Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if !created || got.Version != 1 || got.Source != store.SourceAPI {
		t.Fatalf("created %v version %d source %s", created, got.Version, got.Source)
	}
	stored, err := st.GetTool(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if stored.Description != "Echo text back" || stored.Timeout != DefaultTimeout || stored.ProviderType != store.ProviderInProcess {
		t.Fatalf("stored definition not normalized: %q %s %q", stored.Description, stored.Timeout, stored.ProviderType)
	}
	// The cache has it at once, without Start or a notification.
	e, ok := r.Lookup("echo")
	if !ok || e.Tool.Version != 1 || e.Impl == nil {
		t.Fatalf("Lookup after Register: %+v %v", e, ok)
	}
	if err := e.ValidateArguments("say", []byte(`{"text":"hi","colour":"red"}`)); err == nil || err.Error() != `unknown argument "colour"` {
		t.Fatalf("cached entry validates with compiled schemas: %v", err)
	}
	evs := toolEvents(t, st, "echo")
	if len(evs) != 1 {
		t.Fatalf("%d events after create", len(evs))
	}
	checkEvent(t, evs[0], audit.ToolRegistered, "alice", "echo", 1, store.SourceAPI)

	// The stored schema is the registered document, compacted, keys in the
	// order given.
	if want := `{"type":"object","properties":{"text":{"type":"string","minLength":1},"count":{"type":"integer","minimum":1},"colours":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"}}}}},"required":["text"]}`; string(got.Actions[0].InputSchema) != want {
		t.Fatalf("stored schema\n got %s\nwant %s", got.Actions[0].InputSchema, want)
	}

	// The same definition again (respaced): nothing changes.
	same := goodTool()
	same.Actions[0].InputSchema = []byte(` {"type":"object" ,"properties":{"text":{"type":"string","minLength":1},
		"count":{"type":"integer","minimum":1},"colours":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"}}}}},"required":["text"]}`)
	same.Timeout = DefaultTimeout
	got, created, err = r.Register(ctx, RegisterParams{Tool: same, Actor: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if created || got.Version != 1 {
		t.Fatalf("no-op register: created %v version %d", created, got.Version)
	}
	if evs := toolEvents(t, st, "echo"); len(evs) != 1 {
		t.Fatalf("no-op register wrote %d events", len(evs)-1)
	}

	// A change bumps the version and writes tool.updated.
	changed := goodTool()
	changed.Description = "Echo text back, louder"
	got, created, err = r.Register(ctx, RegisterParams{Tool: changed, Actor: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if created || got.Version != 2 || got.Description != "Echo text back, louder" {
		t.Fatalf("update: created %v version %d %q", created, got.Version, got.Description)
	}
	evs = toolEvents(t, st, "echo")
	if len(evs) != 2 {
		t.Fatalf("%d events after update", len(evs))
	}
	checkEvent(t, evs[1], audit.ToolUpdated, "bob", "echo", 2, store.SourceAPI)
	if e, _ := r.Lookup("echo"); e.Tool.Version != 2 {
		t.Fatalf("cache at version %d after update", e.Tool.Version)
	}
	g, err := r.Get(ctx, "echo")
	if err != nil || g.Version != 2 {
		t.Fatalf("Get = %+v, %v", g, err)
	}
	// Get returns a copy: changing it does not change the cache.
	g.Actions[0].Name = "mutated"
	if e, _ := r.Lookup("echo"); e.Tool.Actions[0].Name != "say" {
		t.Fatal("Get returned the cached tool itself")
	}

	// A reordered schema is a change too: the order of properties is what the model
	// is shown, and what agents compare.
	reordered := goodTool()
	reordered.Description = changed.Description
	reordered.Actions[0].InputSchema = []byte(`{"required":["text"],"type":"object","properties":{"count":{"minimum":1,"type":"integer"},"text":{"minLength":1,"type":"string"},"colours":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"}}}}}}`)
	got, _, err = r.Register(ctx, RegisterParams{Tool: reordered, Actor: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 3 || string(got.Actions[0].InputSchema) != string(reordered.Actions[0].InputSchema) {
		t.Fatalf("reordered: version %d schema %s", got.Version, got.Actions[0].InputSchema)
	}
}

func TestRegisterVersionConflict(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)

	_, _, err := r.Register(ctx, RegisterParams{Tool: goodTool(), ExpectedVersion: 3})
	wantFault(t, err, fault.FailedPrecondition, fault.ReasonVersionConflict)
	if _, err := st.GetTool(ctx, "echo"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("conflicting create wrote the tool: %v", err)
	}

	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	changed := goodTool()
	changed.Description = "changed"
	_, _, err = r.Register(ctx, RegisterParams{Tool: changed, ExpectedVersion: 2})
	f := wantFault(t, err, fault.FailedPrecondition, fault.ReasonVersionConflict)
	if f.Metadata["tool"] != "echo" {
		t.Fatalf("metadata %v", f.Metadata)
	}
	if cur, _ := st.GetTool(ctx, "echo"); cur.Version != 1 || cur.Description != "Echo text back" {
		t.Fatalf("conflicting update changed the tool: %+v", cur)
	}
	got, _, err := r.Register(ctx, RegisterParams{Tool: changed, ExpectedVersion: 1})
	if err != nil || got.Version != 2 {
		t.Fatalf("matching expected version: %+v %v", got, err)
	}
}

func TestRegisterValidateOnlyWritesNothing(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)

	got, created, err := r.Register(ctx, RegisterParams{Tool: goodTool(), ValidateOnly: true, Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if !created || got.Version != 1 || got.Description != "Echo text back" {
		t.Fatalf("validate-only create: %v %d %q", created, got.Version, got.Description)
	}
	if _, err := st.GetTool(ctx, "echo"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("validate-only wrote the tool: %v", err)
	}
	if _, ok := r.Lookup("echo"); ok {
		t.Fatal("validate-only changed the cache")
	}
	if evs := toolEvents(t, st, "echo"); len(evs) != 0 {
		t.Fatalf("validate-only wrote %d events", len(evs))
	}

	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	changed := goodTool()
	changed.Description = "changed"
	got, created, err = r.Register(ctx, RegisterParams{Tool: changed, ValidateOnly: true})
	if err != nil || created || got.Version != 2 {
		t.Fatalf("validate-only update: %+v %v %v", got, created, err)
	}
	if cur, _ := st.GetTool(ctx, "echo"); cur.Version != 1 {
		t.Fatalf("validate-only update wrote version %d", cur.Version)
	}
	// Invalid definitions fail validate-only too.
	bad := goodTool()
	bad.Name = "BAD"
	_, _, err = r.Register(ctx, RegisterParams{Tool: bad, ValidateOnly: true})
	wantFault(t, err, fault.InvalidArgument, fault.ReasonInvalidRequest)
}

func TestRegisterInvalidWritesNothing(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)
	bad := goodTool()
	bad.Actions[0].Examples[0].Input = []byte(`{"text":""}`)
	bad.Actions[1].Name = "say"
	_, _, err := r.Register(ctx, RegisterParams{Tool: bad, Actor: "alice"})
	f := wantFault(t, err, fault.InvalidArgument, fault.ReasonInvalidRequest)
	if !hasViolation(f.Violations, "tool.actions[0].examples[0].input", `argument "text": must be at least 1 characters long`) ||
		!hasViolation(f.Violations, "tool.actions[1].name", "duplicate") {
		t.Fatalf("violations %+v", f.Violations)
	}
	if _, err := st.GetTool(ctx, "echo"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("invalid tool written: %v", err)
	}
	all, err := st.ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil || len(all) != 0 {
		t.Fatalf("invalid register wrote events: %v %v", all, err)
	}
	if _, ok := r.Lookup("echo"); ok {
		t.Fatal("invalid tool cached")
	}
	_, _, err = r.Register(ctx, RegisterParams{Tool: nil})
	f = wantFault(t, err, fault.InvalidArgument, fault.ReasonInvalidRequest)
	if !hasViolation(f.Violations, "tool", "required") {
		t.Fatalf("nil tool: %+v", f.Violations)
	}
}

func TestStoreUnavailablePassesThrough(t *testing.T) {
	ctx := context.Background()
	r := newTestRegistry(t, downStore{newMemoryStore(t)})
	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool()}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Register: %v", err)
	}
	if _, err := r.Deregister(ctx, "echo", 0, "a"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Deregister: %v", err)
	}
	if _, err := r.List(ctx, "", 0); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("List: %v", err)
	}
	if _, err := r.Sync(ctx, store.SourceFile, nil, "a"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Sync: %v", err)
	}
	if err := r.Start(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Start: %v", err)
	}
}

func TestDeregister(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)
	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool(), Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	_, err := r.Deregister(ctx, "echo", 7, "bob")
	wantFault(t, err, fault.FailedPrecondition, fault.ReasonVersionConflict)
	if _, err := st.GetTool(ctx, "echo"); err != nil {
		t.Fatalf("conflicting deregister removed the tool: %v", err)
	}

	got, err := r.Deregister(ctx, "echo", 1, "bob")
	if err != nil || got.Name != "echo" || got.Version != 1 {
		t.Fatalf("Deregister = %+v, %v", got, err)
	}
	if _, err := st.GetTool(ctx, "echo"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("tool still stored: %v", err)
	}
	if _, ok := r.Lookup("echo"); ok {
		t.Fatal("tool still cached")
	}
	_, err = r.Get(ctx, "echo")
	wantFault(t, err, fault.NotFound, fault.ReasonToolNotFound)
	evs := toolEvents(t, st, "echo")
	if len(evs) != 2 {
		t.Fatalf("%d events", len(evs))
	}
	checkEvent(t, evs[1], audit.ToolDeregistered, "bob", "echo", 1, store.SourceAPI)

	_, err = r.Deregister(ctx, "echo", 0, "bob")
	wantFault(t, err, fault.NotFound, fault.ReasonToolNotFound)
}

// TestIncarnation: a tool gets a new incarnation when it is created, keeps
// it through updates and no-op registrations, and gets another when its
// name is registered again after a deregistration (version 1 again).
func TestIncarnation(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)
	created, _, err := r.Register(ctx, RegisterParams{Tool: goodTool(), Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if len(created.Incarnation) != 36 {
		t.Fatalf("incarnation %q", created.Incarnation)
	}
	same, _, err := r.Register(ctx, RegisterParams{Tool: goodTool(), Actor: "alice"})
	if err != nil || same.Version != 1 || same.Incarnation != created.Incarnation {
		t.Fatalf("no-op register: %+v, %v", same, err)
	}
	changed := goodTool()
	changed.Description = "changed"
	changed.Incarnation = "chosen by the caller" // ignored
	updated, _, err := r.Register(ctx, RegisterParams{Tool: changed, Actor: "alice"})
	if err != nil || updated.Version != 2 || updated.Incarnation != created.Incarnation {
		t.Fatalf("update: %+v, %v", updated, err)
	}
	if e, _ := r.Lookup("echo"); e.Tool.Incarnation != created.Incarnation {
		t.Fatalf("cached incarnation %q", e.Tool.Incarnation)
	}
	if _, err := r.Deregister(ctx, "echo", 0, "bob"); err != nil {
		t.Fatal(err)
	}
	again, isNew, err := r.Register(ctx, RegisterParams{Tool: goodTool(), Actor: "alice"})
	if err != nil || !isNew || again.Version != 1 || again.Incarnation == "" || again.Incarnation == created.Incarnation {
		t.Fatalf("registered again: %+v, %v, %v", again, isNew, err)
	}
	if e, _ := r.Lookup("echo"); e.Tool.Incarnation != again.Incarnation || e.Tool.Version != 1 {
		t.Fatalf("cache after re-registration: %+v", e.Tool)
	}
}

func TestList(t *testing.T) {
	ctx := context.Background()
	r := newTestRegistry(t, newMemoryStore(t))
	for _, name := range []string{"echo", "other", "previewer"} {
		def := goodTool()
		def.Name = name
		def.Actions = []store.Action{{Name: map[string]string{"echo": "say", "other": "say", "previewer": "run"}[name], Description: "Act"}}
		if _, _, err := r.Register(ctx, RegisterParams{Tool: def}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	page, err := r.List(ctx, "", 2)
	if err != nil || len(page) != 2 || page[0].Name != "echo" || page[1].Name != "other" {
		t.Fatalf("first page %v %v", toolNames(page), err)
	}
	page, err = r.List(ctx, "other", 2)
	if err != nil || len(page) != 1 || page[0].Name != "previewer" {
		t.Fatalf("second page %v %v", toolNames(page), err)
	}
}

func toolNames(ts []*store.Tool) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name
	}
	return out
}

func fileDef(name, action string) *store.Tool {
	return &store.Tool{
		Name: name, Description: "A file tool", ProviderID: "demo", DefaultRisk: toolkit.RiskLow,
		Actions: []store.Action{{Name: action, Description: "Act"}},
		Source:  store.SourceFile,
	}
}

func TestSync(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)

	// A tool registered through the API is never touched by a file sync.
	api := fileDef("other", "say")
	if _, _, err := r.Register(ctx, RegisterParams{Tool: api, Source: store.SourceAPI, Actor: "alice"}); err != nil {
		t.Fatal(err)
	}

	rep, err := r.Sync(ctx, store.SourceFile, []*store.Tool{fileDef("echo", "say"), fileDef("previewer", "run")}, "file-sync")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rep.Created) != "[echo previewer]" || len(rep.Updated)+len(rep.Deleted)+len(rep.Unchanged) != 0 {
		t.Fatalf("first sync: %+v", rep)
	}
	if e, ok := r.Lookup("previewer"); !ok || e.Tool.Source != store.SourceFile || !e.Tool.SupportsPreview {
		t.Fatalf("synced tool not cached as a file tool: %+v", e)
	}
	checkEvent(t, toolEvents(t, st, "echo")[0], audit.ToolRegistered, "file-sync", "echo", 1, store.SourceFile)

	// echo changes, previewer leaves the file, plain arrives.
	echo := fileDef("echo", "say")
	echo.Description = "A changed file tool"
	rep, err = r.Sync(ctx, store.SourceFile, []*store.Tool{echo, fileDef("plain", "anything")}, "file-sync")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rep.Created, rep.Updated, rep.Deleted, rep.Unchanged) != "[plain] [echo] [previewer] []" {
		t.Fatalf("second sync: %+v", rep)
	}
	if _, err := st.GetTool(ctx, "previewer"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("file tool that left the file is still stored: %v", err)
	}
	if _, ok := r.Lookup("previewer"); ok {
		t.Fatal("file tool that left the file is still cached")
	}
	evs := toolEvents(t, st, "previewer")
	checkEvent(t, evs[len(evs)-1], audit.ToolDeregistered, "file-sync", "previewer", 1, store.SourceFile)
	if cur, _ := st.GetTool(ctx, "echo"); cur.Version != 2 || cur.Description != "A changed file tool" {
		t.Fatalf("echo not updated: %+v", cur)
	}

	// Unchanged file: nothing written. A def named like the API tool is
	// reported and skipped; the API tool stays as it was.
	before, _ := st.ListAuditEvents(ctx, store.AuditFilter{})
	clash := fileDef("other", "say")
	clash.Description = "File version of other"
	rep, err = r.Sync(ctx, store.SourceFile, []*store.Tool{echo, fileDef("plain", "anything"), clash}, "file-sync")
	if err == nil || !strings.Contains(err.Error(), `tool "other": already registered from source api`) {
		t.Fatalf("name clash not reported: %v", err)
	}
	if fmt.Sprint(rep.Unchanged) != "[echo plain]" || len(rep.Created)+len(rep.Updated)+len(rep.Deleted) != 0 {
		t.Fatalf("third sync: %+v", rep)
	}
	after, _ := st.ListAuditEvents(ctx, store.AuditFilter{})
	if len(after) != len(before) {
		t.Fatalf("unchanged sync wrote %d events", len(after)-len(before))
	}
	if cur, _ := st.GetTool(ctx, "other"); cur.Source != store.SourceAPI || cur.Description != "A file tool" || cur.Version != 1 {
		t.Fatalf("API tool touched by sync: %+v", cur)
	}

	// An invalid def is reported; its stored version is kept, not deleted.
	broken := fileDef("echo", "say")
	broken.DefaultRisk = 0
	rep, err = r.Sync(ctx, store.SourceFile, []*store.Tool{broken, fileDef("plain", "anything")}, "file-sync")
	if err == nil || !strings.Contains(err.Error(), "tool.default_risk") {
		t.Fatalf("invalid def not reported: %v", err)
	}
	if cur, err := st.GetTool(ctx, "echo"); err != nil || cur.Version != 2 {
		t.Fatalf("tool of an invalid def changed: %+v %v", cur, err)
	}
	if len(rep.Deleted) != 0 {
		t.Fatalf("sync deleted %v", rep.Deleted)
	}

	// Syncing builtins does not touch file tools.
	rep, err = r.Sync(ctx, store.SourceBuiltin, nil, "builtin")
	if err != nil || len(rep.Deleted) != 0 {
		t.Fatalf("empty builtin sync: %+v %v", rep, err)
	}
}

func TestBuiltins(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	p := demoProvider()
	p.builtin = []*store.Tool{fileDef("echo", "say")}
	r := newTestRegistry(t, st, p)
	defs := r.Builtins()
	if len(defs) != 1 || defs[0].Source != store.SourceBuiltin {
		t.Fatalf("Builtins = %+v", defs)
	}
	if p.builtin[0].Source != store.SourceFile {
		t.Fatal("Builtins changed the provider's definition")
	}
	rep, err := r.Sync(ctx, store.SourceBuiltin, defs, "system")
	if err != nil || fmt.Sprint(rep.Created) != "[echo]" {
		t.Fatalf("%+v %v", rep, err)
	}
	if cur, _ := st.GetTool(ctx, "echo"); cur.Source != store.SourceBuiltin {
		t.Fatalf("source %s", cur.Source)
	}
}

func TestSecondReplicaFollowsNotifications(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := newMemoryStore(t)
	r1 := newTestRegistry(t, st)
	if _, _, err := r1.Register(ctx, RegisterParams{Tool: fileDef("other", "say")}); err != nil {
		t.Fatal(err)
	}
	r2 := newTestRegistry(t, st)
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Start returns after the initial load.
	if e, ok := r2.Lookup("other"); !ok || e.Impl == nil {
		t.Fatalf("initial load: %+v %v", e, ok)
	}

	if _, _, err := r1.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, "replica 2 sees the new tool", func() bool {
		e, ok := r2.Lookup("echo")
		return ok && e.Tool.Version == 1 && e.Impl != nil
	})
	changed := goodTool()
	changed.Description = "changed"
	if _, _, err := r1.Register(ctx, RegisterParams{Tool: changed}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, "replica 2 sees the update", func() bool {
		e, ok := r2.Lookup("echo")
		return ok && e.Tool.Version == 2 && e.Tool.Description == "changed"
	})
	if _, err := r1.Deregister(ctx, "echo", 0, "x"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, "replica 2 drops the tool", func() bool {
		_, ok := r2.Lookup("echo")
		return !ok
	})
	if _, ok := r2.Lookup("other"); !ok {
		t.Fatal("unrelated tool dropped")
	}
}

// chanStore delivers the notifications the test sends, and can fail tool
// reads on demand.
type chanStore struct {
	store.Store
	ch    chan store.Notification
	mu    sync.Mutex
	fails int // GetTool and ListTools fail this many more times
}

func (s *chanStore) Subscribe(ctx context.Context) (<-chan store.Notification, error) {
	out := make(chan store.Notification)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case n := <-s.ch:
				select {
				case out <- n:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

func (s *chanStore) fail() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fails > 0 {
		s.fails--
		return true
	}
	return false
}

func (s *chanStore) GetTool(ctx context.Context, name string) (*store.Tool, error) {
	if s.fail() {
		return nil, errDown
	}
	return s.Store.GetTool(ctx, name)
}

func (s *chanStore) ListTools(ctx context.Context, p store.ListToolsParams) ([]*store.Tool, error) {
	if s.fail() {
		return nil, errDown
	}
	return s.Store.ListTools(ctx, p)
}

func TestReloadAllAndRetry(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mem := newMemoryStore(t)
	st := &chanStore{Store: mem, ch: make(chan store.Notification)}
	writer := newTestRegistry(t, mem)
	if _, _, err := writer.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}
	r := newTestRegistry(t, st)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Lookup("echo"); !ok {
		t.Fatal("initial load missed echo")
	}
	// Changes behind r's back, announced only by "reload everything".
	if _, err := writer.Deregister(ctx, "echo", 0, "x"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := writer.Register(ctx, RegisterParams{Tool: fileDef("other", "say")}); err != nil {
		t.Fatal(err)
	}
	st.ch <- store.Notification{Topic: store.TopicHealth, Key: "other"} // ignored
	st.ch <- store.Notification{Topic: store.TopicTools}
	testutil.Eventually(t, time.Second, "full reload", func() bool {
		_, echo := r.Lookup("echo")
		_, other := r.Lookup("other")
		return !echo && other
	})

	// A reload that fails is retried once the store is back.
	changed := fileDef("other", "say")
	changed.Description = "changed"
	if _, _, err := writer.Register(ctx, RegisterParams{Tool: changed}); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	st.fails = 1
	st.mu.Unlock()
	st.ch <- store.Notification{Topic: store.TopicTools, Key: "other"}
	deadline := time.Now().Add(3 * reloadRetry)
	for {
		if e, _ := r.Lookup("other"); e.Tool.Version == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("failed reload was not retried")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConcurrentRegister(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := newMemoryStore(t)
	r1 := newTestRegistry(t, st)
	r2 := newTestRegistry(t, st) // a second replica writing too
	if err := r1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const writers = 12
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, aborted int
	versions := map[int64]bool{}
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			def := goodTool()
			def.Description = fmt.Sprintf("writer %d", i)
			r := r1
			if i%2 == 1 {
				r = r2
			}
			got, _, err := r.Register(ctx, RegisterParams{Tool: def, Actor: fmt.Sprint("w", i)})
			mu.Lock()
			defer mu.Unlock()
			switch f, isFault := fault.As(err); {
			case err == nil:
				ok++
				if versions[got.Version] {
					t.Errorf("version %d returned twice", got.Version)
				}
				versions[got.Version] = true
			case isFault && f.Kind == fault.Aborted:
				aborted++
			default:
				t.Errorf("writer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d writes succeeded, %d aborted", ok, aborted)
	if ok == 0 || ok+aborted != writers {
		t.Fatalf("%d succeeded, %d aborted", ok, aborted)
	}
	cur, err := st.GetTool(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	// Every successful write is one version; every version has one event.
	if cur.Version != int64(ok) {
		t.Fatalf("stored version %d after %d successful writes", cur.Version, ok)
	}
	evs := toolEvents(t, st, "echo")
	if len(evs) != ok {
		t.Fatalf("%d events for %d writes", len(evs), ok)
	}
	for i, ev := range evs {
		want := audit.ToolUpdated
		if i == 0 {
			want = audit.ToolRegistered
		}
		if ev.Type != want || fmt.Sprint(ev.DetailMap()["version"]) != fmt.Sprint(i+1) {
			t.Fatalf("event %d: %s version %v", i, ev.Type, ev.DetailMap()["version"])
		}
	}
	testutil.Eventually(t, time.Second, "the cache holds the last version", func() bool {
		e, ok := r1.Lookup("echo")
		return ok && e.Tool.Version == cur.Version && e.Tool.Description == cur.Description
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("no store accepted")
	}
	if _, err := New(Options{Store: newMemoryStore(t), Providers: []tools.Provider{demoProvider(), demoProvider()}}); err == nil {
		t.Fatal("two providers for one connector accepted")
	}
}

// meddlingStore lets another writer change a tool right before each of
// the registry's updates, as a concurrent replica would.
type meddlingStore struct {
	store.Store
	mu      sync.Mutex
	meddles int
	done    int
}

func (s *meddlingStore) UpdateTool(ctx context.Context, p store.UpdateToolParams) (*store.Tool, error) {
	s.mu.Lock()
	if s.meddles > 0 {
		s.meddles--
		s.done++
		cur, err := s.Store.GetTool(ctx, p.Tool.Name)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		cur.Description = fmt.Sprintf("meddled %d", s.done)
		if _, err := s.Store.UpdateTool(ctx, store.UpdateToolParams{Tool: cur, ExpectedVersion: cur.Version, Now: p.Now}); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	s.mu.Unlock()
	return s.Store.UpdateTool(ctx, p)
}

func TestRegisterRetriesConcurrentChanges(t *testing.T) {
	ctx := context.Background()
	mem := newMemoryStore(t)
	st := &meddlingStore{Store: mem}
	r := newTestRegistry(t, st)
	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool()}); err != nil {
		t.Fatal(err)
	}

	// Two concurrent changes: the third attempt wins.
	st.meddles = 2
	mine := goodTool()
	mine.Description = "mine"
	got, created, err := r.Register(ctx, RegisterParams{Tool: mine})
	if err != nil || created || got.Version != 4 || got.Description != "mine" {
		t.Fatalf("after retries: %+v %v %v", got, created, err)
	}
	if e, _ := r.Lookup("echo"); e.Tool.Version != 4 {
		t.Fatalf("cache at version %d", e.Tool.Version)
	}

	// Changes that never stop: ABORTED, and our definition is not stored.
	st.meddles = 100
	mine.Description = "mine again"
	_, _, err = r.Register(ctx, RegisterParams{Tool: mine})
	wantFault(t, err, fault.Aborted, fault.ReasonVersionConflict)
	if cur, _ := mem.GetTool(ctx, "echo"); cur.Description == "mine again" {
		t.Fatal("aborted registration was stored")
	}

	// With an expected version there is no retry: the caller decides.
	st.meddles = 1
	cur, _ := mem.GetTool(ctx, "echo")
	mine.Description = "conditional"
	_, _, err = r.Register(ctx, RegisterParams{Tool: mine, ExpectedVersion: cur.Version})
	wantFault(t, err, fault.FailedPrecondition, fault.ReasonVersionConflict)
}

func TestApplyOrdering(t *testing.T) {
	r := newTestRegistry(t, newMemoryStore(t))
	const first, second = "incarnation-1", "incarnation-2"
	entry := func(version int64, incarnation string) *Entry {
		return &Entry{Tool: &store.Tool{Name: "echo", Version: version, Incarnation: incarnation}}
	}
	version := func() int64 {
		e, ok := r.Lookup("echo")
		if !ok {
			return 0
		}
		return e.Tool.Version
	}
	r.apply(10, map[string]*Entry{"echo": entry(3, first)})
	// A read that started earlier and returns older data is ignored.
	r.apply(5, map[string]*Entry{"echo": entry(2, first)})
	if version() != 3 {
		t.Fatalf("stale read applied: version %d", version())
	}
	// A later read of an older version of the same incarnation is ignored
	// too: versions of one incarnation only grow.
	r.apply(11, map[string]*Entry{"echo": entry(2, first)})
	if version() != 3 {
		t.Fatalf("older version applied: version %d", version())
	}
	// A newer version of the same incarnation wins even from an older ticket.
	r.apply(9, map[string]*Entry{"echo": entry(4, first)})
	if version() != 4 {
		t.Fatalf("newer version ignored: version %d", version())
	}
	// A removal read before the last change is ignored; a later one applies.
	r.apply(8, map[string]*Entry{"echo": nil})
	if version() != 4 {
		t.Fatal("stale removal applied")
	}
	r.apply(12, map[string]*Entry{"echo": nil})
	if version() != 0 {
		t.Fatal("removal not applied")
	}
	// A stale read from before the removal does not resurrect the tool; a
	// new incarnation read later does appear.
	r.apply(7, map[string]*Entry{"echo": entry(4, first)})
	if version() != 0 {
		t.Fatal("removed tool resurrected by a stale read")
	}
	r.apply(13, map[string]*Entry{"echo": entry(1, second)})
	if version() != 1 {
		t.Fatalf("recreated tool not applied: version %d", version())
	}
	// Another incarnation read later replaces the cached one even at a
	// lower version (a tool deregistered and registered again starts at 1).
	r.apply(14, map[string]*Entry{"echo": entry(3, second)})
	r.apply(15, map[string]*Entry{"echo": entry(1, "incarnation-3")})
	if e, _ := r.Lookup("echo"); e.Tool.Incarnation != "incarnation-3" || e.Tool.Version != 1 {
		t.Fatalf("cached %+v after a new incarnation", e.Tool)
	}
}

func TestLoadKeepsToolsThatNoLongerValidate(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := newMemoryStore(t)
	// Written by another build: a connector this process does not serve and
	// a schema this build cannot compile.
	odd := fileDef("odd", "run")
	odd.ProviderID = "elsewhere"
	odd.Actions[0].InputSchema = []byte(`{"type":"object","properties":{"n":{"type":"integer","minimum":"one"}}}`)
	odd.Incarnation = "inc-odd"
	if _, err := st.CreateTool(ctx, store.CreateToolParams{Tool: odd, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	r := newTestRegistry(t, st)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e, ok := r.Lookup("odd")
	if !ok {
		t.Fatal("stored tool not loaded")
	}
	if e.Impl != nil {
		t.Fatal("tool of an unknown connector bound")
	}
	err := e.ValidateArguments("run", []byte(`{"n":1}`))
	var ae *ArgumentError
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("uncompilable schema must fail the call as an internal error, got %v", err)
	}
}

// deleteHookStore runs a function inside DeleteTool, before the delete
// commits.
type deleteHookStore struct {
	store.Store
	beforeDelete func()
}

func (s *deleteHookStore) DeleteTool(ctx context.Context, p store.DeleteToolParams) (*store.Tool, error) {
	if s.beforeDelete != nil {
		s.beforeDelete()
	}
	return s.Store.DeleteTool(ctx, p)
}

// A reload that reads the store while a deregistration is under way (read
// before the delete commits, applied after it) must not bring the tool back
// into this replica's cache.
func TestDeregisterNotUndoneByConcurrentReload(t *testing.T) {
	ctx := context.Background()
	hs := &deleteHookStore{Store: newMemoryStore(t)}
	r := newTestRegistry(t, hs)
	if _, _, err := r.Register(ctx, RegisterParams{Tool: goodTool(), Source: store.SourceAPI, Actor: "ops"}); err != nil {
		t.Fatal(err)
	}
	name := goodTool().Name
	var reloadTicket uint64
	var seen *store.Tool
	hs.beforeDelete = func() {
		// The reload starts after the deregistration did, and reads the tool
		// before the delete commits.
		reloadTicket = r.tickets.Add(1)
		var err error
		if seen, err = hs.Store.GetTool(ctx, name); err != nil {
			t.Error(err)
		}
	}
	if _, err := r.Deregister(ctx, name, 0, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Lookup(name); ok {
		t.Fatal("tool still cached right after Deregister")
	}
	// The reload finishes last.
	r.apply(reloadTicket, map[string]*Entry{name: r.entryFor(ctx, seen)})
	if _, ok := r.Lookup(name); ok {
		t.Fatal("a reload that read before the delete committed brought the tool back")
	}
}
