package storetest

import (
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

func historyTests() []test {
	return []test{
		{"ListAndFilter", testTaskHistory},
	}
}

// wantHistory lists task history with f and compares it with want, in order.
func wantHistory(t *testing.T, s store.Store, f store.TaskHistoryFilter, want ...store.TaskHistoryEntry) {
	t.Helper()
	got, err := s.ListTaskHistory(t.Context(), f)
	noErr(t, "ListTaskHistory", err)
	gotN := make([]store.TaskHistoryEntry, len(got))
	for i, h := range got {
		gotN[i] = normHistory(h)
	}
	wantN := make([]store.TaskHistoryEntry, len(want))
	for i, h := range want {
		wantN[i] = normHistory(h)
	}
	same(t, "task history", gotN, wantN)
}

func testTaskHistory(t *testing.T, s store.Store) {
	ctx := t.Context()
	record := func(principal, task, tool, action, resource string, i int) store.TaskHistoryEntry {
		c := newCall(principal, "k"+itoa(i), store.CallInProgress)
		c.TaskID, c.Tool, c.Action = task, tool, action
		claim(t, s, c)
		h := store.TaskHistoryEntry{PrincipalID: principal, TaskID: task, CallID: c.ID, Tool: tool, Action: action, Resource: resource, At: at(time.Duration(i) * time.Minute)}
		_, err := s.FinishCall(ctx, store.FinishCallParams{CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: result("ok"), Now: h.At, ExpiresAt: at(time.Hour), History: &h})
		noErr(t, "FinishCall", err)
		return h
	}
	// Interleave principals and tasks, so that order and scoping both show.
	h1 := record("agent-1", "task-1", "files", "read", "/a", 1)
	o1 := record("agent-2", "task-1", "files", "read", "/a", 2)
	h2 := record("agent-1", "task-1", "files", "write", "/a", 3)
	o2 := record("agent-1", "task-2", "files", "read", "/c", 4)
	h3 := record("agent-1", "task-1", "ci", "build", "", 5)
	h4 := record("agent-1", "task-1", "files", "read", "/b", 6)
	// A failed call leaves no trace.
	failed := newCall("agent-1", "failed", store.CallInProgress)
	claim(t, s, failed)
	finish(t, s, failed.ID, 1, store.CallFailed, at(time.Hour))

	task1 := store.TaskHistoryFilter{PrincipalID: "agent-1", TaskID: "task-1"}
	wantHistory(t, s, task1, h1, h2, h3, h4)
	wantHistory(t, s, store.TaskHistoryFilter{PrincipalID: "agent-2", TaskID: "task-1"}, o1)
	wantHistory(t, s, store.TaskHistoryFilter{PrincipalID: "agent-1", TaskID: "task-2"}, o2)
	wantHistory(t, s, store.TaskHistoryFilter{PrincipalID: "agent-1", TaskID: "task-3"})
	wantHistory(t, s, store.TaskHistoryFilter{PrincipalID: "agent-3", TaskID: "task-1"})

	f := task1
	f.Tool = "files"
	wantHistory(t, s, f, h1, h2, h4)
	f = task1
	f.Actions = []string{"read"}
	wantHistory(t, s, f, h1, h4)
	f.Actions = []string{"read", "build"}
	wantHistory(t, s, f, h1, h3, h4)
	f = task1
	f.Resource = "/a"
	wantHistory(t, s, f, h1, h2)
	f = task1
	f.Tool, f.Actions, f.Resource = "files", []string{"read", "write"}, "/a"
	wantHistory(t, s, f, h1, h2)
	f = task1
	f.Limit = 2
	wantHistory(t, s, f, h1, h2)

	_, err := s.ListTaskHistory(ctx, store.TaskHistoryFilter{TaskID: "task-1"})
	wantErr(t, "ListTaskHistory without a principal", err, store.ErrInvalid)
	_, err = s.ListTaskHistory(ctx, store.TaskHistoryFilter{PrincipalID: "agent-1"})
	wantErr(t, "ListTaskHistory without a task", err, store.ErrInvalid)
}
