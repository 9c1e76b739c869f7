package executor

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Recording an outcome retries while the store cannot be reached, with a
// backoff between these bounds; each attempt is bounded by writeTimeout.
const (
	minRetry = 50 * time.Millisecond
	maxRetry = 500 * time.Millisecond
)

// maxInvalidRecords bounds the attempts at recording an outcome the store
// refuses as invalid (rather than unreachable) before a fallback is stored.
const maxInvalidRecords = 3

// recorded is what persist answers: the response, or the error to answer
// instead.
type recorded struct {
	resp *Response
	err  error
}

// persist records a finished call and says what to answer. It retries
// while the store cannot be reached, until the outcome is stored or the
// executor closes, so that the answer is never an outcome the store does not
// hold:
//   - stored: the tool's outcome;
//   - the store says the call is no longer this attempt's to finish: it reads
//     the record back; if this outcome is there (an earlier attempt committed
//     but its answer was lost) it is answered, otherwise what is stored is
//     (an operator resolved the call meanwhile);
//   - the store refuses the outcome itself as invalid: a fallback without
//     the tool's result text and value is stored and answered;
//   - the executor closed first: an error; the lease lapses and the reaper
//     records UNKNOWN (the tool did run).
func (e *Executor) persist(base context.Context, c *call, rec *store.Call, o finished) recorded {
	invalid := 0
	for wait := minRetry; ; wait = min(2*wait, maxRetry) {
		ctx, cancel := e.lifeContext(base)
		err := o.write(ctx, e.st)
		cancel()
		switch {
		case err == nil:
			o.commit()
			return recorded{resp: o.resp, err: o.answer}
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			r, err := e.readBack(base, rec, o)
			if err == nil {
				return r
			}
			e.log.Warn("could not read back a call whose outcome could not be recorded; retrying", "call_id", rec.ID, "err", err)
		case errors.Is(err, store.ErrUnavailable):
			e.log.Warn("could not record a call's outcome; retrying", "call_id", rec.ID, "state", o.state(),
				"retry_in", wait.String(), "err", err)
		default:
			invalid++
			e.log.Error("the store refused a call's outcome", "call_id", rec.ID, "state", o.state(), "err", err)
			if invalid >= maxInvalidRecords {
				o = fallback(o)
			}
		}
		select {
		case <-e.life.Done():
			e.log.Error("the server stopped before a call's outcome could be recorded; the reaper will record it UNKNOWN",
				"call_id", rec.ID, "state", o.state())
			return recorded{err: fault.StoreUnavailable(errors.New("the outcome could not be recorded before shutdown"))}
		case <-time.After(wait):
		}
	}
}

// readBack decides, from the stored record, what a FinishCall that found
// the call in another state means.
func (e *Executor) readBack(base context.Context, rec *store.Call, o finished) (recorded, error) {
	ctx, cancel := e.lifeContext(base)
	defer cancel()
	cur, err := e.st.GetCall(ctx, rec.ID)
	if errors.Is(err, store.ErrNotFound) {
		return recorded{err: fault.InternalError("the call's record disappeared before its outcome was recorded")}, nil
	}
	if err != nil {
		return recorded{}, err
	}
	if o.landed(cur) {
		o.commit()
		return recorded{resp: o.resp, err: o.answer}, nil
	}
	e.log.Warn("a call was settled by someone else before its outcome was recorded; answering what is stored",
		"call_id", rec.ID, "state", cur.State, "attempt", cur.AttemptCount, "resolved_by", cur.ResolvedBy)
	if !cur.State.Final() {
		return recorded{err: fault.CallInProgress(cur.IdempotencyKey, cur.ID, inProgressRetry)}, nil
	}
	return recorded{resp: &Response{
		CallID: cur.ID, IdempotencyKey: cur.IdempotencyKey, Outcome: cur.State.Outcome(),
		Result: cur.Result, Risk: cur.Risk, Decision: cur.Decision, Attempt: cur.AttemptCount,
	}}, nil
}

// landed reports whether cur holds what p recorded: the same attempt in the
// same state, not settled by hand — or, for a release, a later attempt (the
// release landed and the key was claimed again).
func landed(cur *store.Call, p store.FinishCallParams) bool {
	if cur.AttemptCount == p.Attempt && cur.State == p.State && cur.ResolvedBy == "" {
		return true
	}
	return p.State == store.CallReleased && cur.AttemptCount > p.Attempt
}

// state is the state o records, for logs.
func (o finished) state() store.CallState {
	switch {
	case o.park != nil && o.park.PreviewToken != "":
		return store.CallAwaitingPreview
	case o.park != nil:
		return store.CallAwaitingApproval
	}
	return o.params.State
}

// fallback replaces an outcome the store refuses with one it can hold: the
// same state, without the tool's text and value.
func fallback(o finished) finished {
	r := &store.Result{Message: "the tool's result could not be stored"}
	events := func(evs []store.AuditEvent) []store.AuditEvent {
		out := make([]store.AuditEvent, len(evs))
		for i, ev := range evs {
			ev.Detail = audit.EncodeDetail(map[string]any{"message": r.Message, "fallback": true}, audit.DefaultDetailMaxBytes)
			out[i] = ev
		}
		return out
	}
	if o.park != nil {
		pp := *o.park
		pp.Result, pp.Events = r, events(pp.Events)
		o.park = &pp
	} else {
		p := o.params
		if p.Result != nil {
			r.Success = p.Result.Success
		}
		p.Result, p.History, p.Events = r, nil, events(p.Events)
		o.params = p
	}
	if o.resp != nil {
		resp := *o.resp
		resp.Result = r
		o.resp = &resp
	}
	return o
}

// retryStore runs op until it succeeds, fails with anything but
// store.ErrUnavailable, or the executor closes.
func (e *Executor) retryStore(op func(context.Context) error) error {
	for wait := minRetry; ; wait = min(2*wait, maxRetry) {
		ctx, cancel := context.WithTimeout(e.life, writeTimeout)
		err := op(ctx)
		cancel()
		if err == nil || !errors.Is(err, store.ErrUnavailable) {
			return err
		}
		select {
		case <-e.life.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// background runs fn as work Wait waits for.
func (e *Executor) background(fn func()) {
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		fn()
	}()
}

// newClaimToken returns an unguessable reservation token.
func newClaimToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error
	return base64.RawURLEncoding.EncodeToString(b)
}
