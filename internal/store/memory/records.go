package memory

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Records are kept compact: the text fields of a call or an audit event are
// packed into one string with their end offsets beside it, and times are
// Unix microseconds (what Postgres keeps of them). A record is then two or
// three allocations the garbage collector scans as a handful of pointers,
// rather than a struct of twenty strings; reading one back slices its
// string (no copy) and copies only the JSON payloads, which callers may
// modify.

// packText packs fields into one string, writing each field's end offset to
// ends (len(ends) == len(fields)).
func packText(ends []uint32, fields ...string) string {
	n := 0
	for _, f := range fields {
		n += len(f)
	}
	var b strings.Builder
	b.Grow(n)
	for i, f := range fields {
		b.WriteString(f)
		ends[i] = uint32(b.Len())
	}
	return b.String()
}

// field returns field i of text packed with ends.
func field(text string, ends []uint32, i int) string {
	start := uint32(0)
	if i > 0 {
		start = ends[i-1]
	}
	return text[start:ends[i]]
}

// zeroMicros is the zero time in Unix microseconds: earlier than any other
// time, as the zero time.Time is.
var zeroMicros = time.Time{}.UnixMicro()

// micros is t as stored: Unix microseconds.
func micros(t time.Time) int64 {
	return t.UnixMicro()
}

// fromMicros is the time stored as us, in UTC (the zero time for zeroMicros).
func fromMicros(us int64) time.Time {
	if us == zeroMicros {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

// rawJSON copies a stored JSON field out (nil when empty).
func rawJSON(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

// The text fields of a call record besides its identity, in packing order.
const (
	cfFingerprint = iota
	cfTool
	cfAction
	cfState
	cfTraceID
	cfTaskID
	cfStepID
	cfDecision
	cfApprovalID
	cfPreviewToken
	cfClaimToken
	cfResolvedBy
	cfResolutionComment
	cfResultMessage
	cfResultValue
	cfParentCallID
	cfProgressMessage
	callFields
)

// Flags of a call record.
const (
	cHasResult = 1 << iota
	cSuccess
	cExcludeValue
)

// callRec is a stored call. Its identity (id, principal, key) never changes
// and is allocated once; the rest is re-packed on every change. The record
// is updated in place, so that indexes may hold it by id.
type callRec struct {
	ident   string // ID, then PrincipalID, then IdempotencyKey
	idEnd   uint32
	prinEnd uint32
	text    string
	ends    [callFields]uint32

	created, updated, expires, lease int64 // Unix microseconds; 0: none
	progressAt                       int64 // Unix microseconds
	toolVersion                      int64
	risk                             toolkit.RiskLevel
	attempt                          int32
	flags                            uint8
	// class is what the record counts as in the indexes (see classOf).
	class uint8
	// events has bit i set when an audit event of the type numbered i
	// (state.eventType) was appended for this call.
	events uint64
	// evictSeq is the record's place in the eviction queue (0: none).
	evictSeq uint64
	// firstSeq is the Seq of the first audit event appended for the call
	// (0: none yet); see state.unpin.
	firstSeq int64
	// parkBytes is what the call holds while parked (store.ParkedBytes),
	// counted in state.parked while parkCounted.
	parkBytes   int64
	parkCounted bool
	// hist and histSeq locate the record's task history entry (histSeq 0:
	// none); any further entries are in state.extraHistory.
	hist    *histBucket
	histSeq int64
}

func (r *callRec) id() string        { return r.ident[:r.idEnd] }
func (r *callRec) principal() string { return r.ident[r.idEnd:r.prinEnd] }
func (r *callRec) key() string       { return r.ident[r.prinEnd:] }
func (r *callRec) str(i int) string  { return field(r.text, r.ends[:], i) }
func (r *callRec) state() store.CallState {
	return store.CallState(r.str(cfState))
}

// newCallRec allocates the record of c (its identity included).
func newCallRec(c *store.Call) *callRec {
	r := &callRec{
		ident:   c.ID + c.PrincipalID + c.IdempotencyKey,
		idEnd:   uint32(len(c.ID)),
		prinEnd: uint32(len(c.ID) + len(c.PrincipalID)),
	}
	r.set(c)
	return r
}

// set packs everything of c but its identity into r.
func (r *callRec) set(c *store.Call) {
	var msg, val string
	r.flags = 0
	if c.Result != nil {
		r.flags |= cHasResult
		if c.Result.Success {
			r.flags |= cSuccess
		}
		if c.Result.ExcludeValueFromContext {
			r.flags |= cExcludeValue
		}
		msg, val = c.Result.Message, string(c.Result.Value)
	}
	r.text = packText(r.ends[:], c.Fingerprint, c.Tool, c.Action, string(c.State), c.TraceID, c.TaskID,
		c.StepID, string(c.Decision), c.ApprovalID, c.PreviewToken, c.ClaimToken,
		c.ResolvedBy, c.ResolutionComment, msg, val, c.ParentCallID, c.ProgressMessage)
	r.created, r.updated = micros(c.CreatedAt), micros(c.UpdatedAt)
	r.progressAt = micros(c.ProgressAt)
	r.expires, r.lease = micros(c.ExpiresAt), micros(c.LeaseExpiresAt)
	r.toolVersion = c.ToolVersion
	r.risk = c.Risk
	r.attempt = int32(c.AttemptCount)
}

// call decodes r into a call of the caller's own (its result value copied).
func (r *callRec) call() *store.Call {
	c := &store.Call{
		ID:                r.id(),
		PrincipalID:       r.principal(),
		IdempotencyKey:    r.key(),
		Fingerprint:       r.str(cfFingerprint),
		Tool:              r.str(cfTool),
		Action:            r.str(cfAction),
		ToolVersion:       r.toolVersion,
		State:             store.CallState(r.str(cfState)),
		TraceID:           r.str(cfTraceID),
		TaskID:            r.str(cfTaskID),
		StepID:            r.str(cfStepID),
		Risk:              r.risk,
		Decision:          store.GateDecision(r.str(cfDecision)),
		ApprovalID:        r.str(cfApprovalID),
		PreviewToken:      r.str(cfPreviewToken),
		LeaseExpiresAt:    fromMicros(r.lease),
		AttemptCount:      int(r.attempt),
		ClaimToken:        r.str(cfClaimToken),
		ResolvedBy:        r.str(cfResolvedBy),
		ResolutionComment: r.str(cfResolutionComment),
		CreatedAt:         fromMicros(r.created),
		UpdatedAt:         fromMicros(r.updated),
		ExpiresAt:         fromMicros(r.expires),
		ParentCallID:      r.str(cfParentCallID),
		ProgressMessage:   r.str(cfProgressMessage),
		ProgressAt:        fromMicros(r.progressAt),
	}
	if r.flags&cHasResult != 0 {
		c.Result = &store.Result{
			Success:                 r.flags&cSuccess != 0,
			Message:                 r.str(cfResultMessage),
			Value:                   rawJSON(r.str(cfResultValue)),
			ExcludeValueFromContext: r.flags&cExcludeValue != 0,
		}
	}
	return c
}

// The text fields of an audit event, in packing order; the detail is last.
const (
	afID = iota
	afType
	afCallID
	afTraceID
	afTaskID
	afStepID
	afPrincipal
	afTool
	afAction
	afDecision
	afOutcome
	afDetail
	auditFields
)

// auditRec is a stored audit event. A deleted one (awaiting compaction of
// the trail) has no text.
type auditRec struct {
	text string
	ends [auditFields]uint32
	seq  int64
	time int64 // Unix microseconds
	risk toolkit.RiskLevel
}

func (r *auditRec) str(i int) string { return field(r.text, r.ends[:], i) }
func (r *auditRec) id() string       { return r.str(afID) }
func (r *auditRec) deleted() bool    { return r.text == "" }

func newAuditRec(e *store.AuditEvent, seq int64) auditRec {
	r := auditRec{seq: seq, time: micros(e.Time), risk: e.Risk}
	r.text = packText(r.ends[:], e.ID, e.Type, e.CallID, e.TraceID, e.TaskID, e.StepID, e.Principal,
		e.Tool, e.Action, string(e.Decision), string(e.Outcome), string(e.Detail))
	return r
}

// event decodes r (its detail copied).
func (r *auditRec) event() *store.AuditEvent {
	return &store.AuditEvent{
		ID:        r.str(afID),
		Seq:       r.seq,
		Time:      fromMicros(r.time),
		Type:      r.str(afType),
		CallID:    r.str(afCallID),
		TraceID:   r.str(afTraceID),
		TaskID:    r.str(afTaskID),
		StepID:    r.str(afStepID),
		Principal: r.str(afPrincipal),
		Tool:      r.str(afTool),
		Action:    r.str(afAction),
		Risk:      r.risk,
		Decision:  store.GateDecision(r.str(afDecision)),
		Outcome:   store.Outcome(r.str(afOutcome)),
		Detail:    rawJSON(r.str(afDetail)),
	}
}

// The text fields of a task history entry (its principal and task are its
// bucket's), in packing order.
const (
	hfCallID = iota
	hfTool
	hfAction
	hfResource
	histFields
)

// histRec is a stored task history entry; a deleted one has no text.
type histRec struct {
	text string
	ends [histFields]uint32
	seq  int64
	at   int64
}

func (r *histRec) str(i int) string { return field(r.text, r.ends[:], i) }

func (r *histRec) deleted() bool { return r.seq == 0 }
