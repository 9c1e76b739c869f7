package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

const (
	// probeRetry caps the RetryAfter told to callers who lost the probe:
	// the probe usually answers within a call's time, and its success
	// readmits everyone.
	probeRetry = time.Second
	// refreshRetry is how long the tracker waits before reading the store
	// again after a failed refresh.
	refreshRetry = time.Second
)

// Tracker keeps every tool's health record in memory, fresh from store
// notifications, and applies observations, probe claims and operator
// overrides through the store's atomic health update. Its methods are safe
// for concurrent use.
type Tracker struct {
	st  store.Store
	cfg Config
	now func() time.Time
	log *slog.Logger

	wake chan struct{} // capacity 1: "something is dirty"
	done chan struct{} // closed when the refresh loop ends

	mu      sync.Mutex
	started bool
	cache   map[string]store.ToolHealth
	// gen counts local writes to the cache; localGen holds, per tool, the
	// gen of the last one. A refresh whose read began before a local write
	// to the same tool must not overwrite it (the read may be older): it is
	// dropped, and the local write's own dirty mark reads the tool again.
	gen      uint64
	localGen map[string]uint64
	dirty    map[string]struct{}
	dirtyAll bool
	watchers map[*watcher]struct{}
	// callers holds each principal's own run of errors per tool, as this
	// replica saw them (see CheckCaller).
	callers map[callerKey]*callerRun
}

// callerKey names one principal's calls of one tool.
type callerKey struct{ tool, principal string }

// callerRun is one principal's run of consecutive errors of one tool: past
// UnavailableAfter its calls of the tool are refused until until (a
// cool-down doubling with each trip, as the shared circuit's).
type callerRun struct {
	errors, trips int
	until         time.Time
}

// maxCallerRuns bounds the callers' runs a tracker keeps (entries exist
// only while a principal's calls of a tool keep failing).
const maxCallerRuns = 10_000

// NewTracker returns a tracker over st. now is the clock (nil: time.Now);
// logger may be nil. Call Start before relying on the cache.
func NewTracker(st store.Store, cfg Config, now func() time.Time, logger *slog.Logger) *Tracker {
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Tracker{
		st:       st,
		cfg:      cfg,
		now:      now,
		log:      logger,
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		cache:    make(map[string]store.ToolHealth),
		localGen: make(map[string]uint64),
		dirty:    make(map[string]struct{}),
		watchers: make(map[*watcher]struct{}),
		callers:  make(map[callerKey]*callerRun),
	}
}

// Start loads every health record into the cache and keeps it fresh from
// store notifications (TopicHealth, and TopicTools because creating or
// deleting a tool creates or deletes its health record; an empty Key reloads
// all) until ctx ends. It returns once the load is done. A tracker starts
// once.
func (t *Tracker) Start(ctx context.Context) error {
	t.mu.Lock()
	if t.started {
		t.mu.Unlock()
		return errors.New("health tracker: already started")
	}
	t.started = true
	t.mu.Unlock()

	runCtx, cancel := context.WithCancel(ctx)
	// Subscribe before loading: a change that commits in between is then
	// in the load or notified afterwards, never lost.
	notes, err := t.st.Subscribe(runCtx)
	if err != nil {
		cancel()
		t.unstart()
		return fmt.Errorf("health tracker: subscribe to store notifications: %w", err)
	}
	gen := t.currentGen()
	all, err := t.st.ListToolHealth(ctx, store.ListToolHealthParams{})
	if err != nil {
		cancel()
		t.unstart()
		return fmt.Errorf("health tracker: load tool health: %w", err)
	}
	t.applyAll(all, gen)
	go t.run(runCtx, cancel, notes)
	return nil
}

func (t *Tracker) unstart() {
	t.mu.Lock()
	t.started = false
	t.mu.Unlock()
}

// run refreshes the cache from notifications and local dirty marks until ctx
// ends or the store ends the subscription. Refreshes run one at a time, so
// reads of the same tool apply in the order they were made.
func (t *Tracker) run(ctx context.Context, cancel context.CancelFunc, notes <-chan store.Notification) {
	defer close(t.done)
	defer cancel()
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case n, ok := <-notes:
			if !ok {
				if ctx.Err() == nil {
					t.log.Warn("health tracker: store notifications ended; cache no longer refreshed")
				}
				return
			}
			if n.Topic == store.TopicHealth || n.Topic == store.TopicTools {
				t.markDirty(n.Key)
			}
		case <-t.wake:
		case <-retry:
			retry = nil
		}
		if err := t.refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			t.log.Warn("health tracker: refresh from store failed; retrying", "error", err, "retry_in", refreshRetry)
			retry = time.After(refreshRetry)
		}
	}
}

// markDirty asks for tool (all tools if empty) to be read again.
func (t *Tracker) markDirty(tool string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tool == "" {
		t.dirtyAll = true
		return
	}
	t.dirty[tool] = struct{}{}
}

func (t *Tracker) currentGen() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gen
}

// refresh reads what is dirty from the store into the cache. On error what
// it could not read stays dirty.
func (t *Tracker) refresh(ctx context.Context) error {
	t.mu.Lock()
	all, tools, gen := t.dirtyAll, slices.Sorted(maps.Keys(t.dirty)), t.gen
	t.dirtyAll = false
	clear(t.dirty)
	t.mu.Unlock()

	if all {
		list, err := t.st.ListToolHealth(ctx, store.ListToolHealthParams{})
		if err != nil {
			t.remark(true, tools)
			return fmt.Errorf("list tool health: %w", err)
		}
		t.applyAll(list, gen)
		return nil
	}
	for i, name := range tools {
		h, err := t.st.GetToolHealth(ctx, name)
		switch {
		case err == nil:
			t.apply(name, h, gen)
		case errors.Is(err, store.ErrNotFound):
			t.apply(name, nil, gen)
		default:
			t.remark(false, tools[i:])
			return fmt.Errorf("get health of tool %q: %w", name, err)
		}
	}
	return nil
}

func (t *Tracker) remark(all bool, tools []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dirtyAll = t.dirtyAll || all
	for _, name := range tools {
		t.dirty[name] = struct{}{}
	}
}

// apply puts a record read from the store (nil: the tool has none) into the
// cache, unless a local write to the tool happened after gen.
func (t *Tracker) apply(tool string, h *store.ToolHealth, gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.applyLocked(tool, h, gen)
}

func (t *Tracker) applyLocked(tool string, h *store.ToolHealth, gen uint64) {
	if t.localGen[tool] > gen {
		return
	}
	if h == nil {
		delete(t.cache, tool)
		return
	}
	t.putLocked(*h)
}

// applyAll replaces the cache with a full read of the store.
func (t *Tracker) applyAll(list []*store.ToolHealth, gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := make(map[string]struct{}, len(list))
	for _, h := range list {
		seen[h.Tool] = struct{}{}
		t.applyLocked(h.Tool, h, gen)
	}
	for name := range t.cache {
		if _, ok := seen[name]; !ok {
			t.applyLocked(name, nil, gen)
		}
	}
}

// putLocked caches h and tells watchers if anything they can see changed.
func (t *Tracker) putLocked(h store.ToolHealth) {
	old, had := t.cache[h.Tool]
	t.cache[h.Tool] = h
	if had && sameHealth(old, h, false) {
		return
	}
	for w := range t.watchers {
		if w.wants(h.Tool) {
			w.push(h)
		}
	}
}

// setLocal caches a record this replica just wrote (or read under the
// store's lock) so that its next decision sees it at once. Because local
// writes of one tool can reach the cache in another order than they reached
// the store, the tool is also marked dirty: the refresh loop reads it back,
// after every such write, and settles the cache on the store's latest.
func (t *Tracker) setLocal(h store.ToolHealth) {
	t.mu.Lock()
	t.gen++
	t.localGen[h.Tool] = t.gen
	t.putLocked(h)
	t.dirty[h.Tool] = struct{}{}
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Get returns the cached record of tool.
func (t *Tracker) Get(tool string) (store.ToolHealth, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.cache[tool]
	return h, ok
}

// List returns cached records ordered by tool name, names > p.After, at most
// p.Limit (all if 0), only p.Status if set — ListToolHealth from the cache.
func (t *Tracker) List(p store.ListToolHealthParams) []store.ToolHealth {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []store.ToolHealth
	for _, name := range slices.Sorted(maps.Keys(t.cache)) {
		h := t.cache[name]
		if name <= p.After || (p.Status != "" && h.Status != p.Status) {
			continue
		}
		out = append(out, h)
		if p.Limit > 0 && len(out) == p.Limit {
			break
		}
	}
	return out
}

// Admission says how a call may reach its tool.
type Admission struct {
	// Probe: the call is the one half-open probe. The executor reports its
	// outcome with Observation.Probe set, or calls ReleaseProbe if the call
	// never reaches the tool.
	Probe bool
	// probeUntil identifies the claim, so that ReleaseProbe releases this
	// claim and never a later one. Two claims of one tool share it only if
	// made in the same microsecond, which a claim, a release and a new
	// claim — three store round trips — cannot be.
	probeUntil time.Time
}

// Admit decides from the cache whether a call may reach tool now. Refusals
// are *fault.Error:
//   - drained: Unavailable TOOL_UNAVAILABLE (RetryAfter MaxCooldown, a hint:
//     a drain has no end time);
//   - circuit open, in cool-down: Unavailable TOOL_UNAVAILABLE, RetryAfter
//     until the cool-down ends (metadata "cooldown_end_time");
//   - rate limited: ResourceExhausted TOOL_RATE_LIMITED, RetryAfter until
//     the reset (metadata "reset_time", RFC 3339);
//   - after the cool-down exactly one caller across all replicas claims the
//     probe and gets Admission{Probe: true}; the others get TOOL_UNAVAILABLE
//     with a short RetryAfter.
//
// A tool without a cached record is admitted (existence is the registry's
// business). A store error on the probe claim refuses (fail closed).
func (t *Tracker) Admit(ctx context.Context, tool string) (Admission, error) {
	now := t.clock()
	h, ok := t.Get(tool)
	if !ok {
		return Admission{}, nil
	}
	claim, err := t.judge(h, now)
	if err != nil || !claim {
		return Admission{}, err
	}
	fresh, written, err := t.st.UpdateToolHealth(ctx, tool, t.claimFunc(now))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return Admission{}, nil
	case err != nil:
		return Admission{}, fault.ToolUnavailable(tool, "it is recovering and its probe could not be claimed", probeRetry).
			WithCause(err)
	}
	t.setLocal(*fresh)
	if written {
		t.log.Debug("health: probe claimed", "tool", tool, "probe_until", fresh.ProbeUntil)
		return Admission{Probe: true, probeUntil: fresh.ProbeUntil}, nil
	}
	// Someone else holds the probe, or the tool changed meanwhile: judge
	// the record the store had.
	if claim, err = t.judge(*fresh, now); err != nil || !claim {
		return Admission{}, err
	}
	return Admission{}, t.probeBusy(tool, now.Add(probeRetry), now)
}

// judge decides from h: a refusal, a probe to claim, or (false, nil) admit.
func (t *Tracker) judge(h store.ToolHealth, now time.Time) (claim bool, err error) {
	open := h.Status == store.HealthUnavailable
	switch {
	case h.Drained:
		return false, fault.ToolUnavailable(h.Tool, "it is drained by an operator", t.cfg.MaxCooldown).
			With("drained", "true")
	case open && now.Before(h.CooldownUntil):
		return false, fault.ToolUnavailable(h.Tool, fmt.Sprintf("%d consecutive errors; retry after %s",
			h.ConsecutiveErrors, h.CooldownUntil.Format(time.RFC3339)), h.CooldownUntil.Sub(now)).
			With("cooldown_end_time", h.CooldownUntil.Format(time.RFC3339))
	case now.Before(h.RateLimitResetsAt):
		return false, fault.ToolRateLimited(h.Tool, h.RateLimitResetsAt, h.RateLimitResetsAt.Sub(now))
	case open && now.Before(h.ProbeUntil):
		return false, t.probeBusy(h.Tool, h.ProbeUntil, now)
	case open:
		return true, nil
	default:
		return false, nil
	}
}

func (t *Tracker) probeBusy(tool string, probeUntil, now time.Time) error {
	return fault.ToolUnavailable(tool, "it is recovering: a probe call is testing it", min(probeRetry, probeUntil.Sub(now)))
}

// claimFunc claims the half-open circuit if, on the locked record, it is
// still free. The claim is no health change: no event, no notification, and
// UpdatedAt is kept.
func (t *Tracker) claimFunc(now time.Time) store.HealthFunc {
	return func(cur store.ToolHealth) *store.HealthUpdate {
		if claim, err := t.judge(cur, now); err != nil || !claim {
			return nil
		}
		cur.ProbeUntil = normTime(now.Add(t.cfg.ProbeTimeout))
		return &store.HealthUpdate{Health: cur}
	}
}

// ReleaseProbe gives up the probe a admitted when the call will not reach
// the tool after all (refused later in the pipeline: a policy, the gate, a
// deadline), so that the next caller probes at once instead of waiting out
// ProbeTimeout. It is a no-op when a is not a probe or its claim has already
// ended (the probe reported, expired, or another caller holds a newer one).
func (t *Tracker) ReleaseProbe(ctx context.Context, tool string, a Admission) error {
	if !a.Probe || a.probeUntil.IsZero() {
		return nil
	}
	h, written, err := t.st.UpdateToolHealth(ctx, tool, func(cur store.ToolHealth) *store.HealthUpdate {
		if !cur.ProbeUntil.Equal(a.probeUntil) {
			return nil
		}
		cur.ProbeUntil = time.Time{}
		return &store.HealthUpdate{Health: cur}
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("health: release probe of tool %q: %w", tool, err)
	}
	if written {
		t.setLocal(*h)
	}
	return nil
}

// Change returns the health change to apply inside the call's FinishCall
// transaction, or nil when, judged from the cache, o changes nothing (a
// healthy tool's success must not write). ev carries the call's fields
// (CallID, Principal, Tool, Action, TraceID…) for the health.changed event.
// After FinishCall commits, the caller calls commit so that this replica's
// cache reflects the write at once (other replicas learn through
// notifications); commit is never nil and is a no-op when change is nil or
// FinishCall did not run the change.
//
// commit also applies o to its principal's own run of errors of the tool
// (see CheckCaller).
func (t *Tracker) Change(tool string, o Observation, ev store.AuditEvent) (change *store.HealthChange, commit func()) {
	now := t.clock()
	if cur, ok := t.Get(tool); ok {
		if _, changed := Next(t.cfg, cur, o, now); !changed {
			return nil, func() { t.observeCaller(tool, o, now) }
		}
	}
	fn, last := t.observeFunc(tool, o, ev, now)
	return &store.HealthChange{Tool: tool, Fn: fn}, func() {
		if h, ok := last(); ok {
			t.setLocal(h)
		}
		t.observeCaller(tool, o, now)
	}
}

// observeCaller applies o to its principal's own run of errors of tool.
func (t *Tracker) observeCaller(tool string, o Observation, now time.Time) {
	if o.Principal == "" {
		return
	}
	k := callerKey{tool, o.Principal}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch o.Kind {
	case Success, BusinessFailure:
		delete(t.callers, k)
	case ToolError:
		r := t.callers[k]
		if r == nil {
			if len(t.callers) >= maxCallerRuns {
				for ck, cr := range t.callers {
					if cr.errors < t.cfg.UnavailableAfter || !now.Before(cr.until.Add(t.cfg.MaxCooldown)) {
						delete(t.callers, ck)
					}
				}
				if len(t.callers) >= maxCallerRuns {
					return // fail open: the shared circuit still judges
				}
			}
			r = &callerRun{}
			t.callers[k] = r
		}
		r.errors++
		if r.errors >= t.cfg.UnavailableAfter {
			// As the shared circuit: opens at the threshold, and each
			// failure after a cool-down opens it again for longer.
			r.trips++
			r.until = now.Add(t.cfg.cooldown(r.trips))
		}
	}
}

// CheckCaller refuses a call of tool by principal while the principal's
// own calls of it are failing: after UnavailableAfter consecutive errors of
// its calls (on this replica), they are refused TOOL_UNAVAILABLE (metadata
// scope "principal") for a cool-down that doubles with each repeated
// opening, as the shared circuit's does; then its next call goes through,
// and its success ends the run. The shared circuit, which every caller
// sees, opens only on errors of several principals (Config.MinPrincipals):
// one principal whose arguments an upstream answers with errors takes
// the tool away from itself, not from everyone.
func (t *Tracker) CheckCaller(tool, principal string) error {
	now := t.clock()
	t.mu.Lock()
	r := t.callers[callerKey{tool, principal}]
	var errors int
	var until time.Time
	if r != nil {
		errors, until = r.errors, r.until
	}
	t.mu.Unlock()
	if r == nil || !now.Before(until) {
		return nil
	}
	return fault.ToolUnavailable(tool, fmt.Sprintf("the last %d calls of principal %s failed; its calls are refused until %s (other callers' calls are served)",
		errors, strconv.Quote(principal), until.Format(time.RFC3339)), until.Sub(now)).
		With("scope", "principal").With("cooldown_end_time", until.Format(time.RFC3339))
}

// Record applies an observation in its own transaction, for paths without a
// call record. It returns the record after it. NOT_FOUND for an unknown tool.
func (t *Tracker) Record(ctx context.Context, tool string, o Observation, ev store.AuditEvent) (*store.ToolHealth, error) {
	fn, _ := t.observeFunc(tool, o, ev, t.clock())
	h, _, err := t.st.UpdateToolHealth(ctx, tool, fn)
	if err != nil {
		return nil, t.storeErr(err, tool, fmt.Sprintf("record %s", o.Kind))
	}
	t.setLocal(*h)
	return h, nil
}

// Observe records o for tool, in its own transaction, unless judged from
// the cache it changes nothing: for observations made outside calls (a
// connector found unreachable, and reachable again), which may be made
// over and over and must write only when the health changes. NOT_FOUND for
// an unknown tool.
func (t *Tracker) Observe(ctx context.Context, tool string, o Observation, ev store.AuditEvent) error {
	if cur, ok := t.Get(tool); ok {
		if _, changed := Next(t.cfg, cur, o, t.clock()); !changed {
			return nil
		}
	}
	_, err := t.Record(ctx, tool, o, ev)
	return err
}

// observeFunc returns the HealthFunc that applies o, and a function telling
// the record the store last saw through it (the new record, or the current
// one when nothing changed) — what the cache should hold once the
// transaction commits.
func (t *Tracker) observeFunc(tool string, o Observation, ev store.AuditEvent, now time.Time) (store.HealthFunc, func() (store.ToolHealth, bool)) {
	// One event id for every run of fn: a backend may call it more than
	// once, and only one run commits.
	id := audit.NewID()
	var (
		mu   sync.Mutex
		seen store.ToolHealth
		ran  bool
	)
	fn := func(cur store.ToolHealth) *store.HealthUpdate {
		next, changed := Next(t.cfg, cur, o, now)
		mu.Lock()
		seen, ran = next, true
		mu.Unlock()
		if !changed {
			return nil
		}
		detail := map[string]any{"observation": o.Kind.String()}
		if o.Probe {
			detail["probe"] = true
		}
		return t.update(tool, cur, next, describe(cur, next, o), ev, id, now, detail)
	}
	last := func() (store.ToolHealth, bool) {
		mu.Lock()
		defer mu.Unlock()
		return seen, ran
	}
	return fn, last
}

// update builds the write of next. A change of nothing but the probe claim
// is written silently; any other change carries one health.changed event and
// notifies watchers.
func (t *Tracker) update(tool string, cur, next store.ToolHealth, reason string, ev store.AuditEvent, id string, now time.Time, detail map[string]any) *store.HealthUpdate {
	upd := &store.HealthUpdate{Health: next}
	if sameHealth(cur, next, false) {
		return upd
	}
	if refreshOnly(cur, next) {
		// A last-success refresh: no audit event (health did not change),
		// but other replicas' caches should show it.
		upd.Notify = true
		return upd
	}
	if detail == nil {
		detail = make(map[string]any, 6)
	}
	detail["from"] = string(cur.Status)
	detail["to"] = string(next.Status)
	detail["consecutive_errors"] = next.ConsecutiveErrors
	detail["reason"] = reason
	if !next.CooldownUntil.Equal(cur.CooldownUntil) && !next.CooldownUntil.IsZero() {
		detail["cooldown_end_time"] = next.CooldownUntil.Format(time.RFC3339Nano)
		detail["trips"] = next.Trips
	}
	if !next.RateLimitResetsAt.Equal(cur.RateLimitResetsAt) && !next.RateLimitResetsAt.IsZero() {
		detail["reset_time"] = next.RateLimitResetsAt.Format(time.RFC3339Nano)
	}
	ev.ID = id
	ev.Tool = tool
	ev.Time = now
	upd.Events = []store.AuditEvent{audit.NewDetail(audit.HealthChanged, ev, detail)}
	upd.Notify = true
	return upd
}

// Operation is an operator's override.
type Operation int

// Operations.
const (
	// Drain forces the tool UNAVAILABLE until restored.
	Drain Operation = iota + 1
	// Restore makes the tool HEALTHY: drain, error counters, cool-down,
	// trips, probe and rate limit cleared.
	Restore
)

// String names the operation for audit details.
func (op Operation) String() string {
	switch op {
	case Drain:
		return "drain"
	case Restore:
		return "restore"
	default:
		return fmt.Sprintf("Operation(%d)", int(op))
	}
}

// Set drains or restores tool on behalf of operator by, recording who and
// why on the record and in one health.changed event. A drain that repeats
// the current one, or a restore of a tool with nothing to clear, writes
// nothing and returns the record as it is. NOT_FOUND for an unknown tool.
func (t *Tracker) Set(ctx context.Context, tool string, op Operation, by, reason string) (*store.ToolHealth, error) {
	if op != Drain && op != Restore {
		return nil, fault.InvalidOperation(fmt.Sprintf("unknown health operation %s", op))
	}
	now := t.clock()
	id := audit.NewID()
	fn := func(cur store.ToolHealth) *store.HealthUpdate {
		next := cur
		switch op {
		case Drain:
			next.Status = store.HealthUnavailable
			next.Drained = true
			next.ProbeUntil = time.Time{}
			next.OverrideBy, next.OverrideReason = by, reason
		case Restore:
			next.Status = store.HealthHealthy
			next.Drained = false
			next.ConsecutiveErrors = 0
			next.CooldownUntil = time.Time{}
			next.Trips = 0
			next.RateLimitResetsAt = time.Time{}
			next.ProbeUntil = time.Time{}
			if sameHealth(cur, next, true) {
				return nil
			}
			next.OverrideBy, next.OverrideReason = by, reason
		}
		if sameHealth(cur, next, true) {
			return nil
		}
		next.UpdatedAt = now
		why := reason
		if why == "" {
			why = op.String() + " by " + by
		}
		return t.update(tool, cur, next, why, store.AuditEvent{Principal: by}, id, now,
			map[string]any{"operation": op.String(), "by": by})
	}
	h, _, err := t.st.UpdateToolHealth(ctx, tool, fn)
	if err != nil {
		return nil, t.storeErr(err, tool, op.String())
	}
	t.setLocal(*h)
	return h, nil
}

// storeErr turns ErrNotFound into the caller's NOT_FOUND and wraps the rest.
func (t *Tracker) storeErr(err error, tool, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return fault.ToolNotFound(tool).WithCause(err)
	}
	return fmt.Errorf("health: %s tool %q: %w", what, tool, err)
}

// clock returns now in the stores' precision, so cached and stored records
// compare equal.
func (t *Tracker) clock() time.Time { return normTime(t.now()) }

// refreshOnly reports whether next differs from cur in nothing the API shows
// but LastSuccessAt.
func refreshOnly(cur, next store.ToolHealth) bool {
	next.LastSuccessAt = cur.LastSuccessAt
	return sameHealth(cur, next, false)
}
