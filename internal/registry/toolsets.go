package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// MaxToolsetTools bounds the entries of one toolset.
const MaxToolsetTools = 500

// ActionRef names one action of one tool.
type ActionRef struct {
	Tool, Action string
}

func (a ActionRef) String() string { return a.Tool + "." + a.Action }

// exportedIndex maps every exported name of the cached tools to the actions
// it stands for, in tool order.
func exportedIndex(entries map[string]*Entry) map[string][]ActionRef {
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	idx := make(map[string][]ActionRef, len(entries))
	for _, name := range names {
		for _, a := range entries[name].Tool.Actions {
			n := export.Name(name, a.Name)
			idx[n] = append(idx[n], ActionRef{Tool: name, Action: a.Name})
		}
	}
	return idx
}

// ResolveExported returns the action an exported name stands for, from the
// cache. found is false when no action is exported under the name; the
// error is *fault.Error EXPORTED_NAME_SHARED when several are (two replicas
// registered them at once; see docs/exports.md#names).
func (r *Registry) ResolveExported(name string) (ref ActionRef, found bool, err error) {
	refs := (*r.exported.Load())[name]
	switch len(refs) {
	case 0:
		return ActionRef{}, false, nil
	case 1:
		return refs[0], true, nil
	}
	owners := make([]string, len(refs))
	for i, a := range refs {
		owners[i] = a.String()
	}
	return ActionRef{}, true, fault.ExportedNameShared(name, owners)
}

// checkExportedNames refuses a definition an action of which would be
// exported under a name another tool's action already has: ExecuteTool
// could not tell them apart. Both are named.
func (r *Registry) checkExportedNames(v *fault.Violations, t *store.Tool) {
	idx := *r.exported.Load()
	mine := map[string]string{}
	for i, a := range t.Actions {
		n := export.Name(t.Name, a.Name)
		field := fmt.Sprintf("tool.actions[%d].name", i)
		if other, dup := mine[n]; dup {
			v.Add(field, "action %s.%s would be exported as %s, like %s.%s; rename one (docs/exports.md#names)",
				t.Name, a.Name, safetext.Quote(n), t.Name, other)
			continue
		}
		mine[n] = a.Name
		for _, ref := range idx[n] {
			if ref.Tool == t.Name {
				continue // this tool's own, about to be replaced
			}
			v.Add(field, "action %s.%s would be exported as %s, which is already the exported name of %s; rename one (docs/exports.md#names)",
				t.Name, a.Name, safetext.Quote(n), ref)
		}
	}
}

// Generation changes whenever the cached tools or toolsets do: what is
// built from a Snapshot taken after reading it may be kept until it
// changes (read it first: a Snapshot taken before would be kept past a
// change).
func (r *Registry) Generation() uint64 { return r.gen.Load() }

// Snapshot returns the cached tools and toolsets, each ordered by name, as
// exports read them. The records are shared: callers must not modify them.
func (r *Registry) Snapshot() export.Snapshot {
	entries := *r.cache.Load()
	tools := make([]*store.Tool, 0, len(entries))
	for _, e := range entries {
		tools = append(tools, e.Tool)
	}
	slices.SortFunc(tools, func(a, b *store.Tool) int { return strings.Compare(a.Name, b.Name) })
	return export.Snapshot{Tools: tools, Toolsets: r.toolsetList()}
}

func (r *Registry) toolsetList() []*store.Toolset {
	sets := *r.toolsets.Load()
	out := make([]*store.Toolset, 0, len(sets))
	for _, ts := range sets {
		out = append(out, ts)
	}
	slices.SortFunc(out, func(a, b *store.Toolset) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Toolsets returns copies of the cached toolsets, ordered by name.
func (r *Registry) Toolsets() []*store.Toolset {
	list := r.toolsetList()
	for i, ts := range list {
		list[i] = ts.Clone()
	}
	return list
}

// GetToolset returns a copy of a cached toolset, or *fault.Error NOT_FOUND
// TOOLSET_NOT_FOUND.
func (r *Registry) GetToolset(name string) (*store.Toolset, error) {
	ts, ok := (*r.toolsets.Load())[name]
	if !ok {
		return nil, fault.ToolsetNotFound(name)
	}
	return ts.Clone(), nil
}

// reloadToolsets reads every toolset into the cache.
func (r *Registry) reloadToolsets(ctx context.Context) error {
	ticket := r.tickets.Add(1)
	all := map[string]*store.Toolset{}
	after := ""
	for {
		page, err := r.store.ListToolsets(ctx, store.ListToolsetsParams{After: after, Limit: listPage})
		if err != nil {
			return err
		}
		for _, ts := range page {
			all[ts.Name] = ts
		}
		if len(page) < listPage {
			break
		}
		after = page[len(page)-1].Name
	}
	r.tsMu.Lock()
	defer r.tsMu.Unlock()
	if ticket < r.tsApplied {
		return nil // a later read or write is installed already
	}
	r.tsApplied = ticket
	r.toolsets.Store(&all)
	r.gen.Add(1)
	return nil
}

// applyToolset installs a toolset this replica has just written (nil: it
// removed it), unless a read that started after the commit is installed
// already.
func (r *Registry) applyToolset(name string, ts *store.Toolset) {
	ticket := r.writeTicket()
	r.tsMu.Lock()
	defer r.tsMu.Unlock()
	if ticket < r.tsApplied {
		return
	}
	r.tsApplied = ticket
	cur := *r.toolsets.Load()
	next := make(map[string]*store.Toolset, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	if ts == nil {
		delete(next, name)
	} else {
		next[name] = ts
	}
	r.toolsets.Store(&next)
	r.gen.Add(1)
}

// normalizeToolset returns ts as it is stored: text trimmed, output-only
// fields cleared.
func normalizeToolset(ts *store.Toolset) *store.Toolset {
	n := ts.Clone()
	n.Version, n.CreatedAt, n.UpdatedAt = 0, time.Time{}, time.Time{}
	n.Title = strings.TrimSpace(n.Title)
	n.Guidance = strings.TrimSpace(n.Guidance)
	for i := range n.Tools {
		n.Tools[i] = strings.TrimSpace(n.Tools[i])
	}
	if len(n.Tools) == 0 {
		n.Tools = nil
	}
	return n
}

// checkToolset validates a normalized toolset; exists, when set, says
// whether a tool (and an action of it, when action is not empty) is
// registered.
func checkToolset(v *fault.Violations, ts *store.Toolset, exists func(tool, action string) (bool, bool)) {
	checkName(v, "toolset.name", ts.Name)
	switch {
	case ts.Title == "":
		v.Add("toolset.title", "is required (1-%d printable ASCII characters)", maxDescription)
	default:
		checkDescription(v, "toolset.title", ts.Title)
		if strings.ContainsAny(ts.Title, "\n\t") {
			v.Add("toolset.title", "must be one line")
		}
	}
	checkGuidance(v, "toolset.guidance", ts.Guidance)
	if len(ts.Tools) == 0 {
		v.Add("toolset.tools", "at least one tool is required")
	}
	if len(ts.Tools) > MaxToolsetTools {
		v.Add("toolset.tools", "must name at most %d tools, names %d", MaxToolsetTools, len(ts.Tools))
		return
	}
	seen := map[string]int{}
	for i, ref := range ts.Tools {
		field := fmt.Sprintf("toolset.tools[%d]", i)
		if !v.CheckText(field, ref) {
			continue
		}
		tool, action, qualified := strings.Cut(ref, ".")
		if !names.Valid(tool) || (qualified && !names.Valid(action)) {
			v.Add(field, "must be a tool's name or tool.action, not %s", safetext.Quote(ref))
			continue
		}
		if j, dup := seen[ref]; dup {
			v.Add(field, "%s is listed twice (also tools[%d])", safetext.Quote(ref), j)
			continue
		}
		seen[ref] = i
		if exists == nil {
			continue
		}
		toolOK, actionOK := exists(tool, action)
		switch {
		case !toolOK:
			v.Add(field, "toolset %s names tool %s, which is not registered", safetext.Quote(ts.Name), safetext.Quote(tool))
		case qualified && !actionOK:
			v.Add(field, "toolset %s names %s, but tool %s has no action %s", safetext.Quote(ts.Name), safetext.Quote(ref),
				safetext.Quote(tool), safetext.Quote(action))
		}
	}
}

// cachedExists answers checkToolset from the cache.
func (r *Registry) cachedExists(tool, action string) (bool, bool) {
	e, ok := r.Lookup(tool)
	if !ok {
		return false, false
	}
	return true, action == "" || e.Tool.Action(action) != nil
}

// ValidateToolset checks a toolset against the registered tools and returns
// every problem at once.
func (r *Registry) ValidateToolset(ts *store.Toolset) fault.Violations {
	var v fault.Violations
	if ts == nil {
		v.Add("toolset", "is required")
		return v
	}
	checkToolset(&v, normalizeToolset(ts), r.cachedExists)
	return v
}

// RegisterToolsetParams are RegisterToolset's inputs.
type RegisterToolsetParams struct {
	Toolset *store.Toolset
	// ExpectedVersion, if non-zero, must be the stored version.
	ExpectedVersion int64
	// ValidateOnly validates but writes nothing.
	ValidateOnly bool
	// Source is where the definition comes from; empty means API.
	Source store.ToolSource
	// Actor is the principal id recorded in the audit event.
	Actor string
}

// RegisterToolset validates and creates or replaces a toolset. Errors are
// *fault.Error: INVALID_ARGUMENT with one violation per problem (a tool it
// names that is not registered among them); FAILED_PRECONDITION
// VERSION_CONFLICT; ABORTED VERSION_CONFLICT when writers kept racing.
// Registering an unchanged definition changes nothing.
func (r *Registry) RegisterToolset(ctx context.Context, p RegisterToolsetParams) (*store.Toolset, bool, error) {
	if v := r.ValidateToolset(p.Toolset); len(v) > 0 {
		return nil, false, v.Err("invalid toolset definition")
	}
	if p.ExpectedVersion < 0 {
		var v fault.Violations
		v.Add("expected_version", "must not be negative")
		return nil, false, v.Err("invalid request")
	}
	if p.Source == "" {
		p.Source = store.SourceAPI
	}
	def := normalizeToolset(p.Toolset)
	def.Source = p.Source
	name := def.Name
	for attempt := 0; attempt < registerAttempts; attempt++ {
		cur, err := r.store.GetToolset(ctx, name)
		switch {
		case errors.Is(err, store.ErrNotFound):
			if p.ExpectedVersion != 0 {
				return nil, false, fault.ToolsetVersionConflict(name, p.ExpectedVersion, 0)
			}
			if p.ValidateOnly {
				c := def.Clone()
				c.Version, c.CreatedAt, c.UpdatedAt = 1, r.now(), r.now()
				return c, true, nil
			}
			now := r.now()
			ts, err := r.store.CreateToolset(ctx, store.CreateToolsetParams{
				Toolset: def, Now: now,
				Events: []store.AuditEvent{toolsetEvent(audit.ToolsetRegistered, now, p.Actor, name, 1, p.Source)},
			})
			if errors.Is(err, store.ErrConflict) {
				continue
			}
			if err != nil {
				return nil, false, fmt.Errorf("registry: create toolset %q: %w", name, err)
			}
			r.applyToolset(name, ts)
			r.log.InfoContext(ctx, "toolset registered", "toolset", name, "version", ts.Version, "actor", p.Actor)
			return ts.Clone(), true, nil
		case err != nil:
			return nil, false, fmt.Errorf("registry: read toolset %q: %w", name, err)
		}
		if p.ExpectedVersion != 0 && cur.Version != p.ExpectedVersion {
			return nil, false, fault.ToolsetVersionConflict(name, p.ExpectedVersion, cur.Version)
		}
		if sameToolset(def, cur) {
			return cur, false, nil
		}
		if p.ValidateOnly {
			c := def.Clone()
			c.Version, c.CreatedAt, c.UpdatedAt = cur.Version+1, cur.CreatedAt, r.now()
			return c, false, nil
		}
		now := r.now()
		ts, err := r.store.UpdateToolset(ctx, store.UpdateToolsetParams{
			Toolset: def, ExpectedVersion: cur.Version, Now: now,
			Events: []store.AuditEvent{toolsetEvent(audit.ToolsetUpdated, now, p.Actor, name, cur.Version+1, p.Source)},
		})
		switch {
		case errors.Is(err, store.ErrConflict) && p.ExpectedVersion != 0:
			return nil, false, fault.ToolsetVersionConflict(name, p.ExpectedVersion, -1)
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			return nil, false, fmt.Errorf("registry: update toolset %q: %w", name, err)
		}
		r.applyToolset(name, ts)
		r.log.InfoContext(ctx, "toolset updated", "toolset", name, "version", ts.Version, "actor", p.Actor)
		return ts.Clone(), false, nil
	}
	return nil, false, fault.ConcurrentWriters(name)
}

// sameToolset reports whether registering a over b would change nothing.
func sameToolset(a, b *store.Toolset) bool {
	return a.Title == b.Title && a.Guidance == b.Guidance && a.Disabled == b.Disabled &&
		a.Source == b.Source && slices.Equal(a.Tools, b.Tools)
}

// DeregisterToolset removes a toolset. Errors: NOT_FOUND TOOLSET_NOT_FOUND;
// FAILED_PRECONDITION VERSION_CONFLICT. It returns the toolset as it was.
func (r *Registry) DeregisterToolset(ctx context.Context, name string, expectedVersion int64, actor string) (*store.Toolset, error) {
	for attempt := 0; attempt < registerAttempts; attempt++ {
		cur, err := r.store.GetToolset(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return nil, fault.ToolsetNotFound(name)
		}
		if err != nil {
			return nil, fmt.Errorf("registry: read toolset %q: %w", name, err)
		}
		if expectedVersion != 0 && cur.Version != expectedVersion {
			return nil, fault.ToolsetVersionConflict(name, expectedVersion, cur.Version)
		}
		now := r.now()
		ts, err := r.store.DeleteToolset(ctx, store.DeleteToolsetParams{
			Name: name, ExpectedVersion: cur.Version, Now: now,
			Events: []store.AuditEvent{toolsetEvent(audit.ToolsetDeregistered, now, actor, name, cur.Version, cur.Source)},
		})
		switch {
		case errors.Is(err, store.ErrNotFound):
			r.applyToolset(name, nil)
			return nil, fault.ToolsetNotFound(name)
		case errors.Is(err, store.ErrConflict) && expectedVersion != 0:
			return nil, fault.ToolsetVersionConflict(name, expectedVersion, -1)
		case errors.Is(err, store.ErrConflict):
			continue
		case err != nil:
			return nil, fmt.Errorf("registry: delete toolset %q: %w", name, err)
		}
		r.applyToolset(name, nil)
		r.log.InfoContext(ctx, "toolset deregistered", "toolset", name, "actor", actor)
		return ts, nil
	}
	return nil, fault.ConcurrentWriters(name)
}

// SyncToolsets makes the stored toolsets of source match defs, as Sync does
// for tools: new ones are created, changed ones updated, those of source
// not in defs removed; toolsets of other sources are untouched. A def that
// does not validate (a tool it names is not registered) or whose name
// belongs to another source is reported in the error and skipped.
func (r *Registry) SyncToolsets(ctx context.Context, source store.ToolSource, defs []*store.Toolset, actor string) (SyncReport, error) {
	var rep SyncReport
	var problems []error
	existing := map[string]*store.Toolset{}
	list, err := r.store.ListToolsets(ctx, store.ListToolsetsParams{})
	if err != nil {
		return rep, fmt.Errorf("registry: sync %s toolsets: %w", source, err)
	}
	for _, ts := range list {
		existing[ts.Name] = ts
	}
	keep := map[string]bool{}
	for _, def := range defs {
		name := def.Name
		if keep[name] {
			problems = append(problems, fmt.Errorf("toolset %q: defined more than once", name))
			continue
		}
		keep[name] = true
		if cur, ok := existing[name]; ok && cur.Source != source {
			problems = append(problems, fmt.Errorf("toolset %q: already registered from source %s; skipped", name, cur.Source))
			continue
		}
		var expected int64
		if cur, ok := existing[name]; ok {
			expected = cur.Version
		}
		ts, created, err := r.RegisterToolset(ctx, RegisterToolsetParams{Toolset: def, ExpectedVersion: expected, Source: source, Actor: actor})
		if err != nil {
			if errors.Is(err, store.ErrUnavailable) {
				return sortReport(rep), fmt.Errorf("registry: sync %s toolsets: %w", source, err)
			}
			problems = append(problems, fmt.Errorf("toolset %q: %w", name, spellOut(err)))
			continue
		}
		switch {
		case created:
			rep.Created = append(rep.Created, name)
		case existing[name] != nil && ts.Version == existing[name].Version:
			rep.Unchanged = append(rep.Unchanged, name)
		default:
			rep.Updated = append(rep.Updated, name)
		}
	}
	for name, cur := range existing {
		if cur.Source != source || keep[name] {
			continue
		}
		if _, err := r.DeregisterToolset(ctx, name, cur.Version, actor); err != nil {
			if errors.Is(err, store.ErrUnavailable) {
				return sortReport(rep), fmt.Errorf("registry: sync %s toolsets: %w", source, err)
			}
			if f, ok := fault.As(err); ok && f.Kind == fault.NotFound {
				continue
			}
			problems = append(problems, fmt.Errorf("toolset %q: deregister: %w", name, err))
			continue
		}
		rep.Deleted = append(rep.Deleted, name)
	}
	rep = sortReport(rep)
	if len(problems) > 0 {
		return rep, fmt.Errorf("registry: sync %s toolsets: %w", source, errors.Join(problems...))
	}
	return rep, nil
}

// spellOut spells out a refusal's field violations, which a log line or a
// start-up error would otherwise not show.
func spellOut(err error) error {
	f, ok := fault.As(err)
	if !ok || len(f.Violations) == 0 {
		return err
	}
	lines := make([]string, len(f.Violations))
	for i, v := range f.Violations {
		lines[i] = v.Field + ": " + v.Description
	}
	return errors.New(strings.Join(lines, "; "))
}

// toolsetEvent builds a toolset.* audit event.
func toolsetEvent(typ string, now time.Time, actor, name string, version int64, source store.ToolSource) store.AuditEvent {
	return audit.NewDetail(typ, store.AuditEvent{Time: now, Principal: actor},
		map[string]any{"toolset": name, "version": version, "source": string(source)})
}
