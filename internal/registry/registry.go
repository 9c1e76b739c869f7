// Package registry owns tool definitions: it validates them, compiles their
// JSON Schemas once per version, stores them (with their audit events in the
// same transaction), serves lookups from an in-memory cache that is kept
// fresh across replicas through store notifications, and syncs tools from a
// declarative tools file and from builtin providers.
//
// The cache is a copy-on-write snapshot: lookups are one atomic load and a
// map read, never a store query (docs/pipeline.md#the-registry-cache).
package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
)

// Options configure a Registry.
type Options struct {
	// Store holds the definitions. Required.
	Store store.Store
	// Providers bind tools to implementations, keyed by their ID (store.Tool.ProviderID).
	Providers []tools.Provider
	// ConnectorHost binds and discovers tools declared as connectors; nil
	// leaves them unbound (their calls answer that the connector is not
	// served here).
	ConnectorHost tools.ConnectorHost
	// Trust is what the server's configuration lets connectors defined
	// through the API do; nil trusts nothing but the tools file
	// (docs/connectors.md#threat-model).
	Trust *connector.Trust
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

// Registry is the tool registry. It is safe for concurrent use.
type Registry struct {
	store     store.Store
	providers map[string]tools.Provider
	host      tools.ConnectorHost
	trust     *connector.Trust
	order     []tools.Provider // as given, for Builtins
	check     checker
	now       func() time.Time
	log       *slog.Logger

	// cache is the current snapshot, replaced whole on every change.
	cache atomic.Pointer[map[string]*Entry]
	// exported indexes the cache by exported name (export.Name): the
	// actions each name stands for, by tool name. Replaced with the cache.
	exported atomic.Pointer[map[string][]ActionRef]
	// toolsets is the cached toolsets, replaced whole on every change.
	toolsets atomic.Pointer[map[string]*store.Toolset]
	// gen counts the replacements of cache and toolsets (Generation).
	gen atomic.Uint64
	// tsMu serializes writers of toolsets; tsApplied is the ticket of the
	// read last installed (guarded by tsMu).
	tsMu      sync.Mutex
	tsApplied uint64
	// mu serializes writers of the cache (readers never take it).
	mu sync.Mutex
	// applied holds, per tool name, the ticket of the last change applied
	// to the cache (also for removed tools). Guarded by mu.
	applied map[string]uint64
	// tickets orders reads of the store against each other: see apply.
	tickets atomic.Uint64
}

// Retries of a create-or-replace that raced with another writer.
const registerAttempts = 5

// New returns a registry. Call Start to fill its cache.
func New(o Options) (*Registry, error) {
	if o.Store == nil {
		return nil, errors.New("registry: a store is required")
	}
	r := &Registry{
		store:     o.Store,
		host:      o.ConnectorHost,
		trust:     o.Trust,
		providers: make(map[string]tools.Provider, len(o.Providers)),
		now:       o.Now,
		log:       o.Logger,
		applied:   make(map[string]uint64),
	}
	for _, p := range o.Providers {
		if p == nil {
			return nil, errors.New("registry: nil provider")
		}
		id := p.ID()
		if _, dup := r.providers[id]; dup {
			return nil, fmt.Errorf("registry: two providers for connector %q", id)
		}
		r.providers[id] = p
		r.order = append(r.order, p)
	}
	r.check = checker{providers: r.providers, host: o.ConnectorHost}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	empty := map[string]*Entry{}
	r.cache.Store(&empty)
	noNames := map[string][]ActionRef{}
	r.exported.Store(&noNames)
	noSets := map[string]*store.Toolset{}
	r.toolsets.Store(&noSets)
	return r, nil
}

// Builtins returns the definitions the providers register on their own, to
// be passed to Sync with store.SourceBuiltin.
func (r *Registry) Builtins() []*store.Tool {
	var defs []*store.Tool
	for _, p := range r.order {
		for _, t := range p.Builtin() {
			c := t.Clone()
			c.Source = store.SourceBuiltin
			defs = append(defs, c)
		}
	}
	return defs
}

// Start loads every stored tool into the cache, then keeps the cache fresh
// from store notifications (TopicTools; an empty Key reloads everything)
// until ctx ends. It returns after the initial load.
func (r *Registry) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	// Subscribe before loading, so that no change between the load and the
	// subscription is missed.
	ch, err := r.store.Subscribe(ctx)
	if err != nil {
		cancel()
		return fmt.Errorf("registry: subscribe to tool changes: %w", err)
	}
	if err := r.reloadAll(ctx); err != nil {
		cancel()
		// Drain so that the store can close the subscription.
		for range ch {
		}
		return fmt.Errorf("registry: load tools: %w", err)
	}
	if err := r.reloadToolsets(ctx); err != nil {
		cancel()
		for range ch {
		}
		return fmt.Errorf("registry: load toolsets: %w", err)
	}
	go func() {
		defer cancel()
		r.follow(ctx, ch)
	}()
	return nil
}

// reloadRetry is how long a failed reload waits before it is tried again.
const reloadRetry = time.Second

// follow applies notifications until ch closes. Reloads that fail (the store
// is down) are retried: the cache must not stay stale once it is back.
func (r *Registry) follow(ctx context.Context, ch <-chan store.Notification) {
	pending := map[string]bool{}
	all, sets := false, false
	var retry <-chan time.Time
	add := func(n store.Notification) {
		if n.Topic == store.TopicToolsets {
			sets = true
			return
		}
		if n.Topic != store.TopicTools {
			return
		}
		if n.Key == "" {
			all = true
		} else {
			pending[n.Key] = true
		}
	}
	for {
		select {
		case n, ok := <-ch:
			if !ok {
				return
			}
			add(n)
			// Coalesce what is already queued.
		drain:
			for {
				select {
				case n, ok := <-ch:
					if !ok {
						return
					}
					add(n)
				default:
					break drain
				}
			}
		case <-retry:
			retry = nil
		}
		if retry != nil {
			continue // wait for the timer before trying again
		}
		failed := false
		if all {
			if err := r.reloadAll(ctx); err != nil {
				failed = true
				r.log.WarnContext(ctx, "registry reload failed", "error", err)
			} else {
				all = false
				clear(pending)
			}
		}
		for name := range pending {
			if err := r.reloadOne(ctx, name); err != nil {
				failed = true
				r.log.WarnContext(ctx, "registry reload failed", "tool", name, "error", err)
				continue
			}
			delete(pending, name)
		}
		if sets {
			if err := r.reloadToolsets(ctx); err != nil {
				failed = true
				r.log.WarnContext(ctx, "toolset reload failed", "error", err)
			} else {
				sets = false
			}
		}
		if failed && ctx.Err() == nil {
			retry = time.After(reloadRetry)
		}
	}
}

// reloadOne re-reads one tool from the store into the cache.
func (r *Registry) reloadOne(ctx context.Context, name string) error {
	ticket := r.tickets.Add(1)
	t, err := r.store.GetTool(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		r.apply(ticket, map[string]*Entry{name: nil})
		return nil
	}
	if err != nil {
		return err
	}
	r.apply(ticket, map[string]*Entry{name: r.entryFor(ctx, t)})
	return nil
}

// writeTicket is the ticket of a change this replica has just committed. It
// is taken after the commit, never before: a reload that read the store
// before the commit holds an earlier ticket and so can never overwrite the
// change with what it read (which would, for a moment, bring back a tool
// just deregistered).
func (r *Registry) writeTicket() uint64 { return r.tickets.Add(1) }

// listPage is the page size of a full reload.
const listPage = 500

// reloadAll re-reads every tool into the cache and drops those that are gone.
func (r *Registry) reloadAll(ctx context.Context) error {
	ticket := r.tickets.Add(1)
	loaded := map[string]*Entry{}
	after := ""
	for {
		page, err := r.store.ListTools(ctx, store.ListToolsParams{After: after, Limit: listPage})
		if err != nil {
			return err
		}
		for _, t := range page {
			loaded[t.Name] = r.entryFor(ctx, t)
		}
		if len(page) < listPage {
			break
		}
		after = page[len(page)-1].Name
	}
	for name := range *r.cache.Load() {
		if _, ok := loaded[name]; !ok {
			loaded[name] = nil
		}
	}
	r.apply(ticket, loaded)
	return nil
}

// apply installs changes (nil removes a tool) in a new snapshot.
//
// Every read carries a ticket taken before the store was read, every write
// one taken after its commit (writeTicket). A read that started later sees
// at least every commit that finished before it started, so a change is
// applied only if no change with a later ticket was applied to that tool
// already: an older read that finishes last never overwrites newer data.
// Within one incarnation of a tool versions only grow, so there the version
// decides instead, which keeps
// concurrent writers on this replica from installing each other's older
// versions. Either way, every commit is followed by a notification whose
// reload takes a ticket after the commit, so the cache converges on what the
// store holds.
func (r *Registry) apply(ticket uint64, changes map[string]*Entry) {
	forget := r.install(ticket, changes)
	if r.host != nil {
		// Not under mu: closing a session may take a moment.
		for _, name := range forget {
			r.host.Forget(name)
		}
	}
}

// install is apply's change of the snapshot; it returns the connector tools
// it removed (or replaced by tools that are not connectors).
func (r *Registry) install(ticket uint64, changes map[string]*Entry) (forget []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := *r.cache.Load()
	next := make(map[string]*Entry, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	changed := false
	for name, e := range changes {
		old, cached := cur[name]
		if cached && e != nil && old.Tool.Incarnation == e.Tool.Incarnation {
			r.applied[name] = max(r.applied[name], ticket)
			if e.Tool.Version <= old.Tool.Version {
				continue
			}
		} else {
			if r.applied[name] > ticket {
				continue
			}
			r.applied[name] = ticket
		}
		changed = true
		if e == nil {
			delete(next, name)
		} else {
			next[name] = e
		}
		if cached && old.Tool.Connector != nil && (e == nil || e.Tool.Connector == nil) {
			forget = append(forget, name)
		}
	}
	if changed {
		r.cache.Store(&next)
		idx := exportedIndex(next)
		r.exported.Store(&idx)
		r.gen.Add(1)
	}
	return forget
}

// entryFor builds the cache entry of a stored tool: its schemas compiled and
// its implementation bound. A stored tool that no longer validates is kept
// (it exists), but its calls fail instead of running unchecked.
func (r *Registry) entryFor(ctx context.Context, t *store.Tool) *Entry {
	e := &Entry{Tool: t, actions: make(map[string]*compiledAction, len(t.Actions))}
	var v fault.Violations
	for i := range t.Actions {
		a := &t.Actions[i]
		if ca := checkAction(&v, fmt.Sprintf("tool.actions[%d]", i), a); ca != nil {
			e.actions[a.Name] = ca
		}
	}
	if len(e.actions) != len(t.Actions) {
		e.compileErr = v.Err("stored definition is invalid")
		r.log.ErrorContext(ctx, "stored tool has schemas that do not compile", "tool", t.Name, "version", t.Version, "error", e.compileErr)
	}
	if t.Connector != nil {
		if err := r.trusted(t); err != nil {
			e.refusal = err
			r.log.WarnContext(ctx, "connector tool is not served: its definition breaks the trust rules", "tool", t.Name, "error", err)
			return e
		}
		if r.host != nil {
			impl, err := r.host.Bind(t)
			if err != nil {
				r.log.WarnContext(ctx, "connector tool cannot be served", "tool", t.Name, "error", err)
			} else {
				e.Impl = impl
			}
		}
		return e
	}
	if p, ok := r.providers[t.ProviderID]; ok {
		impl, err := p.Bind(t)
		if err != nil {
			r.log.WarnContext(ctx, "tool cannot be bound to its connector", "tool", t.Name, "connector", t.ProviderID, "error", err)
		} else {
			e.Impl = impl
		}
	}
	return e
}

// entryFrom builds the cache entry of a tool just written from its prepared
// definition, without compiling or binding it again.
func entryFrom(t *store.Tool, p *prepared) *Entry {
	return &Entry{Tool: t, Impl: p.impl, actions: p.actions}
}

// Lookup returns the cached entry of a tool; it never touches the store.
func (r *Registry) Lookup(name string) (*Entry, bool) {
	e, ok := (*r.cache.Load())[name]
	return e, ok
}

// Get returns a copy of a tool from the cache, or *fault.Error NOT_FOUND
// TOOL_NOT_FOUND.
func (r *Registry) Get(_ context.Context, name string) (*store.Tool, error) {
	e, ok := r.Lookup(name)
	if !ok {
		return nil, fault.ToolNotFound(name)
	}
	return e.Tool.Clone(), nil
}

// List returns tools ordered by name after `after`, at most limit (0: all).
// It reads the store; paging is the caller's.
func (r *Registry) List(ctx context.Context, after string, limit int) ([]*store.Tool, error) {
	ts, err := r.store.ListTools(ctx, store.ListToolsParams{After: after, Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("registry: list tools: %w", err)
	}
	return ts, nil
}

// Validate checks a definition and returns every problem at once, with field
// paths like "tool.actions[1].input_schema".
func (r *Registry) Validate(t *store.Tool) fault.Violations {
	_, v := r.check.prepare(t)
	return v
}

// RegisterParams are Register's inputs.
type RegisterParams struct {
	Tool *store.Tool
	// ExpectedVersion, if non-zero, must be the stored tool's version; 0
	// means create or replace.
	ExpectedVersion int64
	// ValidateOnly validates (and checks the version) but writes nothing.
	ValidateOnly bool
	// Source is where the definition comes from; empty means API. A tool
	// registered from another source than the one it has changes source.
	Source store.ToolSource
	// Actor is the principal id recorded in audit events.
	Actor string
	// Reason, if set, is recorded in the audit event's detail (e.g.
	// "discovery" for a change an MCP server's tool list made).
	Reason string
}

// Register validates and creates or replaces a tool. Errors are
// *fault.Error: INVALID_ARGUMENT (INVALID_REQUEST) with one violation per bad
// field; FAILED_PRECONDITION VERSION_CONFLICT when ExpectedVersion does not
// match; ABORTED VERSION_CONFLICT when concurrent writers kept changing the
// tool. Store errors (store.ErrUnavailable) pass through wrapped. It returns
// the stored tool and whether it was created. Registering a definition
// identical to the stored one changes nothing (no version bump, no event).
// With ValidateOnly the returned tool is what would be stored.
func (r *Registry) Register(ctx context.Context, p RegisterParams) (*store.Tool, bool, error) {
	if p.Source == "" {
		p.Source = store.SourceAPI
	}
	if p.ExpectedVersion < 0 {
		var vs fault.Violations
		vs.Add("expected_version", "must not be negative")
		return nil, false, vs.Err("invalid request")
	}
	in := p.Tool.Clone()
	if in != nil {
		in.Source = p.Source
	}
	prep, v := r.check.prepare(in)
	if len(v) > 0 {
		return nil, false, v.Err("invalid tool definition")
	}
	// Nothing of a connector runs before the trust rules let it: its
	// command is not started, its secrets are not fetched.
	if err := r.admit(ctx, prep.tool, p); err != nil {
		return nil, false, err
	}
	done := func(bool) {}
	if isMCPConnector(in) && r.host != nil {
		// What the server offers is asked only of a valid definition (its
		// command is not run before it passed validation).
		def := in.Clone()
		var cur *store.Tool
		if e, ok := r.Lookup(def.Name); ok {
			cur = e.Tool
		}
		var err error
		if done, err = r.probeInto(ctx, def, cur); err != nil {
			done(false)
			r.refused(ctx, def, p, err)
			return nil, false, err
		}
		if prep, v = r.check.prepare(def); len(v) > 0 {
			done(false)
			return nil, false, v.Err("invalid tool definition with what the server offers")
		}
	}
	var nv fault.Violations
	r.checkExportedNames(&nv, prep.tool)
	if len(nv) > 0 {
		done(false)
		return nil, false, nv.Err("invalid tool definition")
	}
	prep.tool.Source = p.Source
	t, w, err := r.register(ctx, prep, p)
	// What the probe opened serves the connector only if it was stored.
	done(err == nil && !p.ValidateOnly)
	if err != nil {
		return nil, false, err
	}
	return t.Clone(), w == wroteCreated, nil
}

// written says what register wrote (or, validating only, would write).
type written int

const (
	wroteNothing written = iota // the stored definition is the same
	wroteCreated
	wroteUpdated
)

// register writes a prepared definition with optimistic concurrency.
func (r *Registry) register(ctx context.Context, prep *prepared, p RegisterParams) (*store.Tool, written, error) {
	name := prep.tool.Name
	for attempt := 0; attempt < registerAttempts; attempt++ {
		cur, err := r.store.GetTool(ctx, name)
		switch {
		case errors.Is(err, store.ErrNotFound):
			if p.ExpectedVersion != 0 {
				return nil, wroteNothing, fault.VersionConflict(name, p.ExpectedVersion, 0)
			}
			if p.ValidateOnly {
				return wouldStore(prep.tool, 1, time.Time{}, r.now()), wroteCreated, nil
			}
			now := r.now()
			// A new tool, even under a name used before: a new incarnation,
			// which no earlier approval or preview was given for.
			def := prep.tool.Clone()
			def.Incarnation = newIncarnation()
			t, err := r.store.CreateTool(ctx, store.CreateToolParams{
				Tool: def,
				Now:  now,
				Events: []store.AuditEvent{toolEvent(audit.ToolRegistered, now, p.Actor, name, 1, p.Source, p.Reason,
					map[string]any{"definition": definitionDetail(def)})},
			})
			if errors.Is(err, store.ErrConflict) {
				continue // created concurrently: replace it
			}
			if err != nil {
				return nil, wroteNothing, fmt.Errorf("registry: create tool %q: %w", name, err)
			}
			r.apply(r.writeTicket(), map[string]*Entry{name: entryFrom(t, prep)})
			r.log.InfoContext(ctx, "tool registered", "tool", name, "version", t.Version, "source", t.Source, "actor", p.Actor)
			return t, wroteCreated, nil
		case err != nil:
			return nil, wroteNothing, fmt.Errorf("registry: read tool %q: %w", name, err)
		}
		if p.ExpectedVersion != 0 && cur.Version != p.ExpectedVersion {
			return nil, wroteNothing, fault.VersionConflict(name, p.ExpectedVersion, cur.Version)
		}
		if sameDefinition(prep.tool, cur) {
			return cur, wroteNothing, nil
		}
		if p.ValidateOnly {
			return wouldStore(prep.tool, cur.Version+1, cur.CreatedAt, r.now()), wroteUpdated, nil
		}
		now := r.now()
		t, err := r.store.UpdateTool(ctx, store.UpdateToolParams{
			Tool:            prep.tool.Clone(),
			ExpectedVersion: cur.Version,
			Now:             now,
			Events: []store.AuditEvent{toolEvent(audit.ToolUpdated, now, p.Actor, name, cur.Version+1, p.Source, p.Reason,
				map[string]any{"changes": changeDetail(cur, prep.tool)})},
		})
		switch {
		case errors.Is(err, store.ErrConflict) && p.ExpectedVersion != 0:
			return nil, wroteNothing, fault.VersionConflict(name, p.ExpectedVersion, -1)
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			continue // changed or removed concurrently: read again
		case err != nil:
			return nil, wroteNothing, fmt.Errorf("registry: update tool %q: %w", name, err)
		}
		r.apply(r.writeTicket(), map[string]*Entry{name: entryFrom(t, prep)})
		r.log.InfoContext(ctx, "tool updated", "tool", name, "version", t.Version, "source", t.Source, "actor", p.Actor)
		return t, wroteUpdated, nil
	}
	return nil, wroteNothing, fault.ConcurrentWriters(name)
}

// wouldStore is what a validate-only registration returns.
func wouldStore(t *store.Tool, version int64, created, now time.Time) *store.Tool {
	c := t.Clone()
	c.Version = version
	c.CreatedAt = created
	if created.IsZero() {
		c.CreatedAt = now
	}
	c.UpdatedAt = now
	return c
}

// Deregister removes a tool, writing tool.deregistered in the same
// transaction. expectedVersion 0 means any version. Errors: NOT_FOUND
// TOOL_NOT_FOUND; FAILED_PRECONDITION VERSION_CONFLICT; store errors wrapped.
// It returns the tool as it was.
func (r *Registry) Deregister(ctx context.Context, name string, expectedVersion int64, actor string) (*store.Tool, error) {
	for attempt := 0; attempt < registerAttempts; attempt++ {
		// Read first: the event records the version that was removed.
		cur, err := r.store.GetTool(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return nil, fault.ToolNotFound(name)
		}
		if err != nil {
			return nil, fmt.Errorf("registry: read tool %q: %w", name, err)
		}
		if expectedVersion != 0 && cur.Version != expectedVersion {
			return nil, fault.VersionConflict(name, expectedVersion, cur.Version)
		}
		now := r.now()
		t, err := r.store.DeleteTool(ctx, store.DeleteToolParams{
			Name:            name,
			ExpectedVersion: cur.Version,
			Now:             now,
			Events:          []store.AuditEvent{toolEvent(audit.ToolDeregistered, now, actor, name, cur.Version, cur.Source, "", nil)},
			// What waits for the tool dies with it: a tool registered again
			// under the name is another tool, and an approver must not be
			// shown an approval that can never run.
			ApprovalEventsFor: func(a *store.Approval) []store.AuditEvent {
				return []store.AuditEvent{approvalInvalidatedEvent(a, now, actor)}
			},
			PreviewEventsFor: func(pv *store.Preview) []store.AuditEvent {
				return []store.AuditEvent{previewExpiredEvent(pv, now, actor)}
			},
		})
		switch {
		case errors.Is(err, store.ErrNotFound):
			// Removed concurrently: apply it here too, then answer as if it
			// had not been there.
			r.apply(r.writeTicket(), map[string]*Entry{name: nil})
			return nil, fault.ToolNotFound(name)
		case errors.Is(err, store.ErrConflict) && expectedVersion != 0:
			return nil, fault.VersionConflict(name, expectedVersion, -1)
		case errors.Is(err, store.ErrConflict):
			continue
		case err != nil:
			return nil, fmt.Errorf("registry: delete tool %q: %w", name, err)
		}
		r.apply(r.writeTicket(), map[string]*Entry{name: nil})
		r.log.InfoContext(ctx, "tool deregistered", "tool", name, "version", t.Version, "actor", actor)
		return t, nil
	}
	return nil, fault.ConcurrentWriters(name)
}

// SyncReport says what Sync did, by tool name (each list sorted).
type SyncReport struct {
	Created, Updated, Deleted, Unchanged []string
}

// Sync makes the stored tools of source match defs: it creates new ones,
// updates changed ones and deregisters those of that source that are not in
// defs; tools of other sources are untouched. A def that does not validate,
// or whose name belongs to a tool of another source, is reported in the
// returned error and skipped (a stored tool of the same name and source is
// kept). The report is valid even when an error is returned; a store error
// stops the sync.
func (r *Registry) Sync(ctx context.Context, source store.ToolSource, defs []*store.Tool, actor string) (SyncReport, error) {
	var rep SyncReport
	var problems []error

	existing := map[string]*store.Tool{}
	after := ""
	for {
		page, err := r.store.ListTools(ctx, store.ListToolsParams{After: after, Limit: listPage})
		if err != nil {
			return rep, fmt.Errorf("registry: sync %s tools: %w", source, err)
		}
		for _, t := range page {
			existing[t.Name] = t
		}
		if len(page) < listPage {
			break
		}
		after = page[len(page)-1].Name
	}

	keep := map[string]bool{}
	for i, def := range defs {
		if def == nil {
			problems = append(problems, fmt.Errorf("tool %d: no definition", i))
			continue
		}
		name := def.Name
		if keep[name] {
			problems = append(problems, fmt.Errorf("tool %q: defined more than once", name))
			continue
		}
		keep[name] = true
		if cur, ok := existing[name]; ok && cur.Source != source {
			problems = append(problems, fmt.Errorf("tool %q: already registered from source %s; skipped", name, cur.Source))
			continue
		}
		def = def.Clone()
		def.Source = source
		prep, v := r.check.prepare(def)
		if len(v) == 0 {
			if err := r.admit(ctx, prep.tool, RegisterParams{Source: source, Actor: actor}); err != nil {
				problems = append(problems, fmt.Errorf("tool %q: %w", name, err))
				continue
			}
		}
		if len(v) == 0 && isMCPConnector(def) && r.host != nil {
			// A server that does not answer does not stop the sync: the
			// tool keeps what was discovered before, or waits for it.
			d := def.Clone()
			r.discoverInto(ctx, d, existing[name])
			prep, v = r.check.prepare(d)
		}
		if len(v) == 0 {
			r.checkExportedNames(&v, prep.tool)
		}
		if len(v) > 0 {
			problems = append(problems, fmt.Errorf("tool %q: invalid tool definition: %w", name, spellOut(v.Err("invalid tool definition"))))
			continue
		}
		prep.tool.Source = source
		var expected int64
		if cur, ok := existing[name]; ok {
			expected = cur.Version
		}
		_, w, err := r.register(ctx, prep, RegisterParams{Source: source, Actor: actor, ExpectedVersion: expected})
		if err != nil {
			if errors.Is(err, store.ErrUnavailable) {
				return sortReport(rep), fmt.Errorf("registry: sync %s tools: %w", source, err)
			}
			problems = append(problems, fmt.Errorf("tool %q: %w", name, err))
			continue
		}
		// What this replica wrote: a tool another replica stored meanwhile
		// (two starting together) with the same definition is unchanged.
		switch w {
		case wroteCreated:
			rep.Created = append(rep.Created, name)
		case wroteUpdated:
			rep.Updated = append(rep.Updated, name)
		default:
			rep.Unchanged = append(rep.Unchanged, name)
		}
	}

	for name, cur := range existing {
		if cur.Source != source || keep[name] {
			continue
		}
		_, err := r.Deregister(ctx, name, cur.Version, actor)
		if err != nil {
			if errors.Is(err, store.ErrUnavailable) {
				return sortReport(rep), fmt.Errorf("registry: sync %s tools: %w", source, err)
			}
			if f, ok := fault.As(err); ok && f.Kind == fault.NotFound {
				continue // someone else removed it: what Sync wanted
			}
			problems = append(problems, fmt.Errorf("tool %q: deregister: %w", name, err))
			continue
		}
		rep.Deleted = append(rep.Deleted, name)
	}
	rep = sortReport(rep)
	if len(problems) > 0 {
		return rep, fmt.Errorf("registry: sync %s tools: %w", source, errors.Join(problems...))
	}
	return rep, nil
}

func sortReport(rep SyncReport) SyncReport {
	for _, l := range [][]string{rep.Created, rep.Updated, rep.Deleted, rep.Unchanged} {
		sort.Strings(l)
	}
	return rep
}

// newIncarnation returns a tool incarnation: random, never reused.
func newIncarnation() string { return uuid.NewString() }

// approvalInvalidatedEvent is the approval.invalidated event of an approval
// whose tool was deregistered (by actor). The store hands it over as stored:
// INVALIDATED, with ResolvedAt if an approver had approved it.
func approvalInvalidatedEvent(a *store.Approval, now time.Time, actor string) store.AuditEvent {
	was := store.ApprovalPending
	if !a.ResolvedAt.IsZero() {
		was = store.ApprovalApproved
	}
	return audit.NewDetail(audit.ApprovalInvalidated, store.AuditEvent{
		Time: now, CallID: a.CallID, TraceID: a.TraceID, TaskID: a.TaskID, StepID: a.StepID,
		Principal: a.Requester, Tool: a.Tool, Action: a.Action, Risk: a.Risk, Decision: store.DecisionConfirm,
	}, audit.WithParent(map[string]any{
		"approval_id": a.ID, "reason": "tool_deregistered", "was": string(was),
		"approved_version": a.ToolVersion, "deregistered_by": actor,
	}, a.ParentCallID))
}

// previewExpiredEvent is the preview.expired event of a preview whose tool
// was deregistered (by actor). The token stays out of the trail.
func previewExpiredEvent(p *store.Preview, now time.Time, actor string) store.AuditEvent {
	return audit.NewDetail(audit.PreviewExpired, store.AuditEvent{
		Time: now, CallID: p.CallID, Principal: p.PrincipalID, Tool: p.Tool, Action: p.Action,
		Decision: store.DecisionPreview,
	}, audit.WithParent(map[string]any{"reason": "tool_deregistered", "preview_version": p.ToolVersion, "deregistered_by": actor},
		p.ParentCallID))
}

// toolEvent builds a tool.* audit event.
func toolEvent(typ string, now time.Time, actor, name string, version int64, source store.ToolSource, reason string, extra map[string]any) store.AuditEvent {
	detail := map[string]any{"version": version, "source": string(source)}
	for k, v := range extra {
		detail[k] = v
	}
	if reason != "" {
		detail["reason"] = reason
	}
	return audit.NewDetail(typ, store.AuditEvent{
		Time:      now,
		Principal: actor,
		Tool:      name,
	}, detail)
}
