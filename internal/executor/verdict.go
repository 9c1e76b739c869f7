package executor

import (
	"context"

	"github.com/toolsvc/toolsvc/internal/store"
)

// A verdict is how the pipeline ends a request once the idempotency lookup
// (step 4) has been reached: every step from there returns one, and only
// conclude acts on it. That is what keeps the lookup's promise when a call
// that may run at once puts the lookup off until its claim (claimFirst): an
// exit that is not the claim — a refusal, a denial, invalid arguments, a
// park — is acted on only after conclude has read the key, so a stored
// answer under the key wins over the exit exactly as it would had the
// lookup come first. A new exit is a new verdict, and cannot skip the read.
type verdict struct {
	// readsKey: act reads the key itself, in the step that claims it
	// (ClaimCall answers the record holding the key), so conclude need not.
	readsKey bool
	act      func(ctx context.Context) (*Response, error)
}

// conclude ends the request with v, reading the key first unless v's act
// does (see verdict).
func (e *Executor) conclude(ctx context.Context, c *call, v verdict) (*Response, error) {
	if !v.readsKey {
		if resp, found, err := e.readDeferred(ctx, c); found {
			return resp, err
		}
		if resp, found, err := e.rereadParked(ctx, c); found {
			return resp, err
		}
	}
	return v.act(ctx)
}

// rereadParked reads again the parked call this request resumed (approved,
// or its preview presented) before the request ends otherwise than by
// running it — a refusal, a denial — because a concurrent retry may have
// run it meanwhile: then the call is answered as it now stands, so that
// the answer agrees with the record under the call's id. found reports
// that it moved and (resp, err) is the answer.
func (e *Executor) rereadParked(ctx context.Context, c *call) (resp *Response, found bool, err error) {
	if c.parked == nil {
		return nil, false, nil
	}
	cur, err := e.st.GetCall(ctx, c.parked.ID)
	if err != nil || (cur.State == c.parked.State && cur.AttemptCount == c.parked.AttemptCount) {
		// Still as resumed (or unreadable: the verdict stands, and says so).
		return nil, false, nil
	}
	c.unevaluate()
	c.parked, c.approval, c.preview = nil, nil, nil
	resp, err = e.resumeHeld(ctx, c, cur)
	return resp, true, err
}

// refusal answers err, with its tool_call.rejected event.
func (e *Executor) refusal(c *call, err error) verdict {
	return verdict{act: func(ctx context.Context) (*Response, error) {
		return nil, e.reject(ctx, c, err)
	}}
}

// failure answers a store error (storeErr: audited when the caller went
// away or ran out of time, else STORE_UNAVAILABLE).
func (e *Executor) failure(c *call, err error) verdict {
	return verdict{act: func(ctx context.Context) (*Response, error) {
		return nil, e.storeErr(ctx, c, err)
	}}
}

// ruling answers a decision the model must see — invalid arguments, a
// policy's or the gate's denial — as outcome o with msg, after its event
// of type typ. Nothing is stored: a retry is judged again.
func (e *Executor) ruling(c *call, typ string, o store.Outcome, detail map[string]any, msg string) verdict {
	return verdict{act: func(ctx context.Context) (*Response, error) {
		if err := e.appendEvents(ctx, e.event(c, typ, o, detail)); err != nil {
			return nil, err
		}
		return e.answer(c, o, &store.Result{Success: false, Message: msg}), nil
	}}
}

// parking parks the call behind an approval or a preview with park. A park
// claims the key too, but reads it first: a retry of a parked call is
// answered from its record, not parked again (and a preview asks the tool).
func parking(park func(ctx context.Context) (*Response, error)) verdict {
	return verdict{act: park}
}

// going runs act, a call already holding its key (a parked call that may go
// on): there is no lookup left to make.
func going(act func(ctx context.Context) (*Response, error)) verdict {
	return verdict{readsKey: true, act: act}
}

// reservation is the verdict of a call that may run: claim its key (step
// 10) and run it. The claim reads the key in the same step, so conclude
// need not — unless the caller is gone (the read then refuses as it did
// before the gate, and nothing is reserved) or admitting the call may take
// the half-open circuit's one probe, which a retry of a finished call must
// not take.
func (e *Executor) reservation(ctx context.Context, c *call) verdict {
	h, ok := e.health.Get(c.tool.Name)
	readFirst := ctx.Err() != nil || (ok && h.Status == store.HealthUnavailable)
	return verdict{readsKey: !readFirst, act: func(ctx context.Context) (*Response, error) {
		return e.run(ctx, c)
	}}
}
