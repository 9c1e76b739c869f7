// Package store defines toolsvc's storage: the domain records (tools, tool
// health, calls, approvals, previews, audit events, task history), the
// interfaces both backends implement, and the sentinel errors they return.
//
// Rules every backend follows (the conformance suite in storetest checks them):
//   - The store never reads the clock: every time comes from the caller, with
//     one exception. Call leases are judged by the store's clock: a lease is
//     given as a duration, and its expiry is set and compared where every
//     replica agrees on the time. On Postgres that is the database's clock
//     (replicas' own clocks may be skewed: a reaper whose clock runs ahead
//     must not take away leases other replicas still renew). The memory
//     store serves one process, whose clock is the caller's: there a lease
//     runs from the time the caller gives with it (ClaimCall, StartParkedCall,
//     RenewCallLease), and ReapExpiredLeases compares with its Now.
//   - Each method is atomic: its record changes, audit events, task history,
//     notifications and outbox events (NotifiedEventTypes) commit together
//     or not at all.
//   - Audit events, wherever they are passed in, need an ID that is
//     non-empty (else ErrInvalid) and unique, in the trail and within the
//     batch (else ErrConflict). A refused event fails the whole method:
//     nothing it would have written, events included, is stored.
//   - Errors are the sentinels below, wrapped with %w; driver errors never
//     leak. A store that cannot be reached answers ErrUnavailable.
//   - Returned records are copies; callers may modify them freely.
//   - A limit of 0 means "no limit"; a negative limit or cursor is
//     ErrInvalid.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Compare with errors.Is.
var (
	// ErrNotFound: the record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the record exists already, or is not in the state (or
	// version) the operation requires.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: the store cannot be reached.
	ErrUnavailable = errors.New("store unavailable")
	// ErrInvalid: the caller passed something the store cannot hold (a bad
	// page cursor, a missing required field).
	ErrInvalid = errors.New("invalid request to store")
	// ErrParkLimit: parking the call would take its principal past its
	// ParkLimits (the error is a *ParkLimitError saying which).
	ErrParkLimit = errors.New("park limit reached")
)

// ParkLimits bound what one principal may have parked at once: calls
// AWAITING_APPROVAL or AWAITING_PREVIEW, and the bytes they hold
// (ParkedBytes). A zero field is no bound.
type ParkLimits struct {
	MaxCalls int
	MaxBytes int64
}

// ParkedBytes is what a parked call holds, as ParkLimits count it: its
// approval's arguments, or its preview's message and value.
func ParkedBytes(a *Approval, p *Preview) int64 {
	var n int64
	if a != nil {
		n += int64(len(a.Arguments))
	}
	if p != nil {
		n += int64(len(p.Message) + len(p.Value))
	}
	return n
}

// ParkLimitError is ClaimCall's refusal to park a call past its principal's
// ParkLimits. It matches ErrParkLimit.
type ParkLimitError struct {
	Principal string
	Limits    ParkLimits
	// Calls and Bytes are what the principal has parked without this call;
	// Adding is the bytes this call would hold.
	Calls  int
	Bytes  int64
	Adding int64
}

func (e *ParkLimitError) Error() string {
	return fmt.Sprintf("principal %q has %d calls parked holding %d bytes; one more of %d bytes would pass its limits (%d calls, %d bytes)",
		e.Principal, e.Calls, e.Bytes, e.Adding, e.Limits.MaxCalls, e.Limits.MaxBytes)
}

// Is makes a ParkLimitError match ErrParkLimit.
func (e *ParkLimitError) Is(target error) bool { return target == ErrParkLimit }

// CallsExceeded reports whether it is the number of calls that is at its
// limit (else the bytes are).
func (e *ParkLimitError) CallsExceeded() bool {
	return e.Limits.MaxCalls > 0 && e.Calls+1 > e.Limits.MaxCalls
}

// Check returns a *ParkLimitError if one more call of adding bytes would
// take usage of calls and bytes past l, or nil.
func (l ParkLimits) Check(principal string, calls int, bytes, adding int64) error {
	if (l.MaxCalls > 0 && calls+1 > l.MaxCalls) || (l.MaxBytes > 0 && bytes+adding > l.MaxBytes) {
		return &ParkLimitError{Principal: principal, Limits: l, Calls: calls, Bytes: bytes, Adding: adding}
	}
	return nil
}

// Store is the whole storage interface.
type Store interface {
	ToolStore
	ToolsetStore
	HealthStore
	CallStore
	ApprovalStore
	PreviewStore
	AuditStore
	TaskHistoryStore
	KeyStore
	Notifier
	OutboxStore
	SessionStore
	// Ping reports whether the store is reachable (ErrUnavailable if not).
	Ping(ctx context.Context) error
	// Close releases the store's resources.
	Close()
}

// ToolStore holds tool definitions. Creating a tool also creates its HEALTHY
// health record; deleting it deletes that record. Every change notifies
// TopicTools with the tool's name. A tool's JSON documents (schemas,
// examples) are kept as given, compacted: keys in their order, characters
// unescaped, so that every read returns the same bytes.
type ToolStore interface {
	// CreateTool inserts t with Version 1 and CreatedAt = UpdatedAt = p.Now.
	// t.Incarnation, a new unique id, is required (ErrInvalid). ErrConflict if
	// a tool with the name exists.
	CreateTool(ctx context.Context, p CreateToolParams) (*Tool, error)
	// UpdateTool replaces the definition of an existing tool whose version is
	// p.ExpectedVersion, storing it with version ExpectedVersion+1 and
	// UpdatedAt = p.Now (CreatedAt and Incarnation kept). ErrNotFound if there
	// is no such tool; ErrConflict if its version differs.
	UpdateTool(ctx context.Context, p UpdateToolParams) (*Tool, error)
	// DeleteTool removes a tool (and its health record) and returns it as it
	// was. What waits for the tool goes with it, in the same transaction:
	// every PENDING or APPROVED approval of the tool's name becomes
	// INVALIDATED (p.ApprovalEventsFor appended for each, TopicApprovals
	// notified) and every PENDING preview EXPIRED (p.PreviewEventsFor), and
	// their parked calls become RELEASED (UpdatedAt p.Now, ExpiresAt kept). A
	// tool registered again under the name is a new incarnation that none of
	// them may run. ErrNotFound; ErrConflict if p.ExpectedVersion is non-zero
	// and differs.
	DeleteTool(ctx context.Context, p DeleteToolParams) (*Tool, error)
	// GetTool returns a tool by name, or ErrNotFound.
	GetTool(ctx context.Context, name string) (*Tool, error)
	// ListTools returns tools ordered by name, names > p.After, at most
	// p.Limit (all if 0), only p.Source if set.
	ListTools(ctx context.Context, p ListToolsParams) ([]*Tool, error)
}

// CreateToolParams are CreateTool's inputs.
type CreateToolParams struct {
	Tool   *Tool // Version, CreatedAt, UpdatedAt are set by the store
	Now    time.Time
	Events []AuditEvent
}

// UpdateToolParams are UpdateTool's inputs.
type UpdateToolParams struct {
	Tool            *Tool // Version, CreatedAt, UpdatedAt are set by the store
	ExpectedVersion int64 // required
	Now             time.Time
	Events          []AuditEvent
}

// DeleteToolParams are DeleteTool's inputs.
type DeleteToolParams struct {
	Name            string
	ExpectedVersion int64 // 0: any
	Now             time.Time
	Events          []AuditEvent
	// ApprovalEventsFor returns the events of an approval the deletion
	// invalidates, given as stored (INVALIDATED; ResolvedAt is set if it had
	// been approved); nil: no events. Like the sweeps' event functions it
	// may be called more than once per record.
	ApprovalEventsFor func(*Approval) []AuditEvent
	// PreviewEventsFor returns the events of a preview the deletion expires;
	// nil: no events.
	PreviewEventsFor func(*Preview) []AuditEvent
}

// ListToolsParams are ListTools' inputs.
type ListToolsParams struct {
	After  string
	Limit  int
	Source ToolSource
}

// ToolsetStore holds toolsets: named groups of tools with model-facing
// guidance. A toolset refers to tools by name only; the store does not check
// that they exist (the registry does, when one is registered). Every change
// notifies TopicToolsets with the toolset's name.
type ToolsetStore interface {
	// CreateToolset inserts p.Toolset with Version 1 and CreatedAt =
	// UpdatedAt = p.Now. ErrConflict if a toolset with the name exists.
	CreateToolset(ctx context.Context, p CreateToolsetParams) (*Toolset, error)
	// UpdateToolset replaces the definition of an existing toolset whose
	// version is p.ExpectedVersion, storing it with version
	// ExpectedVersion+1 and UpdatedAt = p.Now (CreatedAt kept). ErrNotFound;
	// ErrConflict if its version differs.
	UpdateToolset(ctx context.Context, p UpdateToolsetParams) (*Toolset, error)
	// DeleteToolset removes a toolset and returns it as it was. ErrNotFound;
	// ErrConflict if p.ExpectedVersion is non-zero and differs.
	DeleteToolset(ctx context.Context, p DeleteToolsetParams) (*Toolset, error)
	// GetToolset returns a toolset by name, or ErrNotFound.
	GetToolset(ctx context.Context, name string) (*Toolset, error)
	// ListToolsets returns toolsets ordered by name, names > p.After, at most
	// p.Limit (all if 0), only p.Source if set.
	ListToolsets(ctx context.Context, p ListToolsetsParams) ([]*Toolset, error)
}

// CreateToolsetParams are CreateToolset's inputs.
type CreateToolsetParams struct {
	Toolset *Toolset // Version, CreatedAt, UpdatedAt are set by the store
	Now     time.Time
	Events  []AuditEvent
}

// UpdateToolsetParams are UpdateToolset's inputs.
type UpdateToolsetParams struct {
	Toolset         *Toolset // Version, CreatedAt, UpdatedAt are set by the store
	ExpectedVersion int64    // required
	Now             time.Time
	Events          []AuditEvent
}

// DeleteToolsetParams are DeleteToolset's inputs.
type DeleteToolsetParams struct {
	Name            string
	ExpectedVersion int64 // 0: any
	Now             time.Time
	Events          []AuditEvent
}

// ListToolsetsParams are ListToolsets' inputs.
type ListToolsetsParams struct {
	After  string
	Limit  int
	Source ToolSource
}

// HealthStore holds tool health. Records exist exactly while their tool does.
type HealthStore interface {
	// GetToolHealth returns a tool's health, or ErrNotFound.
	GetToolHealth(ctx context.Context, tool string) (*ToolHealth, error)
	// ListToolHealth returns health records ordered by tool name, names >
	// p.After, at most p.Limit (all if 0), only p.Status if set.
	ListToolHealth(ctx context.Context, p ListToolHealthParams) ([]*ToolHealth, error)
	// UpdateToolHealth reads the tool's health, locked against concurrent
	// updates on every replica, and passes it to fn. If fn returns an update,
	// it is written with its events (and notifies TopicHealth if
	// update.Notify) in one transaction. It returns the health as it is after
	// the call and whether it was written. ErrNotFound if the tool has no
	// health record.
	UpdateToolHealth(ctx context.Context, tool string, fn HealthFunc) (*ToolHealth, bool, error)
}

// HealthFunc decides a health change from the current record. It must be a
// pure function of its input (a backend may call it more than once); it
// returns nil for "no change".
type HealthFunc func(current ToolHealth) *HealthUpdate

// HealthUpdate is a decided health change.
type HealthUpdate struct {
	Health ToolHealth // the new record; Tool must not change
	Events []AuditEvent
	Notify bool // push to health watchers (status or override changes)
}

// ListToolHealthParams are ListToolHealth's inputs.
type ListToolHealthParams struct {
	After  string
	Limit  int
	Status HealthStatus
}

// CallStore holds call records: the idempotency keys and what became of them.
// (PrincipalID, IdempotencyKey) is unique.
//
// A call is parked behind an approval while its State is AWAITING_APPROVAL
// and its ApprovalID names that approval: the approval's own call
// (Approval.CallID), and any call parked behind it by ParkCall (the parents
// of a nested call that waits for a person). Likewise behind a preview
// (AWAITING_PREVIEW, PreviewToken). Parents wait for the approval to be
// decided: whenever an approval leaves PENDING — approved, denied, consumed,
// expired or invalidated, by whichever method — every other call parked
// behind it becomes RELEASED in the same transaction (so that a retry runs
// it again), with the UpdatedAt and ExpiresAt the method gives its own call
// (its own ExpiresAt kept where the method has none). The same holds for a
// preview leaving PENDING.
type CallStore interface {
	// GetCall returns a call by id, or ErrNotFound.
	GetCall(ctx context.Context, id string) (*Call, error)
	// GetCallByKey returns a call by principal and idempotency key, or
	// ErrNotFound.
	GetCallByKey(ctx context.Context, principalID, key string) (*Call, error)
	// FindParkedCall returns the principal's newest (by ID) call that is
	// parked — AWAITING_APPROVAL or AWAITING_PREVIEW — with p's tool, action
	// and fingerprint, or ErrNotFound. It is how a retry without its key
	// finds the call it repeats (the MCP front door's plain retry); calls in
	// any other state are never found this way.
	FindParkedCall(ctx context.Context, p FindParkedCallParams) (*Call, error)
	// ClaimCall claims p.Call's (PrincipalID, IdempotencyKey) in one atomic
	// step. If the key is free it inserts p.Call as given (its State is
	// IN_PROGRESS, AWAITING_APPROVAL or AWAITING_PREVIEW; AttemptCount is 1
	// for IN_PROGRESS, else 0; its ClaimToken is kept for ReleaseClaim),
	// except for LeaseExpiresAt, which the store sets: for IN_PROGRESS, the
	// store's clock plus p.Lease (which must be positive, else ErrInvalid; in
	// memory the clock is p.Call.UpdatedAt, the claim time); for a parked
	// state, none. If a RELEASED record holds the key with the
	// same fingerprint, that record is taken over instead: it keeps its ID and
	// CreatedAt, takes every other field from p.Call, and its AttemptCount is
	// incremented when the new state is IN_PROGRESS; the store then rewrites
	// p.Call.ID, p.Approval.CallID, p.Preview.CallID and the CallID of every
	// event to the kept ID. On success p.Approval or
	// p.Preview (if set) are inserted and p.Events appended in the same
	// transaction, and it returns (claimed call, true). Otherwise nothing is
	// written and it returns (the record holding the key, false): any state
	// but RELEASED, or RELEASED with another fingerprint. Across any number of
	// concurrent callers and replicas, one key is claimed at most once. A
	// parked claim whose key is free but that would pass p.Limits writes
	// nothing and returns a *ParkLimitError (ErrParkLimit).
	ClaimCall(ctx context.Context, p ClaimCallParams) (*Call, bool, error)
	// StartParkedCall moves a parked call to IN_PROGRESS, consuming what it
	// was parked behind, in one atomic step:
	//   - AWAITING_APPROVAL: the approval p.ApprovalID (which must be the
	//     call's) must be APPROVED and ExpiresAt > p.Now; it becomes CONSUMED;
	//   - AWAITING_PREVIEW: the preview p.PreviewToken (the call's) must be
	//     PENDING and ExpiresAt > p.Now; it becomes CONSUMED.
	// The call gets State IN_PROGRESS, a lease of p.Lease (positive, else
	// ErrInvalid) from the store's clock (in memory, from p.Now), Risk,
	// Decision, ClaimToken, UpdatedAt = p.Now, AttemptCount+1, and p.Events
	// are appended. ErrNotFound if the call does not exist; ErrConflict if
	// anything is not as required (so that of concurrent callers exactly one
	// starts the call).
	StartParkedCall(ctx context.Context, p StartParkedCallParams) (*Call, error)
	// RenewCallLease sets LeaseExpiresAt of an IN_PROGRESS call whose
	// AttemptCount is attempt to the store's clock plus lease (in memory,
	// now plus lease; lease must be positive, else ErrInvalid). ErrConflict if
	// the call is no longer so (the lease was lost); ErrNotFound if the call
	// does not exist.
	RenewCallLease(ctx context.Context, callID string, attempt int, now time.Time, lease time.Duration) error
	// FinishCall records the outcome of an execution attempt: the call must be
	// IN_PROGRESS with AttemptCount = p.Attempt, or UNKNOWN with that attempt
	// and no ResolvedBy (a lease the reaper took away from a replica that then
	// finished: the real outcome replaces the guess). It sets State, Result,
	// UpdatedAt, ExpiresAt and clears LeaseExpiresAt; appends p.Events; inserts
	// p.History if set; applies p.Health (as UpdateToolHealth would) if set —
	// all in one transaction. If the tool's health record is gone (the tool
	// was deleted while the call ran), the health change is skipped, its
	// events with it, and the outcome is still recorded. ErrConflict if the
	// call is not in such a state; ErrNotFound if it does not exist.
	FinishCall(ctx context.Context, p FinishCallParams) (*Call, error)
	// ParkCall parks a call whose tool ran and ended waiting for a nested
	// call's approval (p.ApprovalID) or preview (p.PreviewToken; exactly
	// one is set, else ErrInvalid): the call must be as FinishCall requires
	// (IN_PROGRESS, or UNKNOWN from a reaped lease, at p.Attempt). If the
	// approval (preview) is still PENDING — judged under a lock that orders
	// this against the methods that decide it — the call becomes
	// AWAITING_APPROVAL with that ApprovalID (AWAITING_PREVIEW with that
	// PreviewToken); otherwise, and if it does not exist, it becomes
	// RELEASED: it was decided meanwhile, and a retry runs the call again.
	// Either way Result is p.Result, UpdatedAt p.Now, ExpiresAt p.ExpiresAt,
	// the lease is cleared and p.Events are appended. ErrConflict if the call
	// is not in such a state; ErrNotFound if it does not exist.
	ParkCall(ctx context.Context, p ParkCallParams) (*Call, error)
	// ReportCallProgress records what the tool of an IN_PROGRESS call at
	// attempt p.Attempt reports (ProgressMessage p.Message, ProgressAt
	// p.Now) and renews its lease as RenewCallLease does, in one step.
	// ErrConflict if the call is no longer so; ErrNotFound if it does not
	// exist; ErrInvalid if p.Lease is not positive.
	ReportCallProgress(ctx context.Context, p ReportCallProgressParams) error
	// ListChildCalls returns the ids of the calls whose ParentCallID is
	// parentID, oldest first (by id), at most limit of them (0: all).
	ListChildCalls(ctx context.Context, parentID string, limit int) ([]string, error)
	// ReleaseClaim gives back a reservation whose tool never started: the
	// call holding (p.PrincipalID, p.IdempotencyKey) with ClaimToken p.Token,
	// if it is IN_PROGRESS (or UNKNOWN from a reaped lease, not resolved by
	// hand and with no event of type p.AnsweredEvent: the tool did not act,
	// whatever the reaper guessed, and nobody was told the guess), becomes
	// RELEASED with Result p.Result, UpdatedAt p.Now, ExpiresAt p.ExpiresAt
	// and no lease; its AttemptCount is kept. p.Events are appended with
	// their CallID set to the released call's. ErrNotFound if no call holds
	// the key with that token in such a state (the reservation never
	// committed, or has moved on): nothing to give back.
	ReleaseClaim(ctx context.Context, p ReleaseClaimParams) (*Call, error)
	// ReleaseParkedCall gives up a parked call whose approval or preview can no
	// longer be used: the call must be in state p.From (a parked state); it
	// becomes RELEASED and its approval (if p.ApprovalState is set) or preview
	// (if p.PreviewState is set) takes that state; p.Events are appended.
	// ErrConflict if the call is no longer in p.From; ErrNotFound.
	ReleaseParkedCall(ctx context.Context, p ReleaseParkedCallParams) (*Call, error)
	// ResolveCall settles an UNKNOWN call by hand: State (SUCCEEDED or FAILED),
	// Result, ResolvedBy, ResolutionComment, UpdatedAt are set and p.Events
	// appended. ErrNotFound; ErrConflict if the call is not UNKNOWN.
	ResolveCall(ctx context.Context, p ResolveCallParams) (*Call, error)
	// ReapExpiredLeases turns IN_PROGRESS calls whose lease expired by the
	// store's clock (in memory: before p.Now) into UNKNOWN (never re-running
	// them), at most p.Limit of them (0: no limit; negative: ErrInvalid):
	// State UNKNOWN, Result p.Result,
	// UpdatedAt p.Now, ExpiresAt p.ExpiresAt, and LeaseExpiresAt cleared (the
	// attempt no longer holds a lease; AttemptCount is kept, so that
	// FinishCall of that attempt can still replace the guess). It appends
	// p.EventsFor(call) for each, called with the call as stored, and returns
	// them. Safe to run on every replica at once: each call is reaped once.
	ReapExpiredLeases(ctx context.Context, p ReapParams) ([]*Call, error)
	// ExpireApprovals expires, in one transaction, the approvals and previews
	// whose ExpiresAt is before p.Now:
	//   - PENDING and APPROVED approvals become EXPIRED, their
	//     AWAITING_APPROVAL calls RELEASED, p.EventsFor(approval) is appended
	//     for each, and each notifies TopicApprovals;
	//   - PENDING previews become EXPIRED, their AWAITING_PREVIEW calls
	//     RELEASED, and p.PreviewEventsFor(preview) is appended for each.
	// Released calls get UpdatedAt = p.Now and ExpiresAt = p.ExpiresAt. At
	// most p.Limit approvals and at most p.Limit previews are expired (0: no
	// limit; negative: ErrInvalid). The event functions get the record as it
	// is stored (State EXPIRED; an approval that had been approved still has
	// its ResolvedAt). It returns the expired approvals and previews,
	// earliest expiry first. Safe to run on every replica at once: each
	// record is expired once.
	ExpireApprovals(ctx context.Context, p ExpireParams) (*ExpireResult, error)
	// DeleteExpiredCalls removes up to limit calls (0: no limit; negative:
	// ErrInvalid) whose ExpiresAt is before now and which are neither
	// IN_PROGRESS nor parked, together with their approvals, previews and
	// task history entries (matched by CallID), in one transaction. Task
	// history therefore lives as long as its call record: the retention
	// window (24h by default), after which policies no longer see the call.
	// Returns how many calls it removed.
	DeleteExpiredCalls(ctx context.Context, now time.Time, limit int) (int, error)
}

// FindParkedCallParams are FindParkedCall's inputs; every field is
// required (ErrInvalid).
type FindParkedCallParams struct {
	PrincipalID string
	Tool        string
	Action      string
	Fingerprint string
}

// ClaimCallParams are ClaimCall's inputs.
type ClaimCallParams struct {
	Call     *Call
	Approval *Approval // with Call.State AWAITING_APPROVAL
	Preview  *Preview  // with Call.State AWAITING_PREVIEW
	// Lease is the length of an IN_PROGRESS claim's lease, from the store's
	// clock (Call.LeaseExpiresAt is ignored).
	Lease  time.Duration
	Events []AuditEvent
	// Limits bound, for a parked claim, what Call.PrincipalID may have
	// parked once it is claimed (this call included); past them nothing is
	// written and ClaimCall returns a *ParkLimitError. Judged atomically
	// with the claim: concurrent claims of one principal never pass them
	// together.
	Limits ParkLimits
	// Replayed, if set, is the event of a replay, stored with the claim (in
	// the same commit) when the claim loses to a record that has an outcome
	// (State.Final) and the same tool, action and fingerprint as Call. The
	// store completes it from that record: CallID, Risk and Decision are
	// the record's, Outcome is its State.Outcome, and Detail (a JSON object
	// without those keys) gets the keys ReplayedAttemptKey (the record's
	// attempt count) and ReplayedStateKey (its state), encoded as
	// audit.EncodeDetail encodes. A stored event is written back completed,
	// with its Seq; one not stored keeps Seq 0 — a store may also decline
	// (a holder its claim did not see, a claim decided in a transaction),
	// and the caller then appends the event itself.
	Replayed *AuditEvent
}

// The keys ClaimCallParams.Replayed's Detail is completed with.
const (
	ReplayedAttemptKey = "attempt"
	ReplayedStateKey   = "state"
)

// StartParkedCallParams are StartParkedCall's inputs.
type StartParkedCallParams struct {
	CallID       string
	ApprovalID   string // for AWAITING_APPROVAL
	PreviewToken string // for AWAITING_PREVIEW
	Now          time.Time
	Lease        time.Duration // from the store's clock
	Risk         RiskLevel
	Decision     GateDecision
	ClaimToken   string
	Events       []AuditEvent
}

// ReleaseClaimParams are ReleaseClaim's inputs.
type ReleaseClaimParams struct {
	PrincipalID    string
	IdempotencyKey string
	Token          string // required
	// AnsweredEvent is the event type that says a call's stored outcome was
	// answered to a caller (a replay); a reaped call with such an event is
	// not released. Required.
	AnsweredEvent string
	Result        *Result
	Now           time.Time
	ExpiresAt     time.Time
	Events        []AuditEvent
}

// FinishCallParams are FinishCall's inputs.
type FinishCallParams struct {
	CallID    string
	Attempt   int
	State     CallState // SUCCEEDED, FAILED, UNKNOWN or RELEASED
	Result    *Result
	Now       time.Time
	ExpiresAt time.Time
	Events    []AuditEvent
	History   *TaskHistoryEntry
	Health    *HealthChange
}

// ParkCallParams are ParkCall's inputs.
type ParkCallParams struct {
	CallID       string
	Attempt      int
	ApprovalID   string
	PreviewToken string
	Result       *Result
	Now          time.Time
	ExpiresAt    time.Time
	Events       []AuditEvent
}

// ReportCallProgressParams are ReportCallProgress' inputs.
type ReportCallProgressParams struct {
	CallID  string
	Attempt int
	Message string
	Now     time.Time
	Lease   time.Duration // from the store's clock (in memory, from Now)
}

// HealthChange is a health update applied inside another transaction.
type HealthChange struct {
	Tool string
	Fn   HealthFunc
}

// ReleaseParkedCallParams are ReleaseParkedCall's inputs.
type ReleaseParkedCallParams struct {
	CallID        string
	From          CallState
	ApprovalState ApprovalState // EXPIRED or INVALIDATED, or empty
	PreviewState  PreviewState  // EXPIRED, or empty
	Now           time.Time
	ExpiresAt     time.Time
	Events        []AuditEvent
}

// ResolveCallParams are ResolveCall's inputs.
type ResolveCallParams struct {
	CallID     string
	State      CallState // SUCCEEDED or FAILED
	Result     *Result
	ResolvedBy string
	Comment    string
	Now        time.Time
	ExpiresAt  time.Time
	Events     []AuditEvent
}

// ReapParams are ReapExpiredLeases' inputs. The event functions of the
// sweeps (here and in ExpireParams) must not count on being called once per
// record: a backend may call them again when it retries a transaction, and
// stores only the events of the last call.
type ReapParams struct {
	// Now is the time recorded as the reaped calls' UpdatedAt; in memory it
	// is also what leases are compared with.
	Now       time.Time
	ExpiresAt time.Time // retention of the reaped records
	Limit     int
	Result    *Result // stored as the reaped calls' result
	EventsFor func(*Call) []AuditEvent
}

// ExpireParams are ExpireApprovals' inputs.
type ExpireParams struct {
	Now       time.Time
	ExpiresAt time.Time // retention of the released calls
	Limit     int       // for approvals and previews each
	// EventsFor returns the events of an expired approval; nil: no events.
	EventsFor func(*Approval) []AuditEvent
	// PreviewEventsFor returns the events of an expired preview; nil: no
	// events.
	PreviewEventsFor func(*Preview) []AuditEvent
}

// ExpireResult is what ExpireApprovals expired, each earliest expiry first.
type ExpireResult struct {
	Approvals []*Approval
	Previews  []*Preview
}

// ApprovalStore holds approvals. Every change notifies TopicApprovals with the
// approval's id: its creation (ClaimCall), resolution (ResolveApproval),
// consumption (StartParkedCall), expiry (ExpireApprovals), invalidation or
// expiry through ReleaseParkedCall, and deletion (DeleteExpiredCalls).
type ApprovalStore interface {
	// GetApproval returns an approval by id, or ErrNotFound.
	GetApproval(ctx context.Context, id string) (*Approval, error)
	// ListApprovals returns approvals newest first (by ID, which sorts by
	// creation time), IDs < p.Before if set, at most p.Limit (all if 0),
	// filtered by p.State and p.Tool if set.
	ListApprovals(ctx context.Context, p ListApprovalsParams) ([]*Approval, error)
	// ResolveApproval moves a PENDING approval whose ExpiresAt is after p.Now
	// to p.State (APPROVED or DENIED), setting Resolver, Comment and
	// ResolvedAt = p.Now. When DENIED, its AWAITING_APPROVAL call becomes
	// DENIED with p.CallResult (and ExpiresAt p.CallExpiresAt). p.Events are
	// appended. ErrNotFound; ErrConflict if it is not PENDING or has expired.
	ResolveApproval(ctx context.Context, p ResolveApprovalParams) (*Approval, error)
}

// ListApprovalsParams are ListApprovals' inputs.
type ListApprovalsParams struct {
	Before string
	Limit  int
	State  ApprovalState
	Tool   string
	// Requester, if set, selects the approvals of one principal's calls.
	Requester string
	// MaxBytes, when positive, ends the list early: after the first
	// approval that brings the approvals' total ApprovalSize over it (so
	// the list holds at least one). A negative value is ErrInvalid.
	MaxBytes int
}

// ApprovalSize is an approval's size as MaxBytes counts it: the bytes of
// its text fields and arguments.
func ApprovalSize(a *Approval) int {
	return len(a.ID) + len(a.CallID) + len(a.Requester) + len(a.Tool) + len(a.Action) + len(a.Arguments) +
		len(a.Fingerprint) + len(a.IdempotencyKey) + len(a.TraceID) + len(a.TaskID) + len(a.StepID) +
		len(a.Resolver) + len(a.Comment) + len(a.ToolIncarnation)
}

// ResolveApprovalParams are ResolveApproval's inputs.
type ResolveApprovalParams struct {
	ID            string
	State         ApprovalState // APPROVED or DENIED
	Resolver      string
	Comment       string
	Now           time.Time
	CallResult    *Result // stored on the call when DENIED
	CallExpiresAt time.Time
	Events        []AuditEvent
}

// PreviewStore holds previews.
type PreviewStore interface {
	// GetPreview returns a preview by token, or ErrNotFound.
	GetPreview(ctx context.Context, token string) (*Preview, error)
}

// AuditStore holds the audit trail: append-only, except that events past the
// retention window are deleted (DeleteAuditEventsBefore).
type AuditStore interface {
	// AppendAuditEvents appends events in order, assigning Seq (the caller's
	// Seq is ignored). Every event needs a non-empty ID (ErrInvalid) that no
	// stored event and no other event of the batch has (ErrConflict); a batch
	// with a refused event stores nothing. The Postgres store, whose trail is
	// partitioned by time, refuses a stored ID only together with the same
	// Time (a retried append); the memory store refuses it whatever the Time.
	AppendAuditEvents(ctx context.Context, events []AuditEvent) error
	// ListAuditEvents returns events in Seq order, Seq > f.AfterSeq, at most
	// f.Limit (all if 0), matching every filter that is set.
	//
	// Seq is assigned when an event is inserted, not when its transaction
	// commits: with concurrent writers (replicas, or concurrent requests on
	// Postgres) an event with a higher Seq can become visible before one with
	// a lower Seq. A reader tailing the trail by AfterSeq can therefore skip
	// an event that commits just behind its cursor; it should re-read a short
	// window behind the cursor (from the highest Seq it had read a few
	// seconds earlier, comfortably longer than a store transaction lasts) and
	// drop the events it has already seen, by ID.
	ListAuditEvents(ctx context.Context, f AuditFilter) ([]*AuditEvent, error)
	// DeleteAuditEventsBefore deletes up to limit events (0: no limit;
	// negative: ErrInvalid) whose Time is before before, oldest Time first,
	// and returns how many it deleted. A store that keeps the trail in
	// units of time (Postgres: a partition per day) removes a unit that
	// ends by before whole, even past limit, and may count it as its
	// statistics estimate it rather than by reading it. Safe to run on
	// every replica at once.
	DeleteAuditEventsBefore(ctx context.Context, before time.Time, limit int) (int, error)
}

// AuditFilter selects audit events. Empty fields do not filter.
type AuditFilter struct {
	Types     []string
	CallID    string
	TraceID   string
	TaskID    string
	Principal string
	Tool      string
	Start     time.Time // Time >= Start
	End       time.Time // Time < End
	AfterSeq  int64
	Limit     int
	// MaxBytes, when positive, ends the list early: after the first event
	// that brings the events' total AuditEventSize over it (so the list
	// holds at least one event, and one that goes over tells the caller the
	// budget was reached). A negative value is ErrInvalid.
	MaxBytes int
}

// AuditEventSize is an event's size as MaxBytes counts it: the bytes of its
// text fields and of its detail's JSON encoding. It is close to the size of
// the event's API message, a little below it.
func AuditEventSize(e *AuditEvent) int {
	n := len(e.ID) + len(e.Type) + len(e.CallID) + len(e.TraceID) + len(e.TaskID) + len(e.StepID) +
		len(e.Principal) + len(e.Tool) + len(e.Action) + len(e.Decision) + len(e.Outcome)
	return n + len(e.Detail)
}

// KeyStore holds what replicas share to trust each other's tokens: signing
// keys, and the single-use tokens already used. (The MCP front door signs
// its request states with a key from here and spends each state once.)
// Keys are secrets: they are never written to the audit trail or logs.
type KeyStore interface {
	// SigningKey returns the key stored under name; if there is none it
	// stores key under name first. Of concurrent callers on any replicas
	// the first one's key is stored and every caller gets it. ErrInvalid if
	// name is empty or key shorter than MinSigningKeyBytes.
	SigningKey(ctx context.Context, name string, key []byte) ([]byte, error)
	// UseToken spends the single-use token id, remembering it until
	// expiresAt: it returns true the first time, and false (writing
	// nothing) when the token was spent before and has not been deleted.
	// Across any number of concurrent callers and replicas exactly one gets
	// true. ErrInvalid if id is empty.
	UseToken(ctx context.Context, id string, expiresAt time.Time) (bool, error)
	// DeleteUsedTokens forgets up to limit spent tokens whose expiresAt is
	// before now (0: no limit; negative: ErrInvalid) and returns how many.
	// Callers spend a token only before its expiry, so a forgotten token
	// can never be spent again.
	DeleteUsedTokens(ctx context.Context, now time.Time, limit int) (int, error)
}

// MinSigningKeyBytes is the shortest signing key a KeyStore holds.
const MinSigningKeyBytes = 32

// TaskHistoryStore holds the successful calls of each (principal, task).
type TaskHistoryStore interface {
	// ListTaskHistory returns entries of one principal's task in insertion
	// order, filtered by f.Tool, f.Actions and f.Resource if set, at most
	// f.Limit (all if 0).
	ListTaskHistory(ctx context.Context, f TaskHistoryFilter) ([]TaskHistoryEntry, error)
}

// TaskHistoryFilter selects task history entries. PrincipalID and TaskID are
// required.
type TaskHistoryFilter struct {
	PrincipalID string
	TaskID      string
	Tool        string
	Actions     []string
	Resource    string
	Limit       int
}

// Topic names a kind of change.
type Topic string

// Topics.
const (
	TopicTools     Topic = "tools"
	TopicApprovals Topic = "approvals"
	TopicHealth    Topic = "health"
	TopicToolsets  Topic = "toolsets"
)

// Notification says that something changed, on this or another replica.
type Notification struct {
	Topic Topic
	// Key is the tool name, approval id or toolset name. Empty means "anything of this
	// topic may have changed" (sent after a lost connection): reload all.
	Key string
}

// Notifier delivers change notifications from every replica sharing the
// store. Delivery is at-least-once per live subscription and may coalesce;
// subscribers re-read the record rather than trust a payload.
type Notifier interface {
	// Subscribe returns a channel of notifications that is closed when ctx
	// ends. Slow subscribers may lose notifications, in which case they
	// receive one with an empty Key per topic.
	Subscribe(ctx context.Context) (<-chan Notification, error)
}
