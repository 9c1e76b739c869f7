package storetest

import (
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

func toolsetTests() []test {
	return []test{
		{"CreateAndGet", testCreateToolset},
		{"CreateDuplicate", testCreateToolsetDuplicate},
		{"Update", testUpdateToolset},
		{"Delete", testDeleteToolset},
		{"List", testListToolsets},
		{"RecordsAreCopies", testToolsetCopies},
		{"RefusedEvent", testToolsetRefusedEvent},
	}
}

// newToolset returns a toolset whose text holds what a store might mangle:
// HTML-special characters, multibyte and astral characters, a newline.
func newToolset(name string) *store.Toolset {
	return &store.Toolset{
		Name:     name,
		Title:    "Notes & files <" + name + ">",
		Guidance: "Read a note before you **replace** it.\nNever delete <b>drafts</b> — ask first. 日本語 😀",
		Tools:    []string{"notes", "files.read"},
		Source:   store.SourceAPI,
	}
}

func toolsetEvent(typ, name string, d time.Duration) store.AuditEvent {
	return audit.NewDetail(typ, store.AuditEvent{Time: at(d), Principal: "op-1"}, map[string]any{"toolset": name})
}

func wantToolset(t *testing.T, what string, got, want *store.Toolset) {
	t.Helper()
	g, w := *got, *want
	g.CreatedAt, g.UpdatedAt = utc(g.CreatedAt), utc(g.UpdatedAt)
	w.CreatedAt, w.UpdatedAt = utc(w.CreatedAt), utc(w.UpdatedAt)
	same(t, what, &g, &w)
}

func createToolset(t *testing.T, s store.Store, ts *store.Toolset, d time.Duration) *store.Toolset {
	t.Helper()
	out, err := s.CreateToolset(t.Context(), store.CreateToolsetParams{Toolset: ts, Now: at(d)})
	noErr(t, "CreateToolset", err)
	return out
}

func testCreateToolset(t *testing.T, s store.Store) {
	ctx := t.Context()
	ch := subscribe(t, s)
	ev := toolsetEvent(audit.ToolsetRegistered, "notes", 0)
	got, err := s.CreateToolset(ctx, store.CreateToolsetParams{Toolset: newToolset("notes"), Now: at(0), Events: []store.AuditEvent{ev}})
	noErr(t, "CreateToolset", err)
	want := newToolset("notes")
	want.Version, want.CreatedAt, want.UpdatedAt = 1, at(0), at(0)
	wantToolset(t, "created toolset", got, want)
	stored, err := s.GetToolset(ctx, "notes")
	noErr(t, "GetToolset", err)
	wantToolset(t, "stored toolset", stored, want)
	// The text comes back byte for byte.
	if stored.Guidance != newToolset("notes").Guidance || stored.Title != newToolset("notes").Title {
		t.Fatalf("text changed: %q / %q", stored.Title, stored.Guidance)
	}
	waitFor(t, ch, store.Notification{Topic: store.TopicToolsets, Key: "notes"})
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ToolsetRegistered}}, ev)

	_, err = s.GetToolset(ctx, "nope")
	wantErr(t, "GetToolset of a missing toolset", err, store.ErrNotFound)
}

func testCreateToolsetDuplicate(t *testing.T, s store.Store) {
	ctx := t.Context()
	createToolset(t, s, newToolset("notes"), 0)
	dup := newToolset("notes")
	dup.Title = "another"
	ev := toolsetEvent(audit.ToolsetRegistered, "notes", time.Second)
	_, err := s.CreateToolset(ctx, store.CreateToolsetParams{Toolset: dup, Now: at(time.Second), Events: []store.AuditEvent{ev}})
	wantErr(t, "CreateToolset of an existing name", err, store.ErrConflict)
	stored, err := s.GetToolset(ctx, "notes")
	noErr(t, "GetToolset", err)
	if stored.Title != newToolset("notes").Title || stored.Version != 1 {
		t.Fatalf("a refused create changed the toolset: %s", show(stored))
	}
	wantNoEvents(t, s, ev)
	_, err = s.CreateToolset(ctx, store.CreateToolsetParams{Toolset: &store.Toolset{}, Now: at(0)})
	wantErr(t, "CreateToolset without a name", err, store.ErrInvalid)
}

func testUpdateToolset(t *testing.T, s store.Store) {
	ctx := t.Context()
	createToolset(t, s, newToolset("notes"), 0)
	ch := subscribe(t, s)
	upd := newToolset("notes")
	upd.Disabled = true
	upd.Tools = []string{"notes.read"}
	upd.Source = store.SourceFile
	ev := toolsetEvent(audit.ToolsetUpdated, "notes", time.Minute)
	got, err := s.UpdateToolset(ctx, store.UpdateToolsetParams{Toolset: upd, ExpectedVersion: 1, Now: at(time.Minute), Events: []store.AuditEvent{ev}})
	noErr(t, "UpdateToolset", err)
	want := newToolset("notes")
	want.Disabled, want.Tools, want.Source = true, []string{"notes.read"}, store.SourceFile
	want.Version, want.CreatedAt, want.UpdatedAt = 2, at(0), at(time.Minute)
	wantToolset(t, "updated toolset", got, want)
	stored, err := s.GetToolset(ctx, "notes")
	noErr(t, "GetToolset", err)
	wantToolset(t, "stored toolset", stored, want)
	waitFor(t, ch, store.Notification{Topic: store.TopicToolsets, Key: "notes"})
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ToolsetUpdated}}, ev)

	stale := toolsetEvent(audit.ToolsetUpdated, "notes", time.Hour)
	_, err = s.UpdateToolset(ctx, store.UpdateToolsetParams{Toolset: newToolset("notes"), ExpectedVersion: 1, Now: at(time.Hour), Events: []store.AuditEvent{stale}})
	wantErr(t, "UpdateToolset at a stale version", err, store.ErrConflict)
	wantNoEvents(t, s, stale)
	_, err = s.UpdateToolset(ctx, store.UpdateToolsetParams{Toolset: newToolset("nope"), ExpectedVersion: 1, Now: at(time.Hour)})
	wantErr(t, "UpdateToolset of a missing toolset", err, store.ErrNotFound)
	_, err = s.UpdateToolset(ctx, store.UpdateToolsetParams{Toolset: newToolset("notes"), Now: at(time.Hour)})
	wantErr(t, "UpdateToolset without an expected version", err, store.ErrInvalid)
	stored, err = s.GetToolset(ctx, "notes")
	noErr(t, "GetToolset", err)
	wantToolset(t, "toolset after refused updates", stored, want)
}

func testDeleteToolset(t *testing.T, s store.Store) {
	ctx := t.Context()
	created := createToolset(t, s, newToolset("notes"), 0)
	_, err := s.DeleteToolset(ctx, store.DeleteToolsetParams{Name: "notes", ExpectedVersion: 7, Now: at(time.Minute)})
	wantErr(t, "DeleteToolset at another version", err, store.ErrConflict)
	ch := subscribe(t, s)
	ev := toolsetEvent(audit.ToolsetDeregistered, "notes", time.Minute)
	got, err := s.DeleteToolset(ctx, store.DeleteToolsetParams{Name: "notes", ExpectedVersion: 1, Now: at(time.Minute), Events: []store.AuditEvent{ev}})
	noErr(t, "DeleteToolset", err)
	wantToolset(t, "deleted toolset", got, created)
	_, err = s.GetToolset(ctx, "notes")
	wantErr(t, "GetToolset after delete", err, store.ErrNotFound)
	waitFor(t, ch, store.Notification{Topic: store.TopicToolsets, Key: "notes"})
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ToolsetDeregistered}}, ev)
	_, err = s.DeleteToolset(ctx, store.DeleteToolsetParams{Name: "notes", Now: at(time.Hour)})
	wantErr(t, "DeleteToolset of a missing toolset", err, store.ErrNotFound)
}

func testListToolsets(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i, name := range []string{"b", "a", "d", "c"} {
		ts := newToolset(name)
		if name == "d" {
			ts.Source = store.SourceFile
		}
		createToolset(t, s, ts, time.Duration(i)*time.Second)
	}
	names := func(ts []*store.Toolset) []string {
		out := []string{}
		for _, x := range ts {
			out = append(out, x.Name)
		}
		return out
	}
	all, err := s.ListToolsets(ctx, store.ListToolsetsParams{})
	noErr(t, "ListToolsets", err)
	same(t, "every toolset, by name", names(all), []string{"a", "b", "c", "d"})
	page, err := s.ListToolsets(ctx, store.ListToolsetsParams{After: "a", Limit: 2})
	noErr(t, "ListToolsets page", err)
	same(t, "a page after a", names(page), []string{"b", "c"})
	file, err := s.ListToolsets(ctx, store.ListToolsetsParams{Source: store.SourceFile})
	noErr(t, "ListToolsets by source", err)
	same(t, "file toolsets", names(file), []string{"d"})
	_, err = s.ListToolsets(ctx, store.ListToolsetsParams{Limit: -1})
	wantErr(t, "ListToolsets with a negative limit", err, store.ErrInvalid)
}

func testToolsetCopies(t *testing.T, s store.Store) {
	ctx := t.Context()
	in := newToolset("notes")
	createToolset(t, s, in, 0)
	in.Tools[0] = "changed"
	got, err := s.GetToolset(ctx, "notes")
	noErr(t, "GetToolset", err)
	got.Tools[1] = "changed"
	again, err := s.GetToolset(ctx, "notes")
	noErr(t, "GetToolset", err)
	same(t, "tools after the caller changed its copies", again.Tools, []string{"notes", "files.read"})
}

func testToolsetRefusedEvent(t *testing.T, s store.Store) {
	ctx := t.Context()
	bad := toolsetEvent(audit.ToolsetRegistered, "notes", 0)
	bad.ID = ""
	_, err := s.CreateToolset(ctx, store.CreateToolsetParams{Toolset: newToolset("notes"), Now: at(0), Events: []store.AuditEvent{bad}})
	wantErr(t, "CreateToolset with an event without id", err, store.ErrInvalid)
	_, err = s.GetToolset(ctx, "notes")
	wantErr(t, "GetToolset after a refused create", err, store.ErrNotFound)
}
