package storetest

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

func auditTests() []test {
	return []test{
		{"AppendOrder", testAuditAppendOrder},
		{"Details", testAuditDetails},
		{"Filters", testAuditFilters},
		{"Pagination", testAuditPagination},
		{"Refused", testAuditRefused},
		{"MaxBytes", testAuditMaxBytes},
		{"DeleteBefore", testAuditDeleteBefore},
	}
}

func testAuditAppendOrder(t *testing.T, s store.Store) {
	ctx := t.Context()
	full := newEvent(audit.ToolCallSucceeded, newID())
	bare := audit.New(audit.ToolRegistered, store.AuditEvent{Time: at(2 * time.Second)})
	batches := [][]store.AuditEvent{
		{full, newEvent(audit.ToolCallAttempted, newID())},
		{bare},
		{newEvent(audit.GateRequired, newID()), newEvent(audit.ApprovalResolved, newID()), newEvent(audit.ToolCallFailed, newID())},
	}
	var want []store.AuditEvent
	for _, b := range batches {
		noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, b))
		want = append(want, b...)
	}
	noErr(t, "AppendAuditEvents of nothing", s.AppendAuditEvents(ctx, nil))
	got := wantEvents(t, s, store.AuditFilter{}, want...)

	// Events are copies, and Seq is the store's: the caller's is ignored.
	got[0].Detail[2] = 'X'
	withSeq := newEvent(audit.ToolCallDeduped, newID())
	withSeq.Seq = 1
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, []store.AuditEvent{withSeq}))
	again := wantEvents(t, s, store.AuditFilter{}, append(want, withSeq)...)
	if again[len(again)-1].Seq <= again[len(again)-2].Seq {
		t.Fatalf("the caller's Seq was kept: %d after %d", again[len(again)-1].Seq, again[len(again)-2].Seq)
	}
}

// testAuditDetails: a detail comes back byte for byte — NUL escaped in its
// strings (which jsonb refuses), any Unicode, numbers beyond float64, key
// order and spacing as given — and so does a detail the audit package cut
// to size.
func testAuditDetails(t *testing.T, s store.Store) {
	ctx := t.Context()
	details := []string{
		`{"arguments":{"text":"a\u0000b","nul":"\u0000"},"message":"ok"}`,
		`{"unicode":"héllo ✓ 日本語 😀","html":"<a href=\"x\">&amp;</a>","escaped":"\u00e9\ud83d\ude00"}`,
		`{"big":123456789012345678901234567890,"tiny":1e-400,"neg":-0,"list":[1,2.50,true,null]}`,
		`{"z":1,"a":2}`,
		`{ "spaced" : [ 1 , 2 ] }`,
		`{}`,
	}
	huge := map[string]any{"arguments": map[string]any{"blob": strings.Repeat("日本", 20000)},
		"message": strings.Repeat("x\x00", 5000), "reason": "ARGUMENTS_INVALID"}
	var events []store.AuditEvent
	for i, d := range details {
		ev := newEvent(audit.ToolCallSucceeded, newID())
		ev.StepID = "step-" + itoa(i)
		ev.Detail = json.RawMessage(d)
		events = append(events, ev)
	}
	cut := audit.NewBounded(audit.ToolCallFailed, store.AuditEvent{Time: at(time.Second), CallID: newID()},
		huge, audit.MinDetailMaxBytes)
	if len(cut.Detail) > audit.MinDetailMaxBytes {
		t.Fatalf("the audit package left a detail of %d bytes, limit %d", len(cut.Detail), audit.MinDetailMaxBytes)
	}
	events = append(events, cut)
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, events))
	got := wantEvents(t, s, store.AuditFilter{}, events...)
	for i := range details {
		if string(got[i].Detail) != details[i] {
			t.Fatalf("detail %d changed:\n got %s\nwant %s", i, got[i].Detail, details[i])
		}
	}
	if m := got[len(got)-1].DetailMap(); m["truncated"] != true || m["reason"] != "ARGUMENTS_INVALID" {
		t.Fatalf("cut detail: %s", got[len(got)-1].Detail)
	}
}

// auditFixture appends events whose fields vary independently and returns
// them in append order.
func auditFixture(t *testing.T, s store.Store, n int) []store.AuditEvent {
	t.Helper()
	types := []string{audit.ToolCallAttempted, audit.ToolCallSucceeded, audit.ToolCallFailed, audit.GateRequired}
	calls := []string{newID(), newID(), newID(), newID(), newID()}
	var events []store.AuditEvent
	for i := range n {
		events = append(events, audit.New(types[i%len(types)], store.AuditEvent{
			Time:      at(time.Duration(i) * time.Second),
			CallID:    calls[i%len(calls)],
			TraceID:   "trace-" + itoa(i%3),
			TaskID:    "task-" + itoa(i%2),
			StepID:    "step-" + itoa(i),
			Principal: "agent-" + itoa(i%4),
			Tool:      []string{"files", "mail", "ci"}[i%3],
			Action:    "act",
			Risk:      toolkit.RiskLevel(1 + i%4),
			Decision:  store.DecisionAllow,
			Outcome:   store.OutcomeSucceeded,
			Detail:    json.RawMessage(`{"i":` + itoa(i) + `}`),
		}))
	}
	// Append in a few batches, as transactions do.
	for i := 0; i < n; i += 7 {
		noErr(t, "AppendAuditEvents", s.AppendAuditEvents(t.Context(), events[i:min(i+7, n)]))
	}
	return events
}

func testAuditFilters(t *testing.T, s store.Store) {
	events := auditFixture(t, s, 40)
	call := events[3].CallID
	cases := []struct {
		name string
		f    store.AuditFilter
		keep func(e store.AuditEvent) bool
	}{
		{"Type", store.AuditFilter{Types: []string{audit.ToolCallFailed}}, func(e store.AuditEvent) bool { return e.Type == audit.ToolCallFailed }},
		{"Types", store.AuditFilter{Types: []string{audit.ToolCallFailed, audit.GateRequired}}, func(e store.AuditEvent) bool {
			return e.Type == audit.ToolCallFailed || e.Type == audit.GateRequired
		}},
		{"Call", store.AuditFilter{CallID: call}, func(e store.AuditEvent) bool { return e.CallID == call }},
		{"Trace", store.AuditFilter{TraceID: "trace-2"}, func(e store.AuditEvent) bool { return e.TraceID == "trace-2" }},
		{"Task", store.AuditFilter{TaskID: "task-1"}, func(e store.AuditEvent) bool { return e.TaskID == "task-1" }},
		{"Principal", store.AuditFilter{Principal: "agent-3"}, func(e store.AuditEvent) bool { return e.Principal == "agent-3" }},
		{"Tool", store.AuditFilter{Tool: "mail"}, func(e store.AuditEvent) bool { return e.Tool == "mail" }},
		{"Start", store.AuditFilter{Start: at(30 * time.Second)}, func(e store.AuditEvent) bool { return !e.Time.Before(at(30 * time.Second)) }},
		{"End", store.AuditFilter{End: at(10 * time.Second)}, func(e store.AuditEvent) bool { return e.Time.Before(at(10 * time.Second)) }},
		{"Range", store.AuditFilter{Start: at(5 * time.Second), End: at(25 * time.Second)}, func(e store.AuditEvent) bool {
			return !e.Time.Before(at(5*time.Second)) && e.Time.Before(at(25*time.Second))
		}},
		{"AfterSeq", store.AuditFilter{}, nil}, // filled in below
		{"Combined", store.AuditFilter{Types: []string{audit.ToolCallAttempted, audit.ToolCallSucceeded}, Principal: "agent-1", Tool: "files", Start: at(5 * time.Second)}, func(e store.AuditEvent) bool {
			return (e.Type == audit.ToolCallAttempted || e.Type == audit.ToolCallSucceeded) && e.Principal == "agent-1" && e.Tool == "files" && !e.Time.Before(at(5*time.Second))
		}},
		{"Nothing", store.AuditFilter{Principal: "nobody"}, func(store.AuditEvent) bool { return false }},
	}
	all, err := s.ListAuditEvents(t.Context(), store.AuditFilter{})
	noErr(t, "ListAuditEvents", err)
	cases[10].f.AfterSeq = all[16].Seq
	cases[10].keep = func(e store.AuditEvent) bool { return slices.Index(eventIDs(events), e.ID) > 16 }

	for _, tc := range cases {
		var want []store.AuditEvent
		for _, e := range events {
			if tc.keep(e) {
				want = append(want, e)
			}
		}
		if len(want) == 0 && tc.name != "Nothing" {
			t.Fatalf("filter %s selects nothing from the fixture", tc.name)
		}
		if len(want) == len(events) {
			t.Fatalf("filter %s selects everything from the fixture", tc.name)
		}
		t.Run(tc.name, func(t *testing.T) {
			wantEvents(t, s, tc.f, want...)
		})
	}
}

func testAuditPagination(t *testing.T, s store.Store) {
	events := auditFixture(t, s, 37)
	for _, tc := range []struct {
		name  string
		f     store.AuditFilter
		keep  func(store.AuditEvent) bool
		limit int
	}{
		{"All1", store.AuditFilter{}, nil, 1},
		{"All5", store.AuditFilter{}, nil, 5},
		{"All37", store.AuditFilter{}, nil, 37},
		{"Mail3", store.AuditFilter{Tool: "mail"}, func(e store.AuditEvent) bool { return e.Tool == "mail" }, 3},
	} {
		var want []string
		for _, e := range events {
			if tc.keep == nil || tc.keep(e) {
				want = append(want, e.ID)
			}
		}
		f := tc.f
		f.Limit = tc.limit
		var got []string
		for range len(events) + 2 {
			page, err := s.ListAuditEvents(t.Context(), f)
			noErr(t, "ListAuditEvents page", err)
			if len(page) > tc.limit {
				t.Fatalf("%s: page of %d with limit %d", tc.name, len(page), tc.limit)
			}
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				if e.Seq <= f.AfterSeq {
					t.Fatalf("%s: event with Seq %d on a page after %d", tc.name, e.Seq, f.AfterSeq)
				}
				got = append(got, e.ID)
			}
			f.AfterSeq = page[len(page)-1].Seq
		}
		same(t, tc.name+": events paged", got, want)
	}
}

// testAuditRefused: an append that cannot be stored stores nothing.
func testAuditRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := newEvent(audit.ToolCallAttempted, newID())
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, []store.AuditEvent{first}))

	ok := newEvent(audit.ToolCallSucceeded, newID())
	noID := newEvent(audit.ToolCallFailed, newID())
	noID.ID = ""
	err := s.AppendAuditEvents(ctx, []store.AuditEvent{ok, noID})
	wantErr(t, "AppendAuditEvents of an event without id", err, store.ErrInvalid)

	dup := newEvent(audit.ToolCallFailed, newID())
	dup.ID = first.ID
	err = s.AppendAuditEvents(ctx, []store.AuditEvent{ok, dup})
	wantErr(t, "AppendAuditEvents of an existing id", err, store.ErrConflict)

	wantEvents(t, s, store.AuditFilter{}, first)
}

// testAuditMaxBytes: a byte budget ends a list after the first event that
// goes over it, so a list holds at least one event and a caller can tell the
// budget was reached.
func testAuditMaxBytes(t *testing.T, s store.Store) {
	ctx := t.Context()
	var events []store.AuditEvent
	for i := range 10 {
		e := newEvent(audit.ToolCallSucceeded, newID())
		e.Time = at(time.Duration(i) * time.Second)
		e.Detail = json.RawMessage(`{"blob":"` + strings.Repeat("é", 500) + `"}`) // about 1 KB
		if i == 6 {
			e.Detail = json.RawMessage(`{"blob":"` + strings.Repeat("x", 10_000) + `"}`)
		}
		events = append(events, e)
	}
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, events))
	one := store.AuditEventSize(&events[0])
	if one < 1000 || one > 1200 {
		t.Fatalf("AuditEventSize of a 1 KB event: %d", one)
	}
	// 2.5 events' worth: the third goes over and ends the list.
	wantEvents(t, s, store.AuditFilter{MaxBytes: one * 5 / 2}, events[:3]...)
	// A budget smaller than one event still gives one.
	wantEvents(t, s, store.AuditFilter{MaxBytes: 1}, events[0])
	// With Limit, whichever ends the list first.
	wantEvents(t, s, store.AuditFilter{MaxBytes: one * 5, Limit: 2}, events[:2]...)
	// Paging by the budget walks the whole trail; the big event comes on
	// its own page right after one that it ended.
	all, err := s.ListAuditEvents(ctx, store.AuditFilter{})
	noErr(t, "ListAuditEvents", err)
	var got []string
	var sizes []int
	f := store.AuditFilter{MaxBytes: one * 5 / 2}
	for range 20 {
		page, err := s.ListAuditEvents(ctx, f)
		noErr(t, "ListAuditEvents page", err)
		if len(page) == 0 {
			break
		}
		sizes = append(sizes, len(page))
		for _, e := range page {
			got = append(got, e.ID)
		}
		f.AfterSeq = page[len(page)-1].Seq
	}
	same(t, "events paged by bytes", got, eventIDs(events))
	same(t, "page sizes", sizes, []int{3, 3, 1, 3})
	if len(all) != len(events) {
		t.Fatalf("%d events stored", len(all))
	}
	_, err = s.ListAuditEvents(ctx, store.AuditFilter{MaxBytes: -1})
	wantErr(t, "ListAuditEvents with a negative budget", err, store.ErrInvalid)
}

// testAuditDeleteBefore: events older than a time are deleted oldest first,
// in batches; the rest of the trail is untouched.
func testAuditDeleteBefore(t *testing.T, s store.Store) {
	ctx := t.Context()
	var events []store.AuditEvent
	// Times out of Seq order: deletion goes by time.
	for _, sec := range []int{5, 1, 9, 3, 7, 2, 8} {
		e := newEvent(audit.ToolCallSucceeded, newID())
		e.Time = at(time.Duration(sec) * time.Second)
		events = append(events, e)
	}
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, events))
	cutoff := at(6 * time.Second) // 5, 1, 3, 2 are older

	_, err := s.DeleteAuditEventsBefore(ctx, cutoff, -1)
	wantErr(t, "DeleteAuditEventsBefore with a negative limit", err, store.ErrInvalid)

	n, err := s.DeleteAuditEventsBefore(ctx, cutoff, 2)
	noErr(t, "DeleteAuditEventsBefore", err)
	if n != 2 {
		t.Fatalf("deleted %d, want 2", n)
	}
	// The two oldest (1 s and 2 s) went.
	wantEvents(t, s, store.AuditFilter{}, events[0], events[2], events[3], events[4], events[6])
	n, err = s.DeleteAuditEventsBefore(ctx, cutoff, 0)
	noErr(t, "DeleteAuditEventsBefore", err)
	if n != 2 {
		t.Fatalf("deleted %d, want 2", n)
	}
	wantEvents(t, s, store.AuditFilter{}, events[2], events[4], events[6])
	n, err = s.DeleteAuditEventsBefore(ctx, cutoff, 0)
	noErr(t, "DeleteAuditEventsBefore", err)
	if n != 0 {
		t.Fatalf("deleted %d more", n)
	}
	// A deleted event's id is free again, as a stored one's is not.
	again := events[1]
	noErr(t, "AppendAuditEvents of a deleted id", s.AppendAuditEvents(ctx, []store.AuditEvent{again}))
	wantEvents(t, s, store.AuditFilter{}, events[2], events[4], events[6], again)
}
