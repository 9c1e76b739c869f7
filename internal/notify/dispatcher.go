// Package notify tells people about approvals: for every approval asked for,
// resolved or expired it sends signed webhooks (Standard Webhooks) and Slack
// messages to the configured endpoints, durably — the store queues each
// notification in the transaction of its change (store.OutboxStore), every
// replica runs a Dispatcher, and each delivery is sent by one replica at a
// time under a lease, retried with exponential backoff, and kept as a dead
// letter once its attempts are spent. docs/notifications.md describes the
// messages and how a receiver verifies them.
package notify

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Store is what a Dispatcher needs of the store.
type Store interface {
	store.OutboxStore
	GetApproval(ctx context.Context, id string) (*store.Approval, error)
	ListAuditEvents(ctx context.Context, f store.AuditFilter) ([]*store.AuditEvent, error)
	Subscribe(ctx context.Context) (<-chan store.Notification, error)
}

// Observer is told what became of each attempt (metrics).
type Observer interface {
	// DeliveryFinished reports an attempt's result: "delivered", "retry"
	// or "dead".
	DeliveryFinished(endpoint, kind, result string)
}

// Options configure a Dispatcher.
type Options struct {
	Store   Store
	Secrets secrets.Store
	Config  Config
	// ApprovalURL returns the absolute URL of an approval's page on the
	// console; nil (or "") leaves messages without a link.
	ApprovalURL func(id string) string
	// Transport sends the requests; nil means http.DefaultTransport.
	Transport http.RoundTripper
	Now       func() time.Time
	Logger    *slog.Logger
	Observer  Observer
}

// Dispatcher sends the notifications of one replica.
type Dispatcher struct {
	st        Store
	secrets   secrets.Store
	cfg       Config
	endpoints map[string]Endpoint
	ids       []string
	link      func(string) string
	client    *http.Client
	now       func() time.Time
	log       *slog.Logger
	obs       Observer

	// slots bounds the attempts in flight.
	slots chan struct{}
	wg    sync.WaitGroup
}

// concurrency bounds the attempts a replica has in flight.
const concurrency = 8

// expandBatch is how many outbox events one expansion takes.
const expandBatch = 100

// New returns a Dispatcher for a validated configuration.
func New(o Options) (*Dispatcher, error) {
	if o.Store == nil {
		return nil, errors.New("notify: a store is required")
	}
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	d := &Dispatcher{
		st: o.Store, secrets: o.Secrets, cfg: o.Config, endpoints: map[string]Endpoint{}, link: o.ApprovalURL,
		now: o.Now, log: o.Logger, obs: o.Observer, slots: make(chan struct{}, concurrency),
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	tr := o.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	// Redirects are not followed: an endpoint is a URL the operator chose.
	d.client = &http.Client{Transport: tr, Timeout: o.Config.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, e := range o.Config.Endpoints() {
		d.endpoints[e.ID] = e
		d.ids = append(d.ids, e.ID)
	}
	return d, nil
}

// lease is how long an attempt holds its delivery: longer than an attempt
// may take, so that only a replica that stopped loses it.
func (d *Dispatcher) lease() time.Duration { return 2*d.cfg.Timeout + time.Second }

// Run sends notifications until ctx ends, then waits for the attempts in
// flight (each bounded by the timeout). New notifications are sent as soon
// as the change that made them commits (the store's approval
// notifications wake it, from every replica); due retries are found every
// poll interval.
func (d *Dispatcher) Run(ctx context.Context) {
	defer d.wg.Wait()
	wake, err := d.st.Subscribe(ctx)
	if err != nil {
		d.log.Warn("notifications: no change notifications; polling only", "error", err.Error())
	}
	tick := time.NewTicker(d.pollInterval())
	defer tick.Stop()
	lastSweep := time.Time{}
	for {
		d.Round(ctx)
		if now := d.now(); now.Sub(lastSweep) > time.Hour {
			lastSweep = now
			d.sweep(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case n, ok := <-wake:
			if !ok {
				wake = nil
				continue
			}
			if n.Topic != store.TopicApprovals {
				continue
			}
		}
	}
}

// idlePoll is how often a dispatcher with no endpoints looks at the outbox
// on its own: it has no retries to find, only notifications nobody is to be
// sent, which the approval notifications already wake it for; the poll
// only drains what a missed notification left behind.
const idlePoll = time.Minute

// pollInterval is how often Run looks for due work without being woken.
func (d *Dispatcher) pollInterval() time.Duration {
	if len(d.ids) == 0 {
		return max(d.cfg.PollInterval, idlePoll)
	}
	return d.cfg.PollInterval
}

// Round expands the outbox and starts the attempts that are due (up to the
// free slots). It does not wait for the attempts.
func (d *Dispatcher) Round(ctx context.Context) {
	if err := d.expand(ctx); err != nil && ctx.Err() == nil {
		d.log.Warn("notifications: could not read the outbox", "error", err.Error())
	}
	if len(d.ids) == 0 {
		return
	}
	free := cap(d.slots) - len(d.slots)
	if free == 0 {
		return
	}
	claimed, err := d.st.ClaimDeliveries(ctx, store.ClaimDeliveriesParams{
		Endpoints: d.ids, Now: d.now(), Lease: d.lease(), Limit: free, ClaimToken: newToken(),
	})
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("notifications: could not claim deliveries", "error", err.Error())
		}
		return
	}
	for _, dl := range claimed {
		d.slots <- struct{}{}
		d.wg.Add(1)
		go func() {
			defer func() { <-d.slots; d.wg.Done() }()
			d.attempt(context.WithoutCancel(ctx), dl)
		}()
	}
}

// Wait waits for the attempts in flight.
func (d *Dispatcher) Wait() { d.wg.Wait() }

// expand turns queued outbox events into deliveries, one per endpoint that
// wants the event's type (none: the event just leaves the outbox).
func (d *Dispatcher) expand(ctx context.Context) error {
	for {
		events, err := d.st.ListOutbox(ctx, expandBatch)
		if err != nil || len(events) == 0 {
			return err
		}
		var xs []store.OutboxExpansion
		for _, ev := range events {
			x, err := d.deliveriesOf(ctx, ev)
			if err != nil {
				return err
			}
			xs = append(xs, x)
		}
		if _, err := d.st.ExpandOutbox(ctx, store.ExpandOutboxParams{Expansions: xs, Now: d.now()}); err != nil {
			return err
		}
		if len(events) < expandBatch {
			return nil
		}
	}
}

// deliveriesOf makes an outbox event's deliveries: one message per
// endpoint, its body fixed now and the same on every attempt.
func (d *Dispatcher) deliveriesOf(ctx context.Context, ev *store.AuditEvent) (store.OutboxExpansion, error) {
	x := store.OutboxExpansion{EventID: ev.ID}
	typ := typeOf(ev.Type)
	var wanted []Endpoint
	for _, id := range d.ids {
		if e := d.endpoints[id]; e.Wants(typ) {
			wanted = append(wanted, e)
		}
	}
	if typ == "" || len(wanted) == 0 {
		return x, nil
	}
	detail := ev.DetailMap()
	approvalID, _ := detail["approval_id"].(string)
	var ap *store.Approval
	if approvalID != "" {
		a, err := d.st.GetApproval(ctx, approvalID)
		switch {
		case err == nil:
			ap = a
		case !errors.Is(err, store.ErrNotFound):
			return x, err
		}
	}
	reasons := ReasonsOf(detail)
	if typ != EventPending && ev.CallID != "" {
		// The reasons were given when the approval was asked for.
		if asked, err := d.st.ListAuditEvents(ctx, store.AuditFilter{CallID: ev.CallID, Types: []string{"gate.required"}}); err == nil {
			for _, a := range asked {
				if m := a.DetailMap(); m != nil && m["approval_id"] == approvalID {
					reasons = ReasonsOf(m)
				}
			}
		}
	}
	link := ""
	if d.link != nil && approvalID != "" {
		link = d.link(approvalID)
	}
	data := buildData(ev, ap, reasons, link)
	hook, err := webhookBody(typ, ev.Time, data)
	if err != nil {
		return x, err
	}
	slack, err := slackBody(typ, data)
	if err != nil {
		return x, err
	}
	for _, e := range wanted {
		body := hook
		if e.Kind == KindSlack {
			body = slack
		}
		x.Deliveries = append(x.Deliveries, &store.Delivery{
			ID: "msg_" + audit.NewID(), EventID: ev.ID, EventType: typ, ApprovalID: data.ApprovalID,
			Endpoint: e.ID, Payload: body, State: store.DeliveryPending, NextAttemptAt: d.now(),
		})
	}
	return x, nil
}

// attempt sends a claimed delivery once and records what became of it.
func (d *Dispatcher) attempt(ctx context.Context, dl *store.Delivery) {
	e := d.endpoints[dl.Endpoint]
	var (
		status int
		err    error
	)
	if dl.Attempts > d.cfg.MaxAttempts {
		// The last attempt was begun by a replica that stopped before it
		// recorded the answer.
		err = errors.New("the last attempt's answer is unknown: the replica sending it stopped")
		d.finish(ctx, dl, e, 0, err, true)
		return
	}
	status, err = d.send(ctx, dl, e)
	d.finish(ctx, dl, e, status, err, dl.Attempts >= d.cfg.MaxAttempts)
}

// finish records an attempt: delivered, a retry after the backoff, or a
// dead letter.
func (d *Dispatcher) finish(ctx context.Context, dl *store.Delivery, e Endpoint, status int, sendErr error, last bool) {
	p := store.FinishDeliveryParams{ID: dl.ID, ClaimToken: dl.ClaimToken, LastStatus: status, Now: d.now()}
	result := "delivered"
	switch {
	case sendErr == nil:
		p.State = store.DeliveryDelivered
	case last:
		p.State, p.LastError, result = store.DeliveryDead, sendErr.Error(), "dead"
	default:
		p.State, p.LastError, result = store.DeliveryPending, sendErr.Error(), "retry"
		p.NextAttemptAt = p.Now.Add(d.backoff(dl.Attempts))
	}
	fctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	if _, err := d.st.FinishDelivery(fctx, p); err != nil {
		// The lease was lost (or the store is down): another attempt
		// holds the delivery, or this one is retried once the lease lapses.
		d.log.Warn("notifications: could not record an attempt", "delivery", dl.ID, "endpoint", e.ID, "error", err.Error())
		return
	}
	switch result {
	case "dead":
		d.log.Warn("notification dead-lettered", "delivery", dl.ID, "endpoint", e.ID, "type", dl.EventType,
			"approval_id", dl.ApprovalID, "attempts", dl.Attempts, "error", p.LastError)
	case "retry":
		d.log.Info("notification attempt failed; will retry", "delivery", dl.ID, "endpoint", e.ID,
			"attempt", dl.Attempts, "next_attempt", p.NextAttemptAt, "error", p.LastError)
	}
	if d.obs != nil {
		d.obs.DeliveryFinished(e.ID, e.Kind, result)
	}
}

// backoff is the wait after attempt n (1-based) failed: the initial backoff
// doubled n-1 times, at most the maximum, less up to a fifth at random so
// that replicas do not retry in step.
func (d *Dispatcher) backoff(n int) time.Duration {
	b := d.cfg.InitialBackoff
	for i := 1; i < n && b < d.cfg.MaxBackoff; i++ {
		b *= 2
	}
	b = min(b, d.cfg.MaxBackoff)
	return b - time.Duration(mrand.Int64N(int64(b)/5+1)) //nolint:gosec // G404: jitter, not a secret
}

// maxErrorBody bounds the part of an endpoint's answer kept in an error.
const maxErrorBody = 200

// send makes one attempt: it fetches the endpoint's secret, signs (for a
// webhook) and posts. The secret never reaches an error: a url.Error's URL
// is dropped, and what is left is scrubbed of it.
func (d *Dispatcher) send(ctx context.Context, dl *store.Delivery, e Endpoint) (int, error) {
	if d.secrets == nil {
		return 0, secrets.Missing(SecretID, e.Secret)
	}
	secret, err := d.secrets.Get(ctx, SecretID, e.Secret)
	if err != nil {
		return 0, err
	}
	scrub := secrets.NewScrubber()
	scrub.Add(secret)
	target := e.URL
	if e.Kind == KindSlack {
		target = secret.Reveal()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(dl.Payload))
	if err != nil {
		return 0, scrub.Error(fmt.Errorf("%s: the URL is not valid", e.Kind))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "toolsvc-notifications")
	if e.Kind == KindWebhook {
		key, err := SigningKey(secret.Reveal())
		if err != nil {
			return 0, fmt.Errorf("secret %q: %w", e.Secret, err)
		}
		now := d.now()
		req.Header.Set(HeaderID, dl.ID)
		req.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
		req.Header.Set(HeaderSignature, Sign(key, dl.ID, now, dl.Payload))
	}
	resp, err := d.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, scrub.Error(fmt.Errorf("send: %w", err))
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp.StatusCode, nil
	}
	msg := fmt.Sprintf("HTTP %d", resp.StatusCode)
	if s := safetext.Bound(string(snippet), maxErrorBody); s != "" {
		msg += ": " + s
	}
	return resp.StatusCode, errors.New(scrub.Scrub(msg))
}

// sweep deletes deliveries finished longer than the retention ago.
func (d *Dispatcher) sweep(ctx context.Context) {
	if _, err := d.st.DeleteFinishedDeliveries(ctx, d.now().Add(-d.cfg.Retention), 10_000); err != nil && ctx.Err() == nil {
		d.log.Warn("notifications: could not delete old deliveries", "error", err.Error())
	}
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
