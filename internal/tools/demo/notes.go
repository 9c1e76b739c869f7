package demo

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/toolsvc/toolsvc/toolkit"
)

// maxNoteContent bounds a note, in characters (as the schema's maxLength
// counts them).
const maxNoteContent = 65536

// notePath is the schema's path pattern, checked again in the tool because a
// tool must not trust that it is only ever called through the runtime.
var notePath = regexp.MustCompile(`^/[a-zA-Z0-9._/-]{1,200}$`)

// Notes is an in-memory store of text notes addressed by path. Reads are low
// risk; writes and deletes are high risk, can be previewed (with a line diff)
// and are guarded by a read-before-write policy that lets write create a note
// that does not exist yet.
type Notes struct {
	mu   sync.Mutex
	docs map[string]note
	// seq hands out revisions: every write gets a new one, so a revision
	// never names two different contents of a path, even across a delete.
	seq int64
}

type note struct {
	content  string
	revision int64
}

// NewNotes returns an empty notes tool.
func NewNotes() *Notes { return &Notes{docs: make(map[string]note)} }

var (
	_ toolkit.Previewer       = (*Notes)(nil)
	_ toolkit.ResourceChecker = (*Notes)(nil)
)

const pathProperty = `"path": {"type": "string", "pattern": "^/[a-zA-Z0-9._/-]{1,200}$", "description": "The note's path, such as /todo.md."}`

// Definition describes the notes tool.
func (*Notes) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name:           "notes",
		Description:    "Keep short text notes addressed by path (such as /todo.md): list, read, write and delete them. Writes must read the note first unless they create it.",
		Capabilities:   []string{"demo", "documents"},
		RequiredScopes: []string{"notes"},
		DefaultRisk:    toolkit.RiskLow,
		AuditPayloads:  true,
		Guidance: "Notes are addressed by absolute paths such as /todo.md. List or read before you write: " +
			"replacing or deleting a note you have not read in this task is refused.",
		Policies: []toolkit.Policy{{ReadBeforeWrite: &toolkit.ReadBeforeWrite{
			ReadActions:   []string{"read"},
			WriteActions:  []string{"write", "delete"},
			CreateActions: []string{"write"},
		}}},
		Actions: []toolkit.Action{
			{
				Name:        "list",
				Description: "List the paths of all notes, sorted, optionally only those starting with a prefix.",
				Risk:        toolkit.RiskLow,
				InputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {
						"prefix": {"type": "string", "pattern": "^/[a-zA-Z0-9._/-]{0,200}$", "description": "Only list paths that start with this prefix, such as /projects/."}
					}
				}`),
				OutputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {"paths": {"type": "array", "items": {"type": "string"}}},
					"required": ["paths"]
				}`),
				Examples: []toolkit.Example{
					{Description: "List every note.", Input: toolkit.JSON(`{}`), Output: toolkit.JSON(`{"paths": ["/projects/plan.md", "/todo.md"]}`)},
					{Description: "List the notes under /projects/.", Input: toolkit.JSON(`{"prefix": "/projects/"}`), Output: toolkit.JSON(`{"paths": ["/projects/plan.md"]}`)},
				},
			},
			{
				Name:             "read",
				Description:      "Read a note: its content and its current revision. Fails if there is no note at the path.",
				Risk:             toolkit.RiskLow,
				ResourceArgument: "path",
				InputSchema:      toolkit.JSON(`{"type": "object", "properties": {` + pathProperty + `}, "required": ["path"]}`),
				OutputSchema:     noteOutputSchema,
				Examples: []toolkit.Example{
					{Description: "Read the to-do list.", Input: toolkit.JSON(`{"path": "/todo.md"}`), Output: toolkit.JSON(`{"path": "/todo.md", "content": "- buy milk\n", "revision": 3}`)},
				},
			},
			{
				Name:        "write",
				Description: "Create a note, or replace the content of an existing one (read it first). Content is at most 65536 characters.",
				Risk:        toolkit.RiskHigh,
				Guidance: "Send the whole new content: a write replaces the note. A write may need a person's approval; " +
					"if so, wait for it and call again with the same idempotency key and arguments.",
				ResourceArgument: "path",
				InputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {
						` + pathProperty + `,
						"content": {"type": "string", "maxLength": 65536, "description": "The note's full new content."}
					},
					"required": ["path", "content"]
				}`),
				OutputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {"path": {"type": "string"}, "revision": {"type": "integer"}, "created": {"type": "boolean"}},
					"required": ["path", "revision", "created"]
				}`),
				Examples: []toolkit.Example{
					{Description: "Create or replace the to-do list.", Input: toolkit.JSON(`{"path": "/todo.md", "content": "- buy milk\n- call Bob\n"}`), Output: toolkit.JSON(`{"path": "/todo.md", "revision": 4, "created": false}`)},
				},
			},
			{
				Name:             "delete",
				Description:      "Delete a note (read it first). Fails if there is no note at the path.",
				Risk:             toolkit.RiskHigh,
				ResourceArgument: "path",
				InputSchema:      toolkit.JSON(`{"type": "object", "properties": {` + pathProperty + `}, "required": ["path"]}`),
				OutputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {"path": {"type": "string"}, "revision": {"type": "integer"}},
					"required": ["path", "revision"]
				}`),
				Examples: []toolkit.Example{
					{Description: "Delete the to-do list.", Input: toolkit.JSON(`{"path": "/todo.md"}`), Output: toolkit.JSON(`{"path": "/todo.md", "revision": 4}`)},
				},
			},
		},
	}
}

var noteOutputSchema = toolkit.JSON(`{
	"type": "object",
	"properties": {"path": {"type": "string"}, "content": {"type": "string"}, "revision": {"type": "integer"}},
	"required": ["path", "content", "revision"]
}`)

// NoteList is the value of list.
type NoteList struct {
	Paths []string `json:"paths"`
}

// Note is the value of read.
type Note struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Revision int64  `json:"revision"`
}

// NoteWritten is the value of write.
type NoteWritten struct {
	Path     string `json:"path"`
	Revision int64  `json:"revision"`
	Created  bool   `json:"created"`
}

// NoteDeleted is the value of delete: the revision that was removed.
type NoteDeleted struct {
	Path     string `json:"path"`
	Revision int64  `json:"revision"`
}

// NotePreview is the value of a preview.
type NotePreview struct {
	Path string `json:"path,omitempty"`
	// Operation is create, replace, delete, read or list.
	Operation string `json:"operation"`
	// Exists says whether a note is at Path now.
	Exists bool `json:"exists"`
	// Revision is the current revision of the note, if it exists.
	Revision int64 `json:"revision,omitempty"`
	// Diff is a unified-style line diff of what write or delete would change.
	Diff    string `json:"diff,omitempty"`
	Added   int    `json:"added"`
	Removed int    `json:"removed"`
}

type noteArgs struct {
	Path    string  `json:"path"`
	Content *string `json:"content"`
	Prefix  string  `json:"prefix"`
}

// args decodes and checks the arguments of action.
func (*Notes) args(call *toolkit.Call) (noteArgs, *toolkit.Result) {
	var a noteArgs
	if r := bind(call, &a); r != nil {
		return a, r
	}
	switch call.Action {
	case "read", "write", "delete":
		if !notePath.MatchString(a.Path) {
			return a, toolkit.Failure(fmt.Sprintf("invalid path %q: it must start with / and use only letters, digits and . _ / -", a.Path))
		}
	}
	if call.Action == "write" {
		if a.Content == nil {
			return a, toolkit.Failure("write needs content")
		}
		if utf8.RuneCountInString(*a.Content) > maxNoteContent {
			return a, toolkit.Failure("content is longer than 65536 characters")
		}
	}
	return a, nil
}

// Execute runs list, read, write or delete.
func (n *Notes) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	a, r := n.args(call)
	if r != nil {
		return r, nil
	}
	// Nothing below blocks, but a call whose deadline has passed must not
	// change anything: the runtime may already have recorded it as timed out.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	switch call.Action {
	case "list":
		paths := make([]string, 0, len(n.docs))
		for p := range n.docs {
			if strings.HasPrefix(p, a.Prefix) {
				paths = append(paths, p)
			}
		}
		sort.Strings(paths)
		msg := fmt.Sprintf("%d notes", len(paths))
		if len(paths) == 1 {
			msg = "1 note"
		}
		if len(paths) > 0 {
			msg += ": " + strings.Join(paths, ", ")
		}
		return toolkit.OK(NoteList{Paths: paths}, msg), nil
	case "read":
		d, ok := n.docs[a.Path]
		if !ok {
			return toolkit.Failure("no note at path " + a.Path), nil
		}
		return toolkit.OK(Note{Path: a.Path, Content: d.content, Revision: d.revision}, fmt.Sprintf("%s (revision %d):\n%s", a.Path, d.revision, d.content)), nil
	case "write":
		_, existed := n.docs[a.Path]
		n.seq++
		n.docs[a.Path] = note{content: *a.Content, revision: n.seq}
		verb := "replaced"
		if !existed {
			verb = "created"
		}
		return toolkit.OK(NoteWritten{Path: a.Path, Revision: n.seq, Created: !existed}, fmt.Sprintf("%s %s (revision %d)", verb, a.Path, n.seq)), nil
	case "delete":
		d, ok := n.docs[a.Path]
		if !ok {
			return toolkit.Failure("no note at path " + a.Path), nil
		}
		delete(n.docs, a.Path)
		return toolkit.OK(NoteDeleted{Path: a.Path, Revision: d.revision}, fmt.Sprintf("deleted %s (revision %d)", a.Path, d.revision)), nil
	}
	return nil, fmt.Errorf("notes: unknown action %q", call.Action)
}

// Preview says what a call would do, without doing it: for write, whether it
// creates or replaces the note and a line diff; for delete, what would be
// removed.
func (n *Notes) Preview(_ context.Context, call *toolkit.Call) (*toolkit.PreviewResult, error) {
	a, r := n.args(call)
	if r != nil {
		return nil, errors.New(r.Message)
	}
	n.mu.Lock()
	d, exists := n.docs[a.Path]
	count := len(n.docs)
	n.mu.Unlock()
	p := NotePreview{Path: a.Path, Exists: exists}
	if exists {
		p.Revision = d.revision
	}
	var msg string
	switch call.Action {
	case "list":
		p.Path, p.Operation = "", "list"
		msg = fmt.Sprintf("would list notes (no changes); %d notes exist", count)
	case "read":
		p.Operation = "read"
		if exists {
			msg = fmt.Sprintf("would read %s (revision %d); no changes", a.Path, d.revision)
		} else {
			msg = fmt.Sprintf("would fail: no note at path %s", a.Path)
		}
	case "write":
		if exists {
			p.Operation = "replace"
			p.Diff, p.Added, p.Removed = lineDiff(a.Path, a.Path, d.content, *a.Content)
			if p.Diff == "" {
				msg = fmt.Sprintf("would replace %s (revision %d) with the same content: no change", a.Path, d.revision)
			} else {
				msg = fmt.Sprintf("would replace %s (revision %d): +%d -%d lines\n%s", a.Path, d.revision, p.Added, p.Removed, p.Diff)
			}
		} else {
			p.Operation = "create"
			p.Diff, p.Added, p.Removed = lineDiff("", a.Path, "", *a.Content)
			msg = fmt.Sprintf("would create %s with %s\n%s", a.Path, plural(p.Added, "line"), p.Diff)
		}
	case "delete":
		p.Operation = "delete"
		if exists {
			p.Diff, p.Added, p.Removed = lineDiff(a.Path, "", d.content, "")
			msg = fmt.Sprintf("would delete %s (revision %d, %s)\n%s", a.Path, d.revision, plural(p.Removed, "line"), p.Diff)
		} else {
			msg = fmt.Sprintf("would fail: no note at path %s", a.Path)
		}
	default:
		return nil, fmt.Errorf("notes: unknown action %q", call.Action)
	}
	return &toolkit.PreviewResult{Message: strings.TrimRight(msg, "\n"), Value: p}, nil
}

// ResourceExists reports whether a note exists at the call's path.
func (n *Notes) ResourceExists(_ context.Context, call *toolkit.Call) (bool, error) {
	var a noteArgs
	if err := call.Bind(&a); err != nil {
		return false, err
	}
	if !notePath.MatchString(a.Path) {
		return false, fmt.Errorf("notes: invalid path %q", a.Path)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.docs[a.Path]
	return ok, nil
}

// plural says "1 line", "2 lines".
func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
