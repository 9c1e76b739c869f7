package notify_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/notify"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Canary secrets: they must never show in a message, an error, a stored
// delivery or a log line.
const (
	signingSecret = "whsec_Q0FOQVJZLXNpZ25pbmcta2V5LTdmM2E5YzE="
	slackCanary   = "T000CANARY/B000CANARY/slackcanary9f2c"
)

// backends runs fn against the memory store and Postgres; open returns
// another handle on the same store (a second replica: on Postgres, its own
// connection pool).
func backends(t *testing.T, fn func(t *testing.T, st store.Store, open func() store.Store)) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		st := memory.New()
		t.Cleanup(st.Close)
		fn(t, st, func() store.Store { return st })
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		url := pgtest.NewDatabase(t)
		open := func() store.Store {
			s, err := postgres.Open(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			return s
		}
		fn(t, open(), open)
	})
}

type mapSecrets map[string]string

func (m mapSecrets) Get(_ context.Context, connector, key string) (secrets.Secret, error) {
	v, ok := m[connector+"/"+key]
	if !ok {
		return secrets.Secret{}, secrets.Missing(connector, key)
	}
	return secrets.New(v), nil
}

// received is one request a receiver got.
type received struct {
	id, timestamp, signature string
	body                     []byte
	acked                    bool // answered 2xx
	verifyErr                error
}

// receiver is a webhook endpoint that verifies what it gets with the
// Standard Webhooks library, as a user's receiver would.
type receiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	got      []received
	failN    atomic.Int32 // answer 503 to this many requests first
	hangOnce atomic.Bool  // hold the first request until the sender gives up
	hung     chan struct{}
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{hung: make(chan struct{}, 1)}
	wh, err := standardwebhooks.NewWebhook(signingSecret)
	if err != nil {
		t.Fatal(err)
	}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := received{id: r.Header.Get("webhook-id"), timestamp: r.Header.Get("webhook-timestamp"),
			signature: r.Header.Get("webhook-signature"), body: body, verifyErr: wh.Verify(body, r.Header)}
		if rc.hangOnce.CompareAndSwap(true, false) {
			rc.hung <- struct{}{}
			<-r.Context().Done() // the sender stopped waiting
			rc.add(rec)
			return
		}
		if rc.failN.Add(-1) >= 0 {
			rc.add(rec)
			http.Error(w, "temporarily down", http.StatusServiceUnavailable)
			return
		}
		rec.acked = true
		rc.add(rec)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) add(r received) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.got = append(rc.got, r)
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

func (rc *receiver) acked() map[string]int {
	out := map[string]int{}
	for _, r := range rc.requests() {
		if r.acked {
			out[r.id]++
		}
	}
	return out
}

// slackReceiver stands for Slack: its URL path is the secret.
func slackReceiver(t *testing.T) (*httptest.Server, func() [][]byte) {
	var mu sync.Mutex
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/services/"+slackCanary {
			http.NotFound(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	return srv, func() [][]byte {
		mu.Lock()
		defer mu.Unlock()
		return append([][]byte(nil), bodies...)
	}
}

func testConfig(hookURL string) notify.Config {
	c := notify.DefaultConfig()
	c.Webhooks = []notify.WebhookConfig{{ID: "hooks", URL: hookURL, Secret: notify.SecretRef{Secret: "signing"}}}
	c.InitialBackoff, c.MaxBackoff = 20*time.Millisecond, 40*time.Millisecond
	c.Timeout, c.PollInterval = 300*time.Millisecond, 20*time.Millisecond
	return c
}

// counter counts attempts' results, as the metrics do.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) DeliveryFinished(endpoint, kind, result string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[endpoint+"/"+result]++
}

func (c *counter) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// logBuffer is a log sink safe for concurrent writers.
type logBuffer = testutil.Buffer

// start runs a dispatcher on st until the test ends (or stop is called).
func start(t *testing.T, st notify.Store, cfg notify.Config, sec secrets.Store) (obs *counter, logs *logBuffer, stop func()) {
	t.Helper()
	obs, logs = &counter{}, &logBuffer{}
	d, err := notify.New(notify.Options{
		Store: st, Secrets: sec, Config: cfg, Observer: obs,
		ApprovalURL: func(id string) string { return "https://console.example/approvals/" + id },
		Logger:      slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return obs, logs, stop
}

// park parks a call behind an approval, as the executor does: the claim
// writes the approval and its gate.required event (queued in the outbox)
// in one transaction.
func park(t *testing.T, st store.Store, key string) *store.Approval {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	c := &store.Call{ID: audit.NewID(), PrincipalID: "agent-1", IdempotencyKey: key, Fingerprint: "fp-" + key,
		Tool: "notes", Action: "write", ToolVersion: 1, State: store.CallAwaitingApproval, ApprovalID: audit.NewID(),
		Risk: toolkit.RiskHigh, Decision: store.DecisionConfirm, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
	a := &store.Approval{ID: c.ApprovalID, CallID: c.ID, Requester: "agent-1", Tool: "notes", Action: "write", ToolVersion: 1,
		Arguments: json.RawMessage(`{"path":"/x.md","content":"` + slackCanary + `"}`), Fingerprint: c.Fingerprint,
		IdempotencyKey: key, Risk: toolkit.RiskHigh, State: store.ApprovalPending, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	ev := audit.NewDetail(audit.GateRequired, store.AuditEvent{Time: now, CallID: c.ID, Principal: "agent-1", Tool: "notes",
		Action: "write", Risk: toolkit.RiskHigh, Decision: store.DecisionConfirm, Outcome: store.OutcomeApprovalRequired},
		map[string]any{"approval_id": a.ID, "expire_time": a.ExpiresAt, "autonomy": "SUPERVISED", "adjusters": []string{"big-write"}})
	if _, ok, err := st.ClaimCall(context.Background(), store.ClaimCallParams{Call: c, Approval: a, Events: []store.AuditEvent{ev}}); err != nil || !ok {
		t.Fatalf("ClaimCall: %v %v", ok, err)
	}
	return a
}

func deliveries(t *testing.T, st store.Store, p store.ListDeliveriesParams) []*store.Delivery {
	t.Helper()
	ds, err := st.ListDeliveries(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func noCanary(t *testing.T, what, text string) {
	t.Helper()
	for _, c := range []string{signingSecret, strings.TrimPrefix(signingSecret, "whsec_"), slackCanary} {
		if strings.Contains(text, c) {
			t.Fatalf("%s holds a secret: %s", what, text)
		}
	}
}

func TestSignedWebhookAndSlackMessage(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store, _ func() store.Store) {
		rc := newReceiver(t)
		slack, slackBodies := slackReceiver(t)
		cfg := testConfig(rc.srv.URL + "/hook")
		cfg.Slack = []notify.SlackConfig{{WebhookURL: notify.SecretRef{Secret: "slack-url"}, Events: []string{notify.EventPending}}}
		sec := mapSecrets{"notifications/signing": signingSecret, "notifications/slack-url": slack.URL + "/services/" + slackCanary}
		obs, logs, _ := start(t, st, cfg, sec)
		a := park(t, st, "k1")

		testutil.Eventually(t, 20*time.Second, "the webhook and the Slack message", func() bool { return len(rc.acked()) == 1 && len(slackBodies()) == 1 })
		got := rc.requests()
		if len(got) != 1 || got[0].verifyErr != nil {
			t.Fatalf("receiver got %+v; want one request its Standard Webhooks library verifies", got)
		}
		if !strings.HasPrefix(got[0].id, "msg_") || !strings.HasPrefix(got[0].signature, "v1,") {
			t.Fatalf("headers: id %q signature %q", got[0].id, got[0].signature)
		}
		var msg struct {
			Type      string         `json:"type"`
			Timestamp time.Time      `json:"timestamp"`
			Data      map[string]any `json:"data"`
		}
		if err := json.Unmarshal(got[0].body, &msg); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"approval_id": a.ID, "call_id": a.CallID, "state": "PENDING", "requester": "agent-1",
			"tool": "notes", "action": "write", "risk": "HIGH", "gate_decision": "CONFIRM",
			"url": "https://console.example/approvals/" + a.ID}
		for k, v := range want {
			if msg.Data[k] != v {
				t.Errorf("data.%s = %v, want %v", k, msg.Data[k], v)
			}
		}
		if msg.Type != notify.EventPending || msg.Timestamp.IsZero() {
			t.Errorf("type %q timestamp %v", msg.Type, msg.Timestamp)
		}
		if r, _ := msg.Data["reasons"].(map[string]any); r["autonomy"] != "SUPERVISED" || fmt.Sprint(r["adjusters"]) != "[big-write]" {
			t.Errorf("reasons = %v", msg.Data["reasons"])
		}
		if _, ok := msg.Data["arguments"]; ok {
			t.Error("a message carries the call's arguments")
		}
		sb := string(slackBodies()[0])
		if !strings.Contains(sb, `"blocks"`) || !strings.Contains(sb, "https://console.example/approvals/"+a.ID) || !strings.Contains(sb, "notes.write") {
			t.Errorf("Slack message = %s", sb)
		}
		testutil.Eventually(t, 20*time.Second, "both deliveries recorded", func() bool {
			ds := deliveries(t, st, store.ListDeliveriesParams{ApprovalID: a.ID})
			return len(ds) == 2 && ds[0].State == store.DeliveryDelivered && ds[1].State == store.DeliveryDelivered
		})
		for _, d := range deliveries(t, st, store.ListDeliveriesParams{}) {
			if d.Attempts != 1 || d.DeliveredAt.IsZero() {
				t.Errorf("delivery %+v", d)
			}
			noCanary(t, "a stored delivery", string(d.Payload)+d.LastError)
		}
		noCanary(t, "the webhook", string(got[0].body))
		noCanary(t, "the Slack message", sb)
		noCanary(t, "the log", logs.String())
		if obs.get("hooks/delivered") != 1 {
			t.Errorf("metrics: %v", obs.n)
		}
		// Only the webhook wants resolutions: one more message, to it.
		now := time.Now()
		ev := audit.NewDetail(audit.ApprovalResolved, store.AuditEvent{Time: now, CallID: a.CallID, Principal: "alice", Tool: "notes", Action: "write"},
			map[string]any{"approval_id": a.ID, "decision": "DENY", "comment": "no <b>way</b>", "requester": "agent-1"})
		if _, err := st.ResolveApproval(context.Background(), store.ResolveApprovalParams{ID: a.ID, State: store.ApprovalDenied, Resolver: "alice",
			Comment: "no <b>way</b>", Now: now, CallResult: &store.Result{Message: "denied"}, CallExpiresAt: now.Add(time.Hour), Events: []store.AuditEvent{ev}}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "the resolution", func() bool { return len(rc.acked()) == 2 })
		body := string(rc.requests()[1].body)
		for _, s := range []string{`"type":"approval.resolved"`, `"state":"DENIED"`, `"resolver":"alice"`, `"comment":"no \u003cb\u003eway\u003c/b\u003e"`, `"autonomy":"SUPERVISED"`} {
			if !strings.Contains(body, s) {
				t.Errorf("resolution message lacks %s: %s", s, body)
			}
		}
		if n := len(slackBodies()); n != 1 {
			t.Errorf("Slack got %d messages; it only wants approval.pending", n)
		}
	})
}

func TestRetriesUntilTheReceiverRecovers(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store, _ func() store.Store) {
		rc := newReceiver(t)
		rc.failN.Store(2)
		obs, _, _ := start(t, st, testConfig(rc.srv.URL), mapSecrets{"notifications/signing": signingSecret})
		a := park(t, st, "k1")
		testutil.Eventually(t, 20*time.Second, "delivery after two failures", func() bool { return len(rc.acked()) == 1 })
		got := rc.requests()
		if len(got) != 3 {
			t.Fatalf("receiver got %d requests, want 3", len(got))
		}
		for i, r := range got {
			if r.id != got[0].id || !bytes.Equal(r.body, got[0].body) || r.verifyErr != nil {
				t.Fatalf("attempt %d: id %s (first %s), verify %v: every attempt must be the same signed message", i, r.id, got[0].id, r.verifyErr)
			}
		}
		testutil.Eventually(t, 20*time.Second, "the delivery recorded", func() bool {
			ds := deliveries(t, st, store.ListDeliveriesParams{ApprovalID: a.ID})
			return len(ds) == 1 && ds[0].State == store.DeliveryDelivered
		})
		d := deliveries(t, st, store.ListDeliveriesParams{ApprovalID: a.ID})[0]
		if d.Attempts != 3 || d.LastStatus != http.StatusNoContent {
			t.Fatalf("delivery %+v, want 3 attempts ending in 204", d)
		}
		if obs.get("hooks/retry") != 2 || obs.get("hooks/delivered") != 1 {
			t.Fatalf("metrics %v", obs.n)
		}
	})
}

func TestDeadLetter(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store, _ func() store.Store) {
		rc := newReceiver(t)
		rc.failN.Store(1 << 30)
		cfg := testConfig(rc.srv.URL)
		cfg.MaxAttempts = 3
		obs, _, _ := start(t, st, cfg, mapSecrets{"notifications/signing": signingSecret})
		a := park(t, st, "k1")
		testutil.Eventually(t, 20*time.Second, "a dead letter", func() bool {
			n, _ := st.CountDeliveries(context.Background(), store.DeliveryDead)
			return n == 1
		})
		d := deliveries(t, st, store.ListDeliveriesParams{ApprovalID: a.ID})[0]
		if d.State != store.DeliveryDead || d.Attempts != 3 || !strings.HasPrefix(d.LastError, "HTTP 503") || d.LastStatus != 503 {
			t.Fatalf("dead letter %+v", d)
		}
		if obs.get("hooks/dead") != 1 || obs.get("hooks/retry") != 2 {
			t.Fatalf("metrics %v", obs.n)
		}
		n := len(rc.requests())
		time.Sleep(10 * cfg.PollInterval) // a dead letter is never sent again; nothing to wait for
		if len(rc.requests()) != n || n != 3 {
			t.Fatalf("receiver got %d requests, then %d; want 3 and no more", n, len(rc.requests()))
		}
	})
}

func TestMissingSecretIsRetriedThenDead(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store, _ func() store.Store) {
		rc := newReceiver(t)
		cfg := testConfig(rc.srv.URL)
		cfg.MaxAttempts = 2
		start(t, st, cfg, mapSecrets{})
		a := park(t, st, "k1")
		testutil.Eventually(t, 20*time.Second, "a dead letter", func() bool {
			ds := deliveries(t, st, store.ListDeliveriesParams{ApprovalID: a.ID})
			return len(ds) == 1 && ds[0].State == store.DeliveryDead
		})
		d := deliveries(t, st, store.ListDeliveriesParams{ApprovalID: a.ID})[0]
		if !strings.Contains(d.LastError, `secret "signing" is not set`) || len(rc.requests()) != 0 {
			t.Fatalf("delivery %+v, %d requests", d, len(rc.requests()))
		}
	})
}

func TestTwoReplicasDeliverEachOnce(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store, open func() store.Store) {
		rc := newReceiver(t)
		cfg := testConfig(rc.srv.URL)
		sec := mapSecrets{"notifications/signing": signingSecret}
		start(t, st, cfg, sec)
		start(t, open(), cfg, sec)
		const n = 30
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { park(t, st, fmt.Sprint("k", i)) })
		}
		wg.Wait()
		testutil.Eventually(t, 20*time.Second, "every notification", func() bool { return len(rc.acked()) == n })
		for id, times := range rc.acked() {
			if times != 1 {
				t.Errorf("message %s delivered %d times", id, times)
			}
		}
		if got := len(rc.requests()); got != n {
			t.Errorf("receiver got %d requests for %d messages", got, n)
		}
	})
}

// killable is a replica's store that stops answering once the replica is
// killed.
type killable struct {
	store.Store
	dead atomic.Bool
}

func (k *killable) check() error {
	if k.dead.Load() {
		return fmt.Errorf("killed: %w", store.ErrUnavailable)
	}
	return nil
}

func (k *killable) ClaimDeliveries(ctx context.Context, p store.ClaimDeliveriesParams) ([]*store.Delivery, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	return k.Store.ClaimDeliveries(ctx, p)
}

func (k *killable) FinishDelivery(ctx context.Context, p store.FinishDeliveryParams) (*store.Delivery, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	return k.Store.FinishDelivery(ctx, p)
}

func (k *killable) ListOutbox(ctx context.Context, limit int) ([]*store.AuditEvent, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	return k.Store.ListOutbox(ctx, limit)
}

// TestReplicaKilledMidDelivery: a replica dies while its request waits for
// the receiver's answer. Its lease lapses and the other replica delivers the
// same message (same webhook-id), which the receiver acknowledges once.
func TestReplicaKilledMidDelivery(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store, open func() store.Store) {
		rc := newReceiver(t)
		rc.hangOnce.Store(true)
		cfg := testConfig(rc.srv.URL)
		sec := mapSecrets{"notifications/signing": signingSecret}
		a := &killable{Store: st}
		_, _, stopA := start(t, a, cfg, sec)
		ap := park(t, st, "k1")
		select {
		case <-rc.hung:
		case <-time.After(20 * time.Second):
			t.Fatal("replica A never sent")
		}
		a.dead.Store(true) // A dies with the request in flight
		stopA()
		if ds := deliveries(t, st, store.ListDeliveriesParams{ApprovalID: ap.ID}); ds[0].State != store.DeliveryPending || ds[0].Attempts != 1 {
			t.Fatalf("after A died: %+v", ds[0])
		}
		start(t, open(), cfg, sec)
		testutil.Eventually(t, 20*time.Second, "B's delivery", func() bool { return len(rc.acked()) == 1 })
		got := rc.requests()
		if len(got) != 2 || got[0].id != got[1].id || got[0].acked || !got[1].acked {
			t.Fatalf("receiver got %+v; want A's abandoned request and B's acknowledged one, one message id", got)
		}
		testutil.Eventually(t, 20*time.Second, "the delivery recorded", func() bool {
			ds := deliveries(t, st, store.ListDeliveriesParams{ApprovalID: ap.ID})
			return ds[0].State == store.DeliveryDelivered && ds[0].Attempts == 2
		})
	})
}

func TestSignMatchesTheSpecification(t *testing.T) {
	key, err := notify.SigningKey("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	// The Standard Webhooks test vector.
	got := notify.Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	now := time.Unix(1614265330, 0)
	body := []byte(`{"test": 2432232314}`)
	for name, tc := range map[string]struct {
		id, ts, sig string
		body        []byte
		now         time.Time
		want        error
	}{
		"valid":           {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", got, body, now, nil},
		"among others":    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v1,bad= " + got, body, now, nil},
		"tampered body":   {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", got, []byte(`{"test": 1}`), now, notify.ErrNoSignature},
		"other id":        {"msg_other", "1614265330", got, body, now, notify.ErrNoSignature},
		"replayed later":  {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", got, body, now.Add(6 * time.Minute), notify.ErrReplayWindow},
		"from the future": {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", got, body, now.Add(-6 * time.Minute), notify.ErrReplayWindow},
		"no signature":    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "", body, now, notify.ErrMissingHeaders},
		"bad timestamp":   {"msg_p5jXN8AQM9LWM0D4loKWxJek", "soon", got, body, now, notify.ErrBadTimestamp},
	} {
		if err := notify.Verify(key, tc.id, tc.ts, tc.sig, tc.body, tc.now, 5*time.Minute); err != tc.want {
			t.Errorf("%s: Verify = %v, want %v", name, err, tc.want)
		}
	}
	if _, err := notify.SigningKey("not base64!"); err == nil {
		t.Error("SigningKey accepted a secret that is not base64")
	}
}

func TestConfigValidation(t *testing.T) {
	c := notify.DefaultConfig()
	c.MaxAttempts = 0
	c.Webhooks = []notify.WebhookConfig{
		{URL: "ftp://x", Secret: notify.SecretRef{Secret: "../k"}, Events: []string{"approval.pending", "nope"}},
		{URL: "https://a.example/h?x=1", Secret: notify.SecretRef{Secret: "k"}},
		{URL: "https://a.example/h?x=2", Secret: notify.SecretRef{Secret: "k"}},
	}
	c.Slack = []notify.SlackConfig{{}}
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted a bad configuration")
	}
	for _, want := range []string{"max_attempts", "webhooks[0].url", "webhooks[0].secret", "webhooks[0].events[1]", "webhooks[2].id", "slack[0].webhook_url"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("problems lack %s:\n%v", want, err)
		}
	}
	if err := notify.DefaultConfig().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestExpiredApprovalIsNotified(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store, _ func() store.Store) {
		rc := newReceiver(t)
		cfg := testConfig(rc.srv.URL)
		cfg.Webhooks[0].Events = []string{notify.EventExpired}
		start(t, st, cfg, mapSecrets{"notifications/signing": signingSecret})
		a := park(t, st, "k1")
		now := a.ExpiresAt.Add(time.Second)
		if _, err := st.ExpireApprovals(context.Background(), store.ExpireParams{Now: now, ExpiresAt: now.Add(time.Hour), Limit: 10,
			EventsFor: func(ap *store.Approval) []store.AuditEvent {
				return []store.AuditEvent{audit.NewDetail(audit.ApprovalExpired, store.AuditEvent{ID: "exp-" + ap.ID, Time: now, CallID: ap.CallID,
					Principal: ap.Requester, Tool: ap.Tool, Action: ap.Action}, map[string]any{"approval_id": ap.ID, "was": "PENDING"})}
			}}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "approval.expired", func() bool { return len(rc.acked()) == 1 })
		var msg notify.Message
		if err := json.Unmarshal(rc.requests()[0].body, &msg); err != nil {
			t.Fatal(err)
		}
		if msg.Type != notify.EventExpired || msg.Data.State != "EXPIRED" || msg.Data.ApprovalID != a.ID ||
			msg.Data.Requester != "agent-1" || !msg.Data.ExpireTime.Equal(a.ExpiresAt) || msg.Data.Reasons.Autonomy != "SUPERVISED" {
			t.Fatalf("message %+v", msg)
		}
		// Only approval.expired was wanted: the pending one made no delivery.
		if ds := deliveries(t, st, store.ListDeliveriesParams{}); len(ds) != 1 {
			t.Fatalf("%d deliveries, want 1", len(ds))
		}
	})
}
