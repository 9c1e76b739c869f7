package store

import (
	"context"
	"encoding/json"
	"slices"
	"time"
)

// NotifiedEventTypes are the audit event types that are also queued in the
// notification outbox: whenever a store appends an event of one of these
// types (in whatever method), the same transaction queues a copy of it for
// OutboxStore. They are the audit types of approval.pending (an approval
// asked for: gate.required), approval.resolved and approval.expired; the
// notifications sent for them are described in docs/notifications.md.
func NotifiedEventTypes() []string {
	return []string{"gate.required", "approval.resolved", "approval.expired"}
}

// Notified reports whether events of type typ are queued in the outbox.
func Notified(typ string) bool { return slices.Contains(NotifiedEventTypes(), typ) }

// DeliveryState is the lifecycle of a notification delivery.
type DeliveryState string

// Delivery states.
const (
	// DeliveryPending: not delivered yet; due at NextAttemptAt.
	DeliveryPending DeliveryState = "PENDING"
	// DeliveryDelivered: the endpoint acknowledged it.
	DeliveryDelivered DeliveryState = "DELIVERED"
	// DeliveryDead: every attempt failed (a dead letter).
	DeliveryDead DeliveryState = "DEAD"
)

// Delivery is one notification to one endpoint: the message sent, and what
// became of the attempts to send it. ID is the message's id, the same on
// every attempt (receivers deduplicate by it).
type Delivery struct {
	ID         string
	EventID    string // the audit event it was made for
	EventType  string // the notification's type (approval.pending, ...)
	ApprovalID string
	Endpoint   string // the endpoint's id in the configuration
	Payload    json.RawMessage
	State      DeliveryState
	// Attempts counts the attempts begun (a claim begins one).
	Attempts       int
	NextAttemptAt  time.Time
	LeaseExpiresAt time.Time // while an attempt holds it
	// ClaimToken identifies the attempt that holds the delivery. Internal.
	ClaimToken  string
	LastError   string
	LastStatus  int // the endpoint's last HTTP status (0: none)
	CreatedAt   time.Time
	UpdatedAt   time.Time
	DeliveredAt time.Time
}

// OutboxStore holds the notification outbox and the deliveries made from it.
// Outbox events are queued by the stores themselves (NotifiedEventTypes);
// a dispatcher on every replica turns them into deliveries, one per
// endpoint, and sends these, each endpoint's delivery by one replica at a
// time (a lease), retried until delivered or dead.
type OutboxStore interface {
	// ListOutbox returns up to limit queued outbox events (0: all; negative:
	// ErrInvalid), oldest first.
	ListOutbox(ctx context.Context, limit int) ([]*AuditEvent, error)
	// ExpandOutbox removes the given events from the outbox and inserts
	// their deliveries, in one transaction. An event no longer queued
	// (another replica expanded it) is skipped with its deliveries; a
	// delivery whose (EventID, Endpoint) exists already is skipped. It
	// returns the deliveries inserted. Each needs an ID, EventID, Endpoint,
	// Payload and State PENDING (else ErrInvalid); Attempts, lease and
	// claim token are set by the store (0, none).
	ExpandOutbox(ctx context.Context, p ExpandOutboxParams) ([]*Delivery, error)
	// ClaimDeliveries begins an attempt on up to p.Limit PENDING deliveries
	// of p.Endpoints that are due (NextAttemptAt <= p.Now) and held by no
	// live lease (by the store's clock; in memory, p.Now), earliest due
	// first: each gets a lease of p.Lease (positive, else ErrInvalid), the
	// claim token p.ClaimToken and Attempts+1. Safe on every replica at
	// once: a delivery is held by one attempt at a time.
	ClaimDeliveries(ctx context.Context, p ClaimDeliveriesParams) ([]*Delivery, error)
	// FinishDelivery records the end of an attempt: the delivery must be
	// PENDING and hold p.ClaimToken (else ErrConflict: the lease was lost to
	// another attempt); it takes p.State (DELIVERED, PENDING for a retry at
	// p.NextAttemptAt, or DEAD), LastError, LastStatus, UpdatedAt = p.Now
	// (and DeliveredAt when DELIVERED), and loses its lease. ErrNotFound.
	FinishDelivery(ctx context.Context, p FinishDeliveryParams) (*Delivery, error)
	// ListDeliveries returns deliveries newest first (by ID), IDs < p.Before
	// if set, at most p.Limit (all if 0), filtered by every field set.
	ListDeliveries(ctx context.Context, p ListDeliveriesParams) ([]*Delivery, error)
	// CountDeliveries returns how many deliveries are in state.
	CountDeliveries(ctx context.Context, state DeliveryState) (int, error)
	// DeleteFinishedDeliveries removes up to limit (0: no limit; negative:
	// ErrInvalid) DELIVERED and DEAD deliveries updated before before, and
	// returns how many.
	DeleteFinishedDeliveries(ctx context.Context, before time.Time, limit int) (int, error)
}

// ExpandOutboxParams are ExpandOutbox's inputs.
type ExpandOutboxParams struct {
	Expansions []OutboxExpansion
	Now        time.Time // CreatedAt and UpdatedAt of the deliveries
}

// OutboxExpansion is one outbox event and the deliveries made of it (none
// when no endpoint wants it).
type OutboxExpansion struct {
	EventID    string
	Deliveries []*Delivery
}

// ClaimDeliveriesParams are ClaimDeliveries' inputs.
type ClaimDeliveriesParams struct {
	Endpoints  []string // required: the endpoints the caller can send to
	Now        time.Time
	Lease      time.Duration
	Limit      int // 0: no limit
	ClaimToken string
}

// FinishDeliveryParams are FinishDelivery's inputs.
type FinishDeliveryParams struct {
	ID            string
	ClaimToken    string
	State         DeliveryState
	NextAttemptAt time.Time // for PENDING
	LastError     string
	LastStatus    int
	Now           time.Time
}

// ListDeliveriesParams are ListDeliveries' inputs.
type ListDeliveriesParams struct {
	Before     string
	Limit      int
	State      DeliveryState
	Endpoint   string
	ApprovalID string
}

// Session is a signed-in console session. ID is a hash of the secret the
// browser holds (the store never sees the secret itself); a session ends
// when it expires or is deleted (sign-out), on every replica at once.
type Session struct {
	ID          string
	PrincipalID string
	// Credential says how the principal signed in and is checked again on
	// every request ("token:<sha256>", "certificate:<sha256>", "dev").
	Credential string
	CreatedAt  time.Time
	ExpiresAt  time.Time
}

// SessionStore holds console sessions, so that a session works on every
// replica and signing out ends it everywhere.
type SessionStore interface {
	// CreateSession stores s. ErrConflict if its ID exists; ErrInvalid if
	// ID or PrincipalID is empty.
	CreateSession(ctx context.Context, s *Session) error
	// GetSession returns a session by ID (expired or not), or ErrNotFound.
	GetSession(ctx context.Context, id string) (*Session, error)
	// DeleteSession removes a session; removing one that does not exist is
	// not an error.
	DeleteSession(ctx context.Context, id string) error
	// DeleteExpiredSessions removes up to limit sessions (0: no limit;
	// negative: ErrInvalid) whose ExpiresAt is before now, and returns how
	// many.
	DeleteExpiredSessions(ctx context.Context, now time.Time, limit int) (int, error)
}
