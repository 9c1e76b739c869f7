package storetest

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

func toolTests() []test {
	return []test{
		{"CreateAndGet", testCreateTool},
		{"CreateDuplicate", testCreateToolDuplicate},
		{"GetMissing", testGetToolMissing},
		{"Update", testUpdateTool},
		{"UpdateWrongVersion", testUpdateToolWrongVersion},
		{"Delete", testDeleteTool},
		{"ListPagination", testListToolsPagination},
		{"ListSource", testListToolsSource},
		{"RecordsAreCopies", testToolCopies},
		{"DocumentBytes", testToolDocumentBytes},
		{"Incarnation", testToolIncarnation},
		{"DeleteGivesUpWhatWaits", testDeleteToolGivesUpWhatWaits},
		{"DeleteRefusedEvent", testDeleteToolRefusedEvent},
		{"ConnectorDefinition", testToolConnector},
	}
}

func testCreateTool(t *testing.T, s store.Store) {
	ctx := t.Context()
	in := newTool("files")
	ev := audit.New(audit.ToolRegistered, store.AuditEvent{Time: at(0), Tool: "files", Principal: "op-1"})
	got, err := s.CreateTool(ctx, store.CreateToolParams{Tool: in, Now: at(0), Events: []store.AuditEvent{ev}})
	noErr(t, "CreateTool", err)

	want := newTool("files")
	want.Version = 1
	want.CreatedAt, want.UpdatedAt = at(0), at(0)
	wantTool(t, "created tool", got, want)
	stored, err := s.GetTool(ctx, "files")
	noErr(t, "GetTool", err)
	wantTool(t, "stored tool", stored, want)

	wantHealth(t, "health of a new tool", getHealth(t, s, "files"),
		&store.ToolHealth{Tool: "files", Status: store.HealthHealthy, UpdatedAt: at(0)})
	wantEvents(t, s, store.AuditFilter{Tool: "files"}, ev)
}

func testCreateToolDuplicate(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	dup := newTool("files")
	dup.Description = "another"
	ev := audit.New(audit.ToolRegistered, store.AuditEvent{Time: at(time.Second), Tool: "files"})
	_, err := s.CreateTool(ctx, store.CreateToolParams{Tool: dup, Now: at(time.Second), Events: []store.AuditEvent{ev}})
	wantErr(t, "CreateTool of an existing name", err, store.ErrConflict)

	stored, err := s.GetTool(ctx, "files")
	noErr(t, "GetTool", err)
	if stored.Description != newTool("files").Description || !stored.UpdatedAt.Equal(at(0)) {
		t.Fatalf("a refused create changed the tool: %s", show(stored))
	}
	wantNoEvents(t, s, ev)
}

func testGetToolMissing(t *testing.T, s store.Store) {
	ctx := t.Context()
	_, err := s.GetTool(ctx, "nope")
	wantErr(t, "GetTool", err, store.ErrNotFound)
	_, err = s.GetToolHealth(ctx, "nope")
	wantErr(t, "GetToolHealth", err, store.ErrNotFound)
	_, err = s.UpdateTool(ctx, store.UpdateToolParams{Tool: newTool("nope"), ExpectedVersion: 1, Now: at(0)})
	wantErr(t, "UpdateTool", err, store.ErrNotFound)
	_, err = s.DeleteTool(ctx, store.DeleteToolParams{Name: "nope"})
	wantErr(t, "DeleteTool", err, store.ErrNotFound)
}

func testUpdateTool(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))

	upd := newTool("files")
	upd.Description = "Files, version two"
	upd.Actions = upd.Actions[:1]
	upd.Actions[0].InputSchema = json.RawMessage(`{"type":"object","additionalProperties":true}`)
	upd.RequiredScopes = []string{"files:all"}
	upd.DefaultRisk = toolkit.RiskCritical
	upd.Policies = nil
	upd.Source = store.SourceFile
	ev := audit.New(audit.ToolUpdated, store.AuditEvent{Time: at(time.Hour), Tool: "files"})
	got, err := s.UpdateTool(ctx, store.UpdateToolParams{Tool: upd, ExpectedVersion: 1, Now: at(time.Hour), Events: []store.AuditEvent{ev}})
	noErr(t, "UpdateTool", err)

	want := *upd
	want.Version = 2
	want.CreatedAt, want.UpdatedAt = at(0), at(time.Hour)
	wantTool(t, "updated tool", got, &want)
	stored, err := s.GetTool(ctx, "files")
	noErr(t, "GetTool", err)
	wantTool(t, "stored tool", stored, &want)
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ToolUpdated}}, ev)

	// And once more, from the new version.
	upd.Description = "Files, version three"
	got, err = s.UpdateTool(ctx, store.UpdateToolParams{Tool: upd, ExpectedVersion: 2, Now: at(2 * time.Hour)})
	noErr(t, "UpdateTool", err)
	if got.Version != 3 || !got.CreatedAt.Equal(at(0)) || !got.UpdatedAt.Equal(at(2*time.Hour)) {
		t.Fatalf("second update: version %d created %v updated %v", got.Version, got.CreatedAt, got.UpdatedAt)
	}
}

func testUpdateToolWrongVersion(t *testing.T, s store.Store) {
	ctx := t.Context()
	created := createTool(t, s, newTool("files"))
	for _, v := range []int64{2, 7} {
		upd := newTool("files")
		upd.Description = "changed"
		ev := audit.New(audit.ToolUpdated, store.AuditEvent{Time: at(time.Hour), Tool: "files"})
		_, err := s.UpdateTool(ctx, store.UpdateToolParams{Tool: upd, ExpectedVersion: v, Now: at(time.Hour), Events: []store.AuditEvent{ev}})
		wantErr(t, "UpdateTool with a stale version", err, store.ErrConflict)
		wantNoEvents(t, s, ev)
	}
	stored, err := s.GetTool(ctx, "files")
	noErr(t, "GetTool", err)
	wantTool(t, "tool after refused updates", stored, created)
}

func testDeleteTool(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	upd := newTool("files")
	upd.Description = "v2"
	updated, err := s.UpdateTool(ctx, store.UpdateToolParams{Tool: upd, ExpectedVersion: 1, Now: at(time.Minute)})
	noErr(t, "UpdateTool", err)

	bad := audit.New(audit.ToolDeregistered, store.AuditEvent{Time: at(time.Hour), Tool: "files"})
	_, err = s.DeleteTool(ctx, store.DeleteToolParams{Name: "files", ExpectedVersion: 1, Events: []store.AuditEvent{bad}})
	wantErr(t, "DeleteTool with a stale version", err, store.ErrConflict)
	wantNoEvents(t, s, bad)
	getHealth(t, s, "files")

	ev := audit.New(audit.ToolDeregistered, store.AuditEvent{Time: at(time.Hour), Tool: "files"})
	got, err := s.DeleteTool(ctx, store.DeleteToolParams{Name: "files", ExpectedVersion: 2, Events: []store.AuditEvent{ev}})
	noErr(t, "DeleteTool", err)
	wantTool(t, "deleted tool", got, updated)
	_, err = s.GetTool(ctx, "files")
	wantErr(t, "GetTool after delete", err, store.ErrNotFound)
	_, err = s.GetToolHealth(ctx, "files")
	wantErr(t, "GetToolHealth after delete", err, store.ErrNotFound)
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ToolDeregistered}}, ev)
	_, err = s.DeleteTool(ctx, store.DeleteToolParams{Name: "files"})
	wantErr(t, "DeleteTool twice", err, store.ErrNotFound)

	// The name is free again, with a fresh version and health; version 0
	// deletes whatever version there is.
	recreated := newTool("files")
	recreated.Incarnation = newID()
	again, err := s.CreateTool(ctx, store.CreateToolParams{Tool: recreated, Now: at(2 * time.Hour)})
	noErr(t, "CreateTool after delete", err)
	if again.Version != 1 || !again.CreatedAt.Equal(at(2*time.Hour)) || again.Incarnation != recreated.Incarnation {
		t.Fatalf("recreated tool: version %d created %v incarnation %q", again.Version, again.CreatedAt, again.Incarnation)
	}
	wantHealth(t, "health of the recreated tool", getHealth(t, s, "files"),
		&store.ToolHealth{Tool: "files", Status: store.HealthHealthy, UpdatedAt: at(2 * time.Hour)})
	_, err = s.DeleteTool(ctx, store.DeleteToolParams{Name: "files"})
	noErr(t, "DeleteTool of any version", err)
}

// toolNames are names whose byte order differs from a natural-language
// collation ('-' and '_' against letters and digits): lists are in byte order.
var toolNames = []string{
	"a", "a-b", "a_b", "a0", "ab", "a-c", "b", "b-", "b_", "b9", "ba",
	"z", "z-z", "z_z", "zz", "0", "0-1", "1", "_x", "-x", "x-", "x_", "x",
}

func testListToolsPagination(t *testing.T, s store.Store) {
	ctx := t.Context()
	names := slices.Clone(toolNames)
	rand.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	for _, n := range names {
		createTool(t, s, newTool(n))
	}
	slices.Sort(names) // byte order

	all, err := s.ListTools(ctx, store.ListToolsParams{})
	noErr(t, "ListTools", err)
	same(t, "all tools by name", toolNamesOf(all), names)
	if all[0].Version != 1 || len(all[0].Actions) != 2 {
		t.Fatalf("listed tool is not the whole record: %s", show(all[0]))
	}

	for _, limit := range []int{1, 4, 5, len(names), len(names) + 1} {
		var (
			paged []string
			after string
		)
		for range len(names) + 2 {
			page, err := s.ListTools(ctx, store.ListToolsParams{After: after, Limit: limit})
			noErr(t, "ListTools page", err)
			if len(page) > limit {
				t.Fatalf("page of %d with limit %d", len(page), limit)
			}
			if len(page) == 0 {
				break
			}
			paged = append(paged, toolNamesOf(page)...)
			after = page[len(page)-1].Name
		}
		same(t, "tools paged by "+itoa(limit), paged, names)
	}

	page, err := s.ListTools(ctx, store.ListToolsParams{After: "b", Limit: 3})
	noErr(t, "ListTools after b", err)
	i, _ := slices.BinarySearch(names, "b")
	same(t, "tools after b", toolNamesOf(page), names[i+1:i+4])
}

func testListToolsSource(t *testing.T, s store.Store) {
	ctx := t.Context()
	sources := map[string]store.ToolSource{
		"api-1": store.SourceAPI, "file-1": store.SourceFile, "api-2": store.SourceAPI,
		"builtin-1": store.SourceBuiltin, "file-2": store.SourceFile, "file-3": store.SourceFile,
	}
	for name, src := range sources {
		tool := newTool(name)
		tool.Source = src
		createTool(t, s, tool)
	}
	got, err := s.ListTools(ctx, store.ListToolsParams{Source: store.SourceFile})
	noErr(t, "ListTools source file", err)
	same(t, "file tools", toolNamesOf(got), []string{"file-1", "file-2", "file-3"})
	for _, tool := range got {
		if tool.Source != store.SourceFile {
			t.Fatalf("tool %s has source %s", tool.Name, tool.Source)
		}
	}
	got, err = s.ListTools(ctx, store.ListToolsParams{Source: store.SourceFile, After: "file-1", Limit: 1})
	noErr(t, "ListTools source file page", err)
	same(t, "file tools after file-1", toolNamesOf(got), []string{"file-2"})
	got, err = s.ListTools(ctx, store.ListToolsParams{Source: store.SourceBuiltin})
	noErr(t, "ListTools source builtin", err)
	same(t, "builtin tools", toolNamesOf(got), []string{"builtin-1"})
}

// testToolCopies: what callers pass in and get back is theirs to change.
func testToolCopies(t *testing.T, s store.Store) {
	ctx := t.Context()
	in := newTool("files")
	got, err := s.CreateTool(ctx, store.CreateToolParams{Tool: in, Now: at(0)})
	noErr(t, "CreateTool", err)
	want, err := s.GetTool(ctx, "files")
	noErr(t, "GetTool", err)

	in.Description = "mutated input"
	in.RequiredScopes[0] = "mutated"
	in.Actions[0].Name = "mutated"
	in.Actions[0].InputSchema[0] = ' '
	in.Policies[0].ReadBeforeWrite.ReadActions[0] = "mutated"
	got.Capabilities[0] = "mutated"
	got.Actions[1].Examples = append(got.Actions[1].Examples, store.Example{Description: "mutated"})
	got.Policies[1].SequentialDependency.Requires[0] = "mutated"
	got.Actions[0].Examples[0].Input[1] = ' '

	again, err := s.GetTool(ctx, "files")
	noErr(t, "GetTool", err)
	wantTool(t, "tool after callers changed their copies", again, want)
}

func toolNamesOf(tools []*store.Tool) []string {
	out := make([]string, len(tools))
	for i, t := range tools {
		out[i] = t.Name
	}
	return out
}

// testToolDocumentBytes: schemas and examples come back as given, compacted,
// byte for byte: keys in the order given (not sorted), <, > and & and
// non-ASCII characters unescaped, escapes the caller wrote kept.
func testToolDocumentBytes(t *testing.T, s store.Store) {
	ctx := t.Context()
	in := newTool("files")
	in.Actions[0].InputSchema = json.RawMessage(`{ "type": "object",
		"properties": {"zeta": {"type": "string", "description": "a < b && c > d, café ☃"},
			"alpha": {"type": "integer", "pattern": "\\u00e9\u00e9"}},
		"required": ["zeta"] }`)
	in.Actions[0].OutputSchema = json.RawMessage(`{"z":1,"a":[3,2,1],"m":{"y":null,"b":true}}`)
	in.Actions[0].Examples[0].Input = json.RawMessage(` {"path": "/a<b>&c", "k": 1.50} `)
	in.Actions[0].Examples[0].Output = json.RawMessage(`"just a string"`)
	want := [4]string{
		`{"type":"object","properties":{"zeta":{"type":"string","description":"a < b && c > d, café ☃"},"alpha":{"type":"integer","pattern":"\\u00e9\u00e9"}},"required":["zeta"]}`,
		`{"z":1,"a":[3,2,1],"m":{"y":null,"b":true}}`,
		`{"path":"/a<b>&c","k":1.50}`,
		`"just a string"`,
	}
	check := func(what string, got *store.Tool) {
		t.Helper()
		a := got.Actions[0]
		have := [4]string{string(a.InputSchema), string(a.OutputSchema), string(a.Examples[0].Input), string(a.Examples[0].Output)}
		for i := range want {
			if have[i] != want[i] {
				t.Fatalf("%s: document %d\n got  %s\n want %s", what, i, have[i], want[i])
			}
		}
	}
	created, err := s.CreateTool(ctx, store.CreateToolParams{Tool: in, Now: at(0)})
	noErr(t, "CreateTool", err)
	check("created", created)
	for i := range 3 {
		got, err := s.GetTool(ctx, "files")
		noErr(t, "GetTool", err)
		check("read "+itoa(i), got)
	}
	listed, err := s.ListTools(ctx, store.ListToolsParams{})
	noErr(t, "ListTools", err)
	check("listed", listed[0])
	upd := newTool("files")
	upd.Actions[0] = in.Actions[0]
	upd.Description = "v2"
	updated, err := s.UpdateTool(ctx, store.UpdateToolParams{Tool: upd, ExpectedVersion: 1, Now: at(time.Minute)})
	noErr(t, "UpdateTool", err)
	check("updated", updated)
}

// testToolIncarnation: a tool is created with the caller's incarnation,
// which every update keeps whatever it is given; none is refused.
func testToolIncarnation(t *testing.T, s store.Store) {
	ctx := t.Context()
	none := newTool("files")
	none.Incarnation = ""
	_, err := s.CreateTool(ctx, store.CreateToolParams{Tool: none, Now: at(0)})
	wantErr(t, "CreateTool without an incarnation", err, store.ErrInvalid)
	_, err = s.GetTool(ctx, "files")
	wantErr(t, "GetTool after a refused create", err, store.ErrNotFound)

	created := createTool(t, s, newTool("files"))
	if created.Incarnation != incarnationOf("files") {
		t.Fatalf("created with incarnation %q", created.Incarnation)
	}
	for i, given := range []string{"", "another", incarnationOf("other")} {
		upd := newTool("files")
		upd.Description = "version " + itoa(i+2)
		upd.Incarnation = given
		got, err := s.UpdateTool(ctx, store.UpdateToolParams{Tool: upd, ExpectedVersion: int64(i + 1), Now: at(time.Minute)})
		noErr(t, "UpdateTool", err)
		if got.Incarnation != created.Incarnation {
			t.Fatalf("update given incarnation %q stored %q, want the created one", given, got.Incarnation)
		}
	}
	for _, read := range []func() *store.Tool{
		func() *store.Tool { g, err := s.GetTool(ctx, "files"); noErr(t, "GetTool", err); return g },
		func() *store.Tool {
			l, err := s.ListTools(ctx, store.ListToolsParams{})
			noErr(t, "ListTools", err)
			return l[0]
		},
	} {
		if got := read(); got.Incarnation != created.Incarnation || got.Version != 4 {
			t.Fatalf("read back incarnation %q version %d", got.Incarnation, got.Version)
		}
	}
	deleted, err := s.DeleteTool(ctx, store.DeleteToolParams{Name: "files", Now: at(time.Hour)})
	noErr(t, "DeleteTool", err)
	if deleted.Incarnation != created.Incarnation {
		t.Fatalf("deleted tool had incarnation %q", deleted.Incarnation)
	}
}

// testDeleteToolGivesUpWhatWaits: deleting a tool invalidates the PENDING
// and APPROVED approvals of its name and expires its PENDING previews,
// releasing their calls, with their events and notifications, in the same
// transaction. Other tools' approvals and what is no longer open stay.
func testDeleteToolGivesUpWhatWaits(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	createTool(t, s, newTool("other"))
	pending := newCall("agent-1", "pending", store.CallAwaitingApproval)
	claim(t, s, pending)
	approved := newCall("agent-1", "approved", store.CallAwaitingApproval)
	claim(t, s, approved)
	approve(t, s, approved.ApprovalID)
	consumed := newCall("agent-1", "consumed", store.CallAwaitingApproval)
	claim(t, s, consumed)
	approve(t, s, consumed.ApprovalID)
	_, err := s.StartParkedCall(ctx, store.StartParkedCallParams{CallID: consumed.ID, ApprovalID: consumed.ApprovalID,
		Now: at(2 * time.Minute), Lease: longLease, Risk: consumed.Risk, Decision: consumed.Decision})
	noErr(t, "StartParkedCall", err)
	previewed := newCall("agent-1", "previewed", store.CallAwaitingPreview)
	claim(t, s, previewed)
	others := newCall("agent-1", "others", store.CallAwaitingApproval)
	others.Tool = "other"
	claim(t, s, others)
	othersPV := newCall("agent-1", "others-pv", store.CallAwaitingPreview)
	othersPV.Tool = "other"
	claim(t, s, othersPV)

	untouched := map[string]*store.Call{}
	for _, c := range []*store.Call{consumed, others, othersPV} {
		untouched[c.ID] = getCall(t, s, c.ID)
	}
	untouchedApprovals := map[string]*store.Approval{}
	for _, c := range []*store.Call{consumed, others} {
		untouchedApprovals[c.ApprovalID] = getApproval(t, s, c.ApprovalID)
	}
	beforeApproval := map[string]*store.Approval{}
	for _, c := range []*store.Call{pending, approved} {
		beforeApproval[c.ApprovalID] = getApproval(t, s, c.ApprovalID)
	}
	beforeCall := map[string]*store.Call{}
	for _, c := range []*store.Call{pending, approved, previewed} {
		beforeCall[c.ID] = getCall(t, s, c.ID)
	}

	ch := subscribe(t, s)
	var mu sync.Mutex
	approvalEvents := map[string]store.AuditEvent{}
	previewEvents := map[string]store.AuditEvent{}
	dereg := audit.New(audit.ToolDeregistered, store.AuditEvent{Time: at(3 * time.Minute), Tool: "files"})
	_, err = s.DeleteTool(ctx, store.DeleteToolParams{
		Name: "files", Now: at(3 * time.Minute), Events: []store.AuditEvent{dereg},
		ApprovalEventsFor: func(a *store.Approval) []store.AuditEvent {
			if a.State != store.ApprovalInvalidated {
				t.Errorf("approval event for an approval in state %s", a.State)
			}
			mu.Lock()
			defer mu.Unlock()
			ev := audit.NewDetail(audit.ApprovalInvalidated, store.AuditEvent{Time: at(3 * time.Minute), CallID: a.CallID,
				Tool: a.Tool}, map[string]any{"approval_id": a.ID, "approved": !a.ResolvedAt.IsZero()})
			approvalEvents[a.ID] = ev
			return []store.AuditEvent{ev}
		},
		PreviewEventsFor: func(pv *store.Preview) []store.AuditEvent {
			if pv.State != store.PreviewExpired {
				t.Errorf("preview event for a preview in state %s", pv.State)
			}
			mu.Lock()
			defer mu.Unlock()
			ev := audit.New(audit.PreviewExpired, store.AuditEvent{Time: at(3 * time.Minute), CallID: pv.CallID, Tool: pv.Tool})
			previewEvents[pv.Token] = ev
			return []store.AuditEvent{ev}
		},
	})
	noErr(t, "DeleteTool", err)

	for id, before := range beforeApproval {
		want := *before
		want.State = store.ApprovalInvalidated
		wantApproval(t, "invalidated approval", getApproval(t, s, id), &want)
	}
	// Each invalidated approval notifies, in any order.
	var wants []store.Notification
	for id := range beforeApproval {
		wants = append(wants, store.Notification{Topic: store.TopicApprovals, Key: id})
	}
	waitForAll(t, ch, wants...)
	pv := newPreview(previewed)
	pv.State = store.PreviewExpired
	wantPreview(t, "expired preview", getPreview(t, s, previewed.PreviewToken), pv)
	for id, before := range beforeCall {
		want := *before
		want.State, want.UpdatedAt = store.CallReleased, at(3*time.Minute)
		wantCall(t, "released call", getCall(t, s, id), &want)
	}
	for id, c := range untouched {
		wantCall(t, "call of what stays", getCall(t, s, id), c)
	}
	for id, a := range untouchedApprovals {
		wantApproval(t, "approval that stays", getApproval(t, s, id), a)
	}
	if pv := getPreview(t, s, othersPV.PreviewToken); pv.State != store.PreviewPending {
		t.Fatalf("another tool's preview is %s", pv.State)
	}
	// The deregistration's events, then the approvals' (by id), then the
	// previews'.
	ids := []string{pending.ApprovalID, approved.ApprovalID}
	slices.Sort(ids)
	want := []store.AuditEvent{dereg, approvalEvents[ids[0]], approvalEvents[ids[1]], previewEvents[previewed.PreviewToken]}
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ToolDeregistered, audit.ApprovalInvalidated, audit.PreviewExpired}}, want...)
	if ev := approvalEvents[approved.ApprovalID]; ev.DetailMap()["approved"] != true {
		t.Fatalf("the approved approval was handed over as not approved: %s", ev.Detail)
	}
}

// testDeleteToolRefusedEvent: a deletion whose events (or its invalidated
// approvals' events) are refused changes nothing.
func testDeleteToolRefusedEvent(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	c := newCall("agent-1", "pending", store.CallAwaitingApproval)
	claim(t, s, c)
	before, beforeApproval := getCall(t, s, c.ID), getApproval(t, s, c.ApprovalID)
	_, err := s.DeleteTool(ctx, store.DeleteToolParams{
		Name: "files", Now: at(time.Minute),
		ApprovalEventsFor: func(a *store.Approval) []store.AuditEvent {
			return []store.AuditEvent{{Type: audit.ApprovalInvalidated, Time: at(time.Minute)}} // no id
		},
	})
	wantErr(t, "DeleteTool with a refused approval event", err, store.ErrInvalid)
	if _, err := s.GetTool(ctx, "files"); err != nil {
		t.Fatalf("the tool is gone after a refused delete: %v", err)
	}
	getHealth(t, s, "files")
	wantCall(t, "call after a refused delete", getCall(t, s, c.ID), before)
	wantApproval(t, "approval after a refused delete", getApproval(t, s, c.ApprovalID), beforeApproval)
}

// testToolConnector: a connector definition is stored and read back whole
// (secret references, discovered tools with their annotations) and the
// records are copies.
func testToolConnector(t *testing.T, s store.Store) {
	ctx := t.Context()
	yes, no := true, false
	in := newTool("files")
	in.ProviderID, in.ProviderType = "files", store.ProviderMCP
	in.Connector = &connector.Spec{
		Type: connector.TypeMCP, Transport: connector.TransportStdio, Command: []string{"node", "server.js"},
		Env: map[string]secrets.Value{
			"API_TOKEN": {Secret: &secrets.Ref{Key: "api_token", Prefix: "tok "}},
			"LOG_LEVEL": {Literal: "debug"},
		},
		Actions: []connector.Action{{Name: "write", Risk: toolkit.RiskCritical, PreviewAction: "read"}},
		Expose:  []string{"read", "write"},
		Discovered: []connector.ServerTool{
			{Action: "read", Name: "Read File", Description: "Reads", InputSchema: json.RawMessage(`{"type":"object"}`),
				Annotations: connector.Annotations{ReadOnly: &yes, OpenWorld: &no}},
			{Action: "write", Name: "write", Problem: "bad schema"},
		},
	}
	created := createTool(t, s, in)
	want := cloneViaJSON(t, in)
	want.Version, want.CreatedAt, want.UpdatedAt = 1, at(0), at(0)
	wantTool(t, "created connector tool", created, want)
	got, err := s.GetTool(ctx, "files")
	noErr(t, "GetTool", err)
	wantTool(t, "stored connector tool", got, want)

	got.Connector.Env["API_TOKEN"].Secret.Key = "mutated"
	*got.Connector.Discovered[0].Annotations.ReadOnly = false
	in.Connector.Command[0] = "mutated"
	again, err := s.GetTool(ctx, "files")
	noErr(t, "GetTool", err)
	wantTool(t, "connector tool after callers changed their copies", again, want)

	upd := cloneViaJSON(t, want)
	upd.Connector.Discovered[0].Annotations.Destructive = &yes
	updated, err := s.UpdateTool(ctx, store.UpdateToolParams{Tool: upd, ExpectedVersion: 1, Now: at(time.Hour)})
	noErr(t, "UpdateTool", err)
	if d := updated.Connector.Discovered[0].Annotations.Destructive; d == nil || !*d || updated.Version != 2 {
		t.Fatalf("updated connector: %s", show(updated))
	}
}

func cloneViaJSON(t *testing.T, tool *store.Tool) *store.Tool {
	t.Helper()
	b, err := json.Marshal(tool)
	noErr(t, "encode tool", err)
	var c store.Tool
	noErr(t, "decode tool", json.Unmarshal(b, &c))
	return &c
}
