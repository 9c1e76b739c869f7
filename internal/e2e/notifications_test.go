package e2e_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/notify"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/toolkit"
)

// canarySigningKey signs the test's webhooks: it must never show in a
// message, a page or an answer.
const canarySigningKey = "whsec_Y2FuYXJ5LXNpZ25pbmcta2V5LWU5YjQzZjA4"

type hookReceiver struct {
	srv  *httptest.Server
	mu   sync.Mutex
	msgs []map[string]any
	bad  []error
}

func newHookReceiver(t *testing.T) *hookReceiver {
	wh, err := standardwebhooks.NewWebhook(canarySigningKey)
	if err != nil {
		t.Fatal(err)
	}
	h := &hookReceiver{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if err := wh.Verify(body, r.Header); err != nil {
			h.bad = append(h.bad, err)
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var m map[string]any
		_ = json.Unmarshal(body, &m)
		m["raw"] = string(body)
		h.msgs = append(h.msgs, m)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookReceiver) got() []map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]map[string]any(nil), h.msgs...)
}

// closedURL is an http URL where nothing listens.
func closedURL(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return "http://" + addr + "/gone"
}

func TestNotificationsEndToEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		hooks := newHookReceiver(t)
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, notify.SecretID), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, notify.SecretID, "signing"), []byte(canarySigningKey), 0o600); err != nil {
			t.Fatal(err)
		}
		e := consoleEnv(t, backend, func(c *config.Config) {
			c.Secrets.Dir = dir
			c.Metrics.Listen = "127.0.0.1:0"
			c.Notifications.PollInterval = 20 * time.Millisecond
			c.Notifications.InitialBackoff, c.Notifications.MaxBackoff = 10*time.Millisecond, 20*time.Millisecond
			c.Notifications.MaxAttempts = 2
			c.Notifications.Webhooks = []notify.WebhookConfig{
				{ID: "receiver", URL: hooks.srv.URL + "/toolsvc", Secret: notify.SecretRef{Secret: "signing"}},
				{ID: "gone", URL: closedURL(t), Secret: notify.SecretRef{Secret: "signing"}, Events: []string{notify.EventPending}},
			}
		})
		base := "https://" + e.app.ConsoleAddr().String()
		parked := e.parkAs(t, agentA, "n1", "write it")
		id := parked.GetApproval().GetApprovalId()

		testutil.Eventually(t, 15*time.Second, "approval.pending at the receiver", func() bool { return len(hooks.got()) == 1 })
		msg := hooks.got()[0]
		data, _ := msg["data"].(map[string]any)
		if msg["type"] != "approval.pending" || data["approval_id"] != id || data["requester"] != agentA ||
			data["url"] != base+"/approvals/"+id || data["tool"] != riskToolName(toolkit.RiskHigh, false) {
			t.Fatalf("message %v", msg)
		}
		// The link opens the page, once signed in; it decides nothing.
		b := newBrowser(t, e, nil)
		if a := b.get(strings.TrimPrefix(data["url"].(string), base)); a.status != http.StatusSeeOther {
			t.Fatalf("the link, signed out: %d", a.status)
		}
		if e.approvalState(t, id) != "PENDING" {
			t.Fatal("opening the link changed the approval")
		}
		b.signIn(e.tokens[approver])
		if a := b.post("/approvals/"+id+"/resolve", url.Values{"decision": {"approve"}, "comment": {"ship it"}, "csrf": {b.csrf("/approvals/" + id)}}); a.status != http.StatusSeeOther {
			t.Fatalf("approve: %d", a.status)
		}
		testutil.Eventually(t, 15*time.Second, "approval.resolved at the receiver", func() bool { return len(hooks.got()) == 2 })
		res, _ := hooks.got()[1]["data"].(map[string]any)
		if hooks.got()[1]["type"] != "approval.resolved" || res["state"] != "APPROVED" || res["resolver"] != approver || res["comment"] != "ship it" {
			t.Fatalf("resolution %v", hooks.got()[1])
		}
		// The agent's retry runs the call.
		resp, err := clientsOf(e.dial(t, nil)).exec.ExecuteTool(e.as(testCtx(t), agentA),
			req(t, riskToolName(toolkit.RiskHigh, false), "act", map[string]any{"note": "write it"}, "n1"))
		if err != nil || resp.Outcome != succeeded {
			t.Fatalf("retry: %v %v", resp, err)
		}

		// The endpoint that is gone ends as a dead letter: on the API, the
		// console and the metrics.
		ctx := testCtx(t)
		svc := toolsvcv1.NewNotificationServiceClient(e.dial(t, nil))
		var dead []*toolsvcv1.Delivery
		testutil.Eventually(t, 15*time.Second, "a dead letter", func() bool {
			r, err := svc.ListDeliveries(e.as(ctx, operator), &toolsvcv1.ListDeliveriesRequest{State: toolsvcv1.DeliveryState_DELIVERY_STATE_DEAD})
			if err != nil {
				t.Fatal(err)
			}
			dead = r.GetDeliveries()
			return len(dead) == 1
		})
		if d := dead[0]; d.GetEndpoint() != "gone" || d.GetAttempts() != 2 || d.GetApprovalId() != id || !strings.Contains(d.GetLastError(), "connection refused") {
			t.Fatalf("dead letter %v", d)
		}
		all, err := svc.ListDeliveries(e.as(ctx, approver), &toolsvcv1.ListDeliveriesRequest{ApprovalId: id, Endpoint: "receiver"})
		if err != nil || len(all.GetDeliveries()) != 2 || all.GetDeliveries()[0].GetState() != toolsvcv1.DeliveryState_DELIVERY_STATE_DELIVERED {
			t.Fatalf("receiver's deliveries: %v %v", all, err)
		}
		_, err = svc.ListDeliveries(e.as(ctx, agentA), &toolsvcv1.ListDeliveriesRequest{})
		wantError(t, err, codes.PermissionDenied, "ROLE_REQUIRED")

		page := b.get("/notifications?state=dead")
		if page.status != http.StatusOK || !strings.Contains(page.body, `<strong id="dead-count">1</strong>`) || !strings.Contains(page.body, dead[0].GetDeliveryId()) {
			t.Fatalf("notifications page:\n%s", page.body)
		}
		metrics := scrape(t, e.app.MetricsAddr())
		for _, want := range []string{`(?m)^toolsvc_notifications_dead_letters(\{[^}]*\})? 1$`,
			`(?m)^toolsvc_notifications_deliveries_total\{[^}]*toolsvc_notification_endpoint="gone"[^}]*toolsvc_notification_result="dead"[^}]*\} 1$`} {
			if !regexp.MustCompile(want).MatchString(metrics) {
				t.Errorf("metrics lack %s:\n%s", want, metrics)
			}
		}

		// The signing key is nowhere to be seen.
		key := strings.TrimPrefix(canarySigningKey, "whsec_")
		for what, text := range map[string]string{
			"the pending message": hooks.got()[0]["raw"].(string), "the resolution": hooks.got()[1]["raw"].(string),
			"the approval page": b.get("/approvals/" + id).body, "the notifications page": b.get("/notifications").body,
			"the metrics": metrics, "the log": e.logs.String(), "the dead letter": dead[0].String(),
		} {
			if strings.Contains(text, key) {
				t.Errorf("%s holds the signing key", what)
			}
		}
		if len(hooks.bad) > 0 {
			t.Errorf("the receiver refused signatures: %v", hooks.bad)
		}
	})
}

func scrape(t *testing.T, addr net.Addr) string {
	t.Helper()
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
