// Package memory is the in-memory store.Store: the default backend for a
// quick start and for unit tests. It keeps every record behind one mutex and
// follows the contract of package store exactly, so that code tested against
// it behaves the same on Postgres (the storetest suite runs against both).
//
// To catch code that would only work in memory, it mimics Postgres where
// callers can tell the difference: times are stored at microsecond precision
// in UTC, JSON documents must be valid, audit details come back as decoded
// JSON (numbers as float64), and records are copied in and out.
package memory

import (
	"context"
	"fmt"
	"sync"

	"github.com/toolsvc/toolsvc/internal/store"
)

var _ store.Store = (*Store)(nil)

// Store is an in-memory store.Store. The zero value is not usable; call New.
type Store struct {
	mu     sync.Mutex
	closed bool
	st     state

	// Subscriptions have their own lock so that publishing never waits for
	// the state lock (and the other way round).
	subMu      sync.Mutex
	subsClosed bool
	subs       map[*subscriber]struct{}
	subWG      sync.WaitGroup
}

// callKey is the unique key of a call record.
type callKey struct {
	principal string
	key       string
}

// Defaults of the store's bounds (see WithMaxCalls, WithMaxAuditEvents).
const (
	DefaultMaxCalls       = 20_000
	DefaultMaxAuditEvents = 40_000
)

// Option configures a Store.
type Option func(*state)

// WithMaxCalls bounds the call records kept: past n, the oldest finished
// records are forgotten (as if past retention) until n remain or none of
// the rest may go. Records IN_PROGRESS, parked, or UNKNOWN and not yet
// resolved are never forgotten: they hold keys, leases and outcomes an
// operator must settle. A forgotten key is free again: the same key with
// the same arguments runs again. 0 means no bound.
func WithMaxCalls(n int) Option {
	return func(st *state) { st.maxCalls = max(0, n) }
}

// WithMaxAuditEvents bounds the audit events kept: past n, the oldest
// (first appended) are deleted, except the events of calls still parked
// or in progress: an approver deciding a pending call, and an operator
// judging a running one, must find how it came to be (the store may then
// hold more than n). 0 means no bound.
func WithMaxAuditEvents(n int) Option {
	return func(st *state) { st.maxAudit = max(0, n) }
}

// WithEvictableCallEvents names event types that WithMaxAuditEvents may
// delete even while their call is parked or in progress: those a caller
// can repeat at will (replays of a pending call, refusals), which would
// otherwise let one caller pin an unbounded number of events.
func WithEvictableCallEvents(types ...string) Option {
	return func(st *state) {
		for _, t := range types {
			st.evictable[t] = true
		}
	}
}

// state is everything the store holds. It is only touched with Store.mu held.
type state struct {
	tools     map[string]*store.Tool
	toolsets  map[string]*store.Toolset
	health    map[string]*store.ToolHealth
	calls     map[string]*callRec
	callKeys  map[callKey]*callRec
	approvals map[string]*store.Approval
	previews  map[string]*store.Preview
	// parked lists, by call id, the approvals and previews made for the
	// call (they go with it).
	parkedApprovals map[string][]string
	parkedPreviews  map[string][]string
	// children lists, by call id, the calls nested in it (their
	// ParentCallID), in the order they were stored.
	children map[string][]string
	// waitingApprovals and waitingPreviews list, by approval id and preview
	// token, the calls ParkCall parked behind another call's approval or
	// preview (nested calls' parents). Entries are checked against the
	// records when used; they go when the approval or preview is decided.
	waitingApprovals map[string][]string
	waitingPreviews  map[string][]string

	// Call indexes: running calls by lease expiry, deletable ones by
	// retention, forgettable ones in the order they became so; and how many
	// records each holds validly.
	leases                        timeIndex[string]
	expiries                      timeIndex[string]
	evict                         evictQueue
	running, expiring, evictables int
	approvalsDue                  timeIndex[string]
	previewsDue                   timeIndex[string]

	// The audit trail in Seq order: audit[auditHead:] holds every event
	// kept, and deleted ones awaiting compaction (auditDead of them).
	audit     []auditRec
	auditHead int
	auditDead int
	auditIDs  map[string]struct{}
	// auditIDsGone and callsGone count deletions since the maps were
	// last rebuilt.
	auditIDsGone, callsGone int
	auditTimes              timeIndex[int64] // Seq by time
	seq                     int64
	// eventTypes numbers the audit event types seen (callRec.events).
	eventTypes map[string]int

	// parkedBy holds the ids of parked calls by principal, tool, action
	// and fingerprint (FindParkedCall).
	parkedBy map[parkedKey][]string

	// signingKeys by name; usedTokens holds each spent token's expiry, and
	// tokensDue the same by time.
	signingKeys map[string][]byte
	usedTokens  map[string]int64
	tokensDue   timeIndex[string]

	history      map[histKey]*histBucket
	histSeq      int64
	extraHistory map[string][]histRef

	maxCalls, maxAudit int
	// evictable are the event types the audit bound deletes even for
	// active calls (WithEvictableCallEvents).
	evictable map[string]bool
	// parked is, by principal, the calls it has parked and the bytes they
	// hold (store.ParkedBytes), for store.ParkLimits.
	parked map[string]parkUsage
	// pinSeq: every event kept with a Seq up to it belongs to a call that
	// is parked or in progress (as of the last eviction), so the next
	// eviction starts after it. A call that leaves those states with an
	// event at or before it resets it to 0.
	pinSeq int64

	// The notification outbox, its deliveries and console sessions
	// (outbox.go).
	ob outboxState
}

// New returns an empty store, bounded by DefaultMaxCalls and
// DefaultMaxAuditEvents unless opts say otherwise.
func New(opts ...Option) *Store {
	s := &Store{
		st: state{
			tools:            make(map[string]*store.Tool),
			toolsets:         make(map[string]*store.Toolset),
			health:           make(map[string]*store.ToolHealth),
			calls:            make(map[string]*callRec),
			callKeys:         make(map[callKey]*callRec),
			approvals:        make(map[string]*store.Approval),
			previews:         make(map[string]*store.Preview),
			parkedApprovals:  make(map[string][]string),
			parkedPreviews:   make(map[string][]string),
			children:         make(map[string][]string),
			waitingApprovals: make(map[string][]string),
			waitingPreviews:  make(map[string][]string),
			auditIDs:         make(map[string]struct{}),
			eventTypes:       make(map[string]int),
			history:          make(map[histKey]*histBucket),
			parkedBy:         make(map[parkedKey][]string),
			signingKeys:      make(map[string][]byte),
			usedTokens:       make(map[string]int64),
			extraHistory:     make(map[string][]histRef),
			evictable:        make(map[string]bool),
			parked:           make(map[string]parkUsage),
			maxCalls:         DefaultMaxCalls,
			maxAudit:         DefaultMaxAuditEvents,
		},
		subs: make(map[*subscriber]struct{}),
	}
	for _, o := range opts {
		o(&s.st)
	}
	return s
}

// Ping reports ErrUnavailable once the store is closed, nil before.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory store: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memory store closed: %w", store.ErrUnavailable)
	}
	return nil
}

// Close makes every later call fail with ErrUnavailable and ends every
// subscription (their channels are closed before Close returns).
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()

	s.subMu.Lock()
	s.subsClosed = true
	for sub := range s.subs {
		sub.end()
	}
	s.subMu.Unlock()
	s.subWG.Wait()
}

// tx collects what a write produces besides the state change itself: the
// notifications to publish once the change is visible.
type tx struct {
	st    *state
	notes []store.Notification
}

func (t *tx) notify(topic store.Topic, key string) {
	t.notes = append(t.notes, store.Notification{Topic: topic, Key: key})
}

// read runs fn with the state locked.
func (s *Store) read(ctx context.Context, fn func(st *state) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory store: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memory store closed: %w", store.ErrUnavailable)
	}
	return fn(&s.st)
}

// write runs fn with the state locked and publishes its notifications after
// the lock is released, so subscribers that re-read see the change. fn must
// check everything before it changes anything: an error must leave the state
// as it was (that is what makes each method atomic).
func (s *Store) write(ctx context.Context, fn func(t *tx) error) error {
	var notes []store.Notification
	err := s.read(ctx, func(st *state) error {
		t := &tx{st: st}
		if err := fn(t); err != nil {
			return err
		}
		notes = t.notes
		return nil
	})
	if err != nil {
		return err
	}
	s.publish(notes)
	return nil
}
