package demo

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/toolsvc/toolsvc/toolkit"
)

func previewNotes(t *testing.T, n *Notes, action, args string) (*toolkit.PreviewResult, NotePreview) {
	t.Helper()
	p, err := n.Preview(context.Background(), newCall("notes", action, args))
	if err != nil {
		t.Fatalf("Preview %s %s: %v", action, args, err)
	}
	return p, valueAs[NotePreview](t, p.Value)
}

func exists(t *testing.T, n *Notes, path string) bool {
	t.Helper()
	ok, err := n.ResourceExists(context.Background(), newCall("notes", "write", `{"path":"`+path+`","content":""}`))
	if err != nil {
		t.Fatalf("ResourceExists(%s): %v", path, err)
	}
	return ok
}

func TestNotesLifecycle(t *testing.T) {
	n := NewNotes()

	r := succeed(t, n, "list", `{}`)
	if got := valueAs[NoteList](t, r.Value); got.Paths == nil || len(got.Paths) != 0 {
		t.Fatalf("empty list = %#v, want an empty (not null) list", got.Paths)
	}
	fail(t, n, "read", `{"path":"/todo.md"}`, "no note at path /todo.md")
	fail(t, n, "delete", `{"path":"/todo.md"}`, "no note at path /todo.md")
	if exists(t, n, "/todo.md") {
		t.Fatal("ResourceExists before the note was written")
	}

	r = succeed(t, n, "write", `{"path":"/todo.md","content":"- milk\n"}`)
	if got := valueAs[NoteWritten](t, r.Value); got != (NoteWritten{Path: "/todo.md", Revision: 1, Created: true}) {
		t.Fatalf("create = %+v", got)
	}
	if !exists(t, n, "/todo.md") {
		t.Fatal("ResourceExists false after write")
	}
	r = succeed(t, n, "read", `{"path":"/todo.md"}`)
	if got := valueAs[Note](t, r.Value); got != (Note{Path: "/todo.md", Content: "- milk\n", Revision: 1}) {
		t.Fatalf("read = %+v", got)
	}
	if !strings.Contains(r.Message, "- milk") {
		t.Fatalf("read message %q does not show the content", r.Message)
	}

	r = succeed(t, n, "write", `{"path":"/todo.md","content":"- milk\n- eggs\n"}`)
	if got := valueAs[NoteWritten](t, r.Value); got != (NoteWritten{Path: "/todo.md", Revision: 2, Created: false}) {
		t.Fatalf("replace = %+v", got)
	}
	succeed(t, n, "write", `{"path":"/projects/plan.md","content":""}`)
	succeed(t, n, "write", `{"path":"/projects/x/y.txt","content":"y"}`)

	r = succeed(t, n, "list", `{}`)
	if got := valueAs[NoteList](t, r.Value); strings.Join(got.Paths, " ") != "/projects/plan.md /projects/x/y.txt /todo.md" {
		t.Fatalf("list = %v", got.Paths)
	}
	r = succeed(t, n, "list", `{"prefix":"/projects/"}`)
	if got := valueAs[NoteList](t, r.Value); strings.Join(got.Paths, " ") != "/projects/plan.md /projects/x/y.txt" {
		t.Fatalf("list with prefix = %v", got.Paths)
	}

	r = succeed(t, n, "delete", `{"path":"/todo.md"}`)
	if got := valueAs[NoteDeleted](t, r.Value); got != (NoteDeleted{Path: "/todo.md", Revision: 2}) {
		t.Fatalf("delete = %+v", got)
	}
	fail(t, n, "read", `{"path":"/todo.md"}`, "no note at path")
	if exists(t, n, "/todo.md") {
		t.Fatal("ResourceExists true after delete")
	}
	// A recreated note never reuses a revision.
	r = succeed(t, n, "write", `{"path":"/todo.md","content":"again"}`)
	if got := valueAs[NoteWritten](t, r.Value); got.Revision != 5 || !got.Created {
		t.Fatalf("recreate = %+v, want revision 5, created", got)
	}
}

func TestNotesRefusesBadArguments(t *testing.T) {
	n := NewNotes()
	fail(t, n, "write", `{"path":"todo.md","content":"x"}`, `invalid path "todo.md"`)
	fail(t, n, "write", `{"path":"/a b","content":"x"}`, "invalid path")
	fail(t, n, "write", `{"path":"/a"}`, "write needs content")
	fail(t, n, "write", `{"path":"/a","content":"`+strings.Repeat("x", maxNoteContent+1)+`"}`, "longer than 65536")
	fail(t, n, "read", `{}`, "invalid path")
	fail(t, n, "read", `{"path":7}`, "invalid arguments")
	if r := succeed(t, n, "list", `{}`); len(valueAs[NoteList](t, r.Value).Paths) != 0 {
		t.Fatal("a refused write stored a note")
	}
	if _, err := n.ResourceExists(context.Background(), newCall("notes", "read", `{"path":"nope"}`)); err == nil {
		t.Fatal("ResourceExists accepted an invalid path")
	}
	if _, err := n.Preview(context.Background(), newCall("notes", "write", `{"path":"nope","content":""}`)); err == nil {
		t.Fatal("Preview accepted an invalid path")
	}
}

func TestNotesDoNotWriteAfterTheDeadline(t *testing.T) {
	n := NewNotes()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, err := n.Execute(ctx, newCall("notes", "write", `{"path":"/a","content":"x"}`))
	if err == nil {
		t.Fatalf("write with a cancelled context = %+v, want an error", r)
	}
	if exists(t, n, "/a") {
		t.Fatal("write with a cancelled context stored the note")
	}
}

func TestNotesPreview(t *testing.T) {
	n := NewNotes()

	p, v := previewNotes(t, n, "write", `{"path":"/todo.md","content":"- milk\n"}`)
	want := NotePreview{Path: "/todo.md", Operation: "create", Diff: "--- /dev/null\n+++ /todo.md\n@@ -0,0 +1 @@\n+- milk\n", Added: 1}
	if v != want {
		t.Fatalf("preview create = %+v, want %+v", v, want)
	}
	if !strings.HasPrefix(p.Message, "would create /todo.md with 1 line") || !strings.Contains(p.Message, "+- milk") {
		t.Fatalf("preview create message %q", p.Message)
	}
	if exists(t, n, "/todo.md") {
		t.Fatal("preview of write created the note")
	}

	succeed(t, n, "write", `{"path":"/todo.md","content":"- milk\n- eggs\n"}`)
	p, v = previewNotes(t, n, "write", `{"path":"/todo.md","content":"- milk\n- bread\n"}`)
	want = NotePreview{
		Path: "/todo.md", Operation: "replace", Exists: true, Revision: 1,
		Diff:  "--- /todo.md\n+++ /todo.md\n@@ -1,2 +1,2 @@\n - milk\n-- eggs\n+- bread\n",
		Added: 1, Removed: 1,
	}
	if v != want {
		t.Fatalf("preview replace = %+v, want %+v", v, want)
	}
	if !strings.HasPrefix(p.Message, "would replace /todo.md (revision 1): +1 -1 lines") {
		t.Fatalf("preview replace message %q", p.Message)
	}
	r := succeed(t, n, "read", `{"path":"/todo.md"}`)
	if got := valueAs[Note](t, r.Value); got.Content != "- milk\n- eggs\n" || got.Revision != 1 {
		t.Fatalf("preview of write changed the note: %+v", got)
	}

	p, v = previewNotes(t, n, "write", `{"path":"/todo.md","content":"- milk\n- eggs\n"}`)
	if v.Operation != "replace" || v.Diff != "" || !strings.Contains(p.Message, "no change") {
		t.Fatalf("preview of an identical write = %+v, %q", v, p.Message)
	}

	p, v = previewNotes(t, n, "delete", `{"path":"/todo.md"}`)
	want = NotePreview{
		Path: "/todo.md", Operation: "delete", Exists: true, Revision: 1,
		Diff:    "--- /todo.md\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-- milk\n-- eggs\n",
		Removed: 2,
	}
	if v != want {
		t.Fatalf("preview delete = %+v, want %+v", v, want)
	}
	if !strings.HasPrefix(p.Message, "would delete /todo.md (revision 1, 2 lines)") {
		t.Fatalf("preview delete message %q", p.Message)
	}
	if !exists(t, n, "/todo.md") {
		t.Fatal("preview of delete removed the note")
	}

	p, v = previewNotes(t, n, "delete", `{"path":"/missing"}`)
	if v.Exists || v.Operation != "delete" || !strings.Contains(p.Message, "would fail: no note at path /missing") {
		t.Fatalf("preview delete of a missing note = %+v, %q", v, p.Message)
	}
	p, v = previewNotes(t, n, "read", `{"path":"/todo.md"}`)
	if v.Operation != "read" || !strings.Contains(p.Message, "no changes") {
		t.Fatalf("preview read = %+v, %q", v, p.Message)
	}
	p, v = previewNotes(t, n, "list", `{}`)
	if v.Operation != "list" || !strings.Contains(p.Message, "1 notes exist") {
		t.Fatalf("preview list = %+v, %q", v, p.Message)
	}
}

// TestNotesConcurrentWrites writes from many goroutines at once: every write
// gets its own revision, and the store ends with every note.
func TestNotesConcurrentWrites(t *testing.T) {
	n := NewNotes()
	const writers, each = 8, 25
	type written struct {
		path, content string
		rev           int64
	}
	revisions := make(chan written, writers*each)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				// Half the writes go to a shared path, half to the writer's own.
				path := "/shared"
				if i%2 == 1 {
					path = fmt.Sprintf("/w%d/%d", w, i)
				}
				content := fmt.Sprintf("%d-%d", w, i)
				r, err := n.Execute(context.Background(), newCall("notes", "write", fmt.Sprintf(`{"path":%q,"content":%q}`, path, content)))
				if err != nil || !r.Success {
					t.Errorf("write: %+v, %v", r, err)
					return
				}
				revisions <- written{path, content, valueAs[NoteWritten](t, r.Value).Revision}
				if _, err := n.ResourceExists(context.Background(), newCall("notes", "read", fmt.Sprintf(`{"path":%q}`, path))); err != nil {
					t.Errorf("ResourceExists: %v", err)
				}
			}
		})
	}
	wg.Wait()
	close(revisions)
	seen := map[int64]bool{}
	var lastShared written
	for w := range revisions {
		if seen[w.rev] {
			t.Fatalf("revision %d handed out twice", w.rev)
		}
		seen[w.rev] = true
		if w.path == "/shared" && w.rev > lastShared.rev {
			lastShared = w
		}
	}
	if len(seen) != writers*each {
		t.Fatalf("%d revisions, want %d", len(seen), writers*each)
	}
	r := succeed(t, n, "list", `{}`)
	if got := len(valueAs[NoteList](t, r.Value).Paths); got != 1+writers*(each/2) {
		t.Fatalf("list has %d notes, want %d", got, 1+writers*(each/2))
	}
	r = succeed(t, n, "read", `{"path":"/shared"}`)
	// The note holds what the write with the highest revision wrote.
	if got := valueAs[Note](t, r.Value); got.Revision != lastShared.rev || got.Content != lastShared.content {
		t.Fatalf("shared note = %+v, want revision %d with %q", got, lastShared.rev, lastShared.content)
	}
}
