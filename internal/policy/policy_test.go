package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func pipelineTool() *store.Tool {
	return &store.Tool{
		Name: "pipeline",
		Actions: []store.Action{
			{Name: "build"}, {Name: "test"}, {Name: "deploy"}, {Name: "status"},
		},
		Policies: []store.Policy{{SequentialDependency: &store.SequentialDependency{
			Action: "deploy", Requires: []string{"build", "test"},
		}}},
	}
}

func notesTool() *store.Tool {
	return &store.Tool{
		Name: "notes",
		Actions: []store.Action{
			{Name: "read", ResourceArgument: "path"},
			{Name: "stat", ResourceArgument: "path"},
			{Name: "write", ResourceArgument: "path"},
			{Name: "create", ResourceArgument: "path"},
			{Name: "list"},
		},
		Policies: []store.Policy{{ReadBeforeWrite: &store.ReadBeforeWrite{
			ReadActions: []string{"read"}, WriteActions: []string{"write"}, CreateActions: []string{"create"},
		}}},
	}
}

// world is a memory store with history written the way the executor writes
// it: FinishCall of a successful call carrying HistoryEntry.
type world struct {
	t  *testing.T
	st *memory.Store
	n  atomic.Int64
}

func newWorld(t *testing.T) *world {
	st := memory.New()
	t.Cleanup(st.Close)
	return &world{t: t, st: st}
}

func (w *world) succeed(principal, task string, tool *store.Tool, action, args string) {
	w.t.Helper()
	ctx := context.Background()
	id := fmt.Sprintf("call-%d", w.n.Add(1))
	call := &store.Call{
		ID: id, PrincipalID: principal, IdempotencyKey: id, Tool: tool.Name, Action: action,
		State: store.CallInProgress, TaskID: task, AttemptCount: 1,
		CreatedAt: t0, UpdatedAt: t0, LeaseExpiresAt: t0.Add(time.Minute),
	}
	// Errorf, not Fatalf: concurrent tests call this from goroutines.
	if _, ok, err := w.st.ClaimCall(ctx, store.ClaimCallParams{Call: call, Lease: time.Minute}); err != nil || !ok {
		w.t.Errorf("ClaimCall: %v, %v", ok, err)
		return
	}
	if _, err := w.st.FinishCall(ctx, store.FinishCallParams{
		CallID: id, Attempt: 1, State: store.CallSucceeded,
		Result: &store.Result{Success: true, Message: "ok"}, Now: t0, ExpiresAt: t0.Add(time.Hour),
		History: HistoryEntry(tool, tool.Action(action), principal, task, id, json.RawMessage(args), t0),
	}); err != nil {
		w.t.Errorf("FinishCall: %v", err)
	}
}

func (w *world) eval(in Input) Decision {
	w.t.Helper()
	return New(w.st).Evaluate(context.Background(), in)
}

func in(tool *store.Tool, action, principal, task, args string) Input {
	return Input{Tool: tool, Action: action, PrincipalID: principal, TaskID: task, Arguments: json.RawMessage(args)}
}

func wantAllowed(t *testing.T, d Decision) {
	t.Helper()
	if !d.Allowed {
		t.Fatalf("denied by %s: %s", d.Policy, d.Message)
	}
}

func wantDenied(t *testing.T, d Decision, policy, message string) {
	t.Helper()
	if d.Allowed {
		t.Fatalf("allowed, want denial by %s: %q", policy, message)
	}
	if d.Policy != policy || d.Message != message {
		t.Fatalf("denied by %s: %q\nwant %s: %q", d.Policy, d.Message, policy, message)
	}
}

func TestSequentialDependency(t *testing.T) {
	tool := pipelineTool()

	t.Run("none met lists all in declared order", func(t *testing.T) {
		w := newWorld(t)
		wantDenied(t, w.eval(in(tool, "deploy", "alice", "t1", `{}`)), SequentialDependency,
			"Tool 'pipeline.deploy' requires: build, test")
	})
	t.Run("partially met lists only the missing", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("alice", "t1", tool, "test", `{}`)
		wantDenied(t, w.eval(in(tool, "deploy", "alice", "t1", `{}`)), SequentialDependency,
			"Tool 'pipeline.deploy' requires: build")
	})
	t.Run("all met", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("alice", "t1", tool, "test", `{}`)
		w.succeed("alice", "t1", tool, "status", `{}`)
		w.succeed("alice", "t1", tool, "build", `{}`)
		wantAllowed(t, w.eval(in(tool, "deploy", "alice", "t1", `{}`)))
	})
	t.Run("other principal's task does not count", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("bob", "t1", tool, "build", `{}`)
		w.succeed("bob", "t1", tool, "test", `{}`)
		wantDenied(t, w.eval(in(tool, "deploy", "alice", "t1", `{}`)), SequentialDependency,
			"Tool 'pipeline.deploy' requires: build, test")
	})
	t.Run("other task does not count", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("alice", "t0", tool, "build", `{}`)
		w.succeed("alice", "t1", tool, "test", `{}`)
		wantDenied(t, w.eval(in(tool, "deploy", "alice", "t1", `{}`)), SequentialDependency,
			"Tool 'pipeline.deploy' requires: build")
	})
	t.Run("same action name of another tool does not count", func(t *testing.T) {
		w := newWorld(t)
		other := &store.Tool{Name: "ci", Actions: []store.Action{{Name: "build"}, {Name: "test"}}}
		w.succeed("alice", "t1", other, "build", `{}`)
		w.succeed("alice", "t1", other, "test", `{}`)
		wantDenied(t, w.eval(in(tool, "deploy", "alice", "t1", `{}`)), SequentialDependency,
			"Tool 'pipeline.deploy' requires: build, test")
	})
	t.Run("ungoverned actions pass", func(t *testing.T) {
		w := newWorld(t)
		wantAllowed(t, w.eval(in(tool, "status", "alice", "t1", `{}`)))
		wantAllowed(t, w.eval(in(tool, "build", "alice", "", `{}`)))
	})
	t.Run("no task id", func(t *testing.T) {
		w := newWorld(t)
		d := w.eval(in(tool, "deploy", "alice", "", `{}`))
		if d.Allowed || d.Policy != SequentialDependency ||
			!strings.HasPrefix(d.Message, "Tool 'pipeline.deploy' requires: build, test") || !strings.Contains(d.Message, "task_id") {
			t.Fatalf("no task: %+v", d)
		}
	})
}

func TestSequentialDependencyCrossTool(t *testing.T) {
	ci := &store.Tool{Name: "ci", Actions: []store.Action{{Name: "build"}}}
	infra := &store.Tool{Name: "infra", Actions: []store.Action{{Name: "plan"}}}
	deploy := &store.Tool{
		Name:    "deployer",
		Actions: []store.Action{{Name: "release"}, {Name: "build"}},
		Policies: []store.Policy{{SequentialDependency: &store.SequentialDependency{
			Action: "release", Requires: []string{"ci.build", "infra.plan"},
		}}},
	}
	w := newWorld(t)
	// The same tool's "build" is not ci's.
	w.succeed("alice", "t1", deploy, "build", `{}`)
	wantDenied(t, w.eval(in(deploy, "release", "alice", "t1", `{}`)), SequentialDependency,
		"Tool 'deployer.release' requires: ci.build, infra.plan")
	// ci and infra have no policies at all: their successes still count.
	w.succeed("alice", "t1", ci, "build", `{}`)
	wantDenied(t, w.eval(in(deploy, "release", "alice", "t1", `{}`)), SequentialDependency,
		"Tool 'deployer.release' requires: infra.plan")
	w.succeed("alice", "t1", infra, "plan", `{}`)
	wantAllowed(t, w.eval(in(deploy, "release", "alice", "t1", `{}`)))
}

func TestRequirementWithDottedActionName(t *testing.T) {
	tool := &store.Tool{
		Name:    "fs",
		Actions: []store.Action{{Name: "files.read"}, {Name: "files.write"}},
		Policies: []store.Policy{{SequentialDependency: &store.SequentialDependency{
			Action: "files.write", Requires: []string{"files.read"},
		}}},
	}
	w := newWorld(t)
	wantDenied(t, w.eval(in(tool, "files.write", "alice", "t1", `{}`)), SequentialDependency,
		"Tool 'fs.files.write' requires: files.read")
	w.succeed("alice", "t1", tool, "files.read", `{}`)
	wantAllowed(t, w.eval(in(tool, "files.write", "alice", "t1", `{}`)))
}

func TestReadBeforeWrite(t *testing.T) {
	tool := notesTool()
	const needRead = `Tool 'notes.write' requires an earlier read of path "/a.md" in this task (with notes.read)`

	t.Run("write after read of the same resource", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("alice", "t1", tool, "read", `{"path":"/a.md"}`)
		wantAllowed(t, w.eval(in(tool, "write", "alice", "t1", `{"path":"/a.md","text":"x"}`)))
	})
	t.Run("write without read", func(t *testing.T) {
		w := newWorld(t)
		wantDenied(t, w.eval(in(tool, "write", "alice", "t1", `{"path":"/a.md","text":"x"}`)), ReadBeforeWrite, needRead)
	})
	t.Run("read of another resource", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("alice", "t1", tool, "read", `{"path":"/b.md"}`)
		wantDenied(t, w.eval(in(tool, "write", "alice", "t1", `{"path":"/a.md","text":"x"}`)), ReadBeforeWrite, needRead)
	})
	t.Run("a non-read action on the resource does not count", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("alice", "t1", tool, "stat", `{"path":"/a.md"}`)
		wantDenied(t, w.eval(in(tool, "write", "alice", "t1", `{"path":"/a.md","text":"x"}`)), ReadBeforeWrite, needRead)
	})
	t.Run("read in another task or by another principal", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("alice", "t0", tool, "read", `{"path":"/a.md"}`)
		w.succeed("bob", "t1", tool, "read", `{"path":"/a.md"}`)
		wantDenied(t, w.eval(in(tool, "write", "alice", "t1", `{"path":"/a.md","text":"x"}`)), ReadBeforeWrite, needRead)
	})
	t.Run("no task id", func(t *testing.T) {
		w := newWorld(t)
		wantDenied(t, w.eval(in(tool, "write", "alice", "", `{"path":"/a.md"}`)), ReadBeforeWrite,
			needRead+", and this call has no task_id; read and write within one task")
	})
	t.Run("missing resource argument", func(t *testing.T) {
		w := newWorld(t)
		w.succeed("alice", "t1", tool, "read", `{"path":"/a.md"}`)
		wantDenied(t, w.eval(in(tool, "write", "alice", "t1", `{"text":"x"}`)), ReadBeforeWrite,
			`Tool 'notes.write' requires the argument "path" to name the resource it writes.`)
	})
	t.Run("ungoverned actions pass", func(t *testing.T) {
		w := newWorld(t)
		wantAllowed(t, w.eval(in(tool, "read", "alice", "t1", `{"path":"/a.md"}`)))
		wantAllowed(t, w.eval(in(tool, "list", "alice", "", `{}`)))
	})
}

func TestReadBeforeWriteCreate(t *testing.T) {
	tool := notesTool()
	exists := func(v bool, err error) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) { return v, err }
	}
	const needRead = `Tool 'notes.create' requires an earlier read of path "/new.md" in this task (with notes.read)`

	t.Run("create of a new resource", func(t *testing.T) {
		w := newWorld(t)
		i := in(tool, "create", "alice", "t1", `{"path":"/new.md"}`)
		i.Exists = exists(false, nil)
		wantAllowed(t, w.eval(i))
		i.TaskID = "" // needs no predecessor, so no task either
		wantAllowed(t, w.eval(i))
	})
	t.Run("create of an existing resource needs a read", func(t *testing.T) {
		w := newWorld(t)
		i := in(tool, "create", "alice", "t1", `{"path":"/new.md"}`)
		i.Exists = exists(true, nil)
		wantDenied(t, w.eval(i), ReadBeforeWrite, needRead)
		w.succeed("alice", "t1", tool, "read", `{"path":"/new.md"}`)
		wantAllowed(t, w.eval(i))
	})
	t.Run("create when the tool cannot tell", func(t *testing.T) {
		w := newWorld(t)
		wantDenied(t, w.eval(in(tool, "create", "alice", "t1", `{"path":"/new.md"}`)), ReadBeforeWrite, needRead)
	})
	t.Run("exists error denies", func(t *testing.T) {
		w := newWorld(t)
		i := in(tool, "create", "alice", "t1", `{"path":"/new.md"}`)
		boom := errors.New("stat /srv/notes/new.md: input/output error")
		i.Exists = exists(false, boom)
		d := w.eval(i)
		wantDenied(t, d, ReadBeforeWrite, `Tool 'notes.create' could not check whether path "/new.md" exists; read it first, or retry later.`)
		if !errors.Is(d.Err, boom) {
			t.Errorf("Err = %v, want the cause", d.Err)
		}
	})
	t.Run("a write action is not a create", func(t *testing.T) {
		w := newWorld(t)
		i := in(tool, "write", "alice", "t1", `{"path":"/new.md"}`)
		i.Exists = exists(false, nil)
		if d := w.eval(i); d.Allowed {
			t.Fatal("a plain write to a new resource was allowed without a read")
		}
	})
}

// spyHistory records every filter and can fail.
type spyHistory struct {
	store.TaskHistoryStore
	mu      sync.Mutex
	filters []store.TaskHistoryFilter
	err     error
}

func (s *spyHistory) ListTaskHistory(ctx context.Context, f store.TaskHistoryFilter) ([]store.TaskHistoryEntry, error) {
	s.mu.Lock()
	s.filters = append(s.filters, f)
	s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	return s.TaskHistoryStore.ListTaskHistory(ctx, f)
}

func TestStoreErrorDenies(t *testing.T) {
	cause := fmt.Errorf("dial tcp 10.0.0.7:5432: connect: connection refused: %w", store.ErrUnavailable)
	spy := &spyHistory{TaskHistoryStore: memory.New(), err: cause}
	e := New(spy)
	for _, c := range []struct {
		name   string
		input  Input
		policy string
	}{
		{"sequential", in(pipelineTool(), "deploy", "alice", "t1", `{}`), SequentialDependency},
		{"read before write", in(notesTool(), "write", "alice", "t1", `{"path":"/a.md"}`), ReadBeforeWrite},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := e.Evaluate(context.Background(), c.input)
			if d.Allowed || d.Policy != c.policy {
				t.Fatalf("store error: %+v, want denial by %s", d, c.policy)
			}
			if !errors.Is(d.Err, store.ErrUnavailable) {
				t.Errorf("Err = %v, want the store error", d.Err)
			}
			if strings.Contains(d.Message, "10.0.0.7") || strings.Contains(d.Message, "dial") || !strings.Contains(d.Message, "Retry later") {
				t.Errorf("message %q leaks internals or gives no advice", d.Message)
			}
		})
	}
}

// TestQueriesAreNarrow: policies ask for one entry of one action of one tool
// (and one resource), never for a whole task.
func TestQueriesAreNarrow(t *testing.T) {
	w := newWorld(t)
	spy := &spyHistory{TaskHistoryStore: w.st}
	e := New(spy)
	e.Evaluate(context.Background(), in(pipelineTool(), "deploy", "alice", "t1", `{}`))
	e.Evaluate(context.Background(), in(notesTool(), "write", "alice", "t1", `{"path":"/a.md"}`))
	if len(spy.filters) != 3 {
		t.Fatalf("%d queries, want 3 (build, test, read of /a.md)", len(spy.filters))
	}
	for _, f := range spy.filters {
		if f.PrincipalID != "alice" || f.TaskID != "t1" || f.Tool == "" || len(f.Actions) == 0 || f.Limit != 1 {
			t.Errorf("broad query %+v", f)
		}
	}
	if f := spy.filters[2]; f.Resource != "/a.md" || f.Tool != "notes" {
		t.Errorf("read-before-write query %+v, want tool notes and resource /a.md", f)
	}
}

func TestEveryPolicyMustAllow(t *testing.T) {
	tool := notesTool()
	tool.Policies = append(tool.Policies, store.Policy{SequentialDependency: &store.SequentialDependency{
		Action: "write", Requires: []string{"list"},
	}})
	w := newWorld(t)
	w.succeed("alice", "t1", tool, "read", `{"path":"/a.md"}`)
	wantDenied(t, w.eval(in(tool, "write", "alice", "t1", `{"path":"/a.md"}`)), SequentialDependency,
		"Tool 'notes.write' requires: list")
	w.succeed("alice", "t1", tool, "list", `{}`)
	wantAllowed(t, w.eval(in(tool, "write", "alice", "t1", `{"path":"/a.md"}`)))
}

func TestMalformedPolicyDenies(t *testing.T) {
	tool := pipelineTool()
	tool.Policies = append(tool.Policies, store.Policy{})
	w := newWorld(t)
	if d := w.eval(in(tool, "status", "alice", "t1", `{}`)); d.Allowed || d.Policy != Malformed {
		t.Fatalf("empty policy: %+v, want denial", d)
	}
	if d := w.eval(Input{Action: "x"}); d.Allowed {
		t.Fatal("nil tool allowed")
	}
	noResource := notesTool()
	noResource.Actions[2].ResourceArgument = ""
	if d := w.eval(in(noResource, "write", "alice", "t1", `{"path":"/a.md"}`)); d.Allowed || d.Policy != ReadBeforeWrite {
		t.Fatalf("write action without resource argument: %+v, want denial", d)
	}
}

// TestConcurrentEvaluate: policies read while other calls of the task record
// history; every evaluation sees a consistent answer.
func TestConcurrentEvaluate(t *testing.T) {
	tool := pipelineTool()
	w := newWorld(t)
	e := New(w.st)
	var wg sync.WaitGroup
	for i := range 8 {
		task := fmt.Sprintf("t%d", i)
		wg.Go(func() {
			if d := e.Evaluate(context.Background(), in(tool, "deploy", "alice", task, `{}`)); d.Allowed {
				t.Errorf("%s: deploy allowed before build and test", task)
			}
			w.succeed("alice", task, tool, "build", `{}`)
			w.succeed("alice", task, tool, "test", `{}`)
			if d := e.Evaluate(context.Background(), in(tool, "deploy", "alice", task, `{}`)); !d.Allowed {
				t.Errorf("%s: %s", task, d.Message)
			}
		})
	}
	wg.Wait()
}

func TestResourceOf(t *testing.T) {
	a := &store.Action{Name: "write", ResourceArgument: "id"}
	cases := []struct {
		args string
		want string
	}{
		{`{"id":"doc-1"}`, "doc-1"},
		{`{"id":42}`, "42"},
		{`{"id":42.0}`, "42"},
		{`{"id":{"b":1,"a":[true]}}`, `{"a":[true],"b":1}`},
		{`{"id":null}`, ""},
		{`{"other":"x"}`, ""},
		{`{}`, ""},
		{``, ""},
		{`[1]`, ""},
		// NUL cannot be stored in a text column: the JSON text names it.
		{`{"id":"a\u0000b"}`, `"a\u0000b"`},
		{`{"id":"日本 😀"}`, "日本 😀"},
	}
	for _, c := range cases {
		if got := ResourceOf(a, json.RawMessage(c.args)); got != c.want {
			t.Errorf("ResourceOf(%s) = %q, want %q", c.args, got, c.want)
		}
	}
	if got := ResourceOf(&store.Action{Name: "x"}, json.RawMessage(`{"id":"a"}`)); got != "" {
		t.Errorf("action without resource argument: %q", got)
	}
	if got := ResourceOf(nil, json.RawMessage(`{"id":"a"}`)); got != "" {
		t.Errorf("nil action: %q", got)
	}
}

func TestHistoryEntry(t *testing.T) {
	tool := notesTool()
	e := HistoryEntry(tool, tool.Action("read"), "alice", "t1", "call-9", json.RawMessage(`{"path":"/a.md"}`), t0)
	want := store.TaskHistoryEntry{PrincipalID: "alice", TaskID: "t1", CallID: "call-9", Tool: "notes", Action: "read", Resource: "/a.md", At: t0}
	if e == nil || *e != want {
		t.Fatalf("HistoryEntry = %+v, want %+v", e, want)
	}
	// Tools without policies are recorded too.
	plain := &store.Tool{Name: "ci", Actions: []store.Action{{Name: "build"}}}
	if e := HistoryEntry(plain, plain.Action("build"), "alice", "t1", "call-10", nil, t0); e == nil || e.Tool != "ci" || e.Action != "build" {
		t.Fatalf("HistoryEntry of an ungoverned tool = %+v", e)
	}
	if e := HistoryEntry(tool, tool.Action("read"), "alice", "", "call-11", nil, t0); e != nil {
		t.Fatalf("HistoryEntry without a task = %+v, want nil", e)
	}
}
