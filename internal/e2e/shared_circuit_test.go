package e2e_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// TestOneCallerCannotOpenTheSharedCircuit: an HTTP tool whose upstream
// answers 500 for one agent's arguments (the tool may have acted: each
// call is UNKNOWN, a tool error) and 400 for malformed ones. However many
// times that agent fails, the tool keeps serving the others: the agent's
// own calls are refused for the cool-down (its circuit), the tool's shared
// status does not move, and a 400 (the caller's mistake) counts as no
// error at all. Errors of several principals still open the shared circuit
// for everyone.
func TestOneCallerCannotOpenTheSharedCircuit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		var hits atomic.Int64
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			hits.Add(1)
			w.Header().Set("Content-Type", "application/json")
			switch sku := strings.TrimPrefix(r.URL.Path, "/orders/"); {
			case strings.HasPrefix(sku, "poison"):
				w.WriteHeader(http.StatusInternalServerError)
				io.WriteString(w, `{"message": "cannot handle `+sku+`"}`)
			case sku == "malformed":
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, `{"message": "no such sku"}`)
			default:
				io.WriteString(w, `{"ordered": "`+sku+`"}`)
			}
		}))
		t.Cleanup(up.Close)
		e := newEnv(t, backend, nil)
		_, err := e.registry.RegisterTool(apptest.As(ctx, "ops"), &toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{
			Name: "orders", Description: "Orders things", Timeout: durationpb.New(5 * time.Second),
			Connector: &toolsvcv1.Connector{
				Type: toolsvcv1.ConnectorType_CONNECTOR_TYPE_HTTP, BaseUrl: up.URL,
				Actions: []*toolsvcv1.ConnectorAction{{Name: "order", Description: "Order one", Method: "POST",
					Path: "/orders/{sku}", Risk: toolsvcv1.RiskLevel_RISK_LEVEL_LOW}},
			},
		}})
		if err != nil {
			t.Fatal(err)
		}
		order := func(who, sku string) (*toolsvcv1.ExecuteToolResponse, error) {
			return e.call(ctx, who, req(t, "orders", "order", map[string]any{"sku": sku}, ""))
		}
		health := func() *toolsvcv1.ToolHealth {
			t.Helper()
			h, err := e.health.GetToolHealth(apptest.As(ctx, "ops"), &toolsvcv1.GetToolHealthRequest{Tool: "orders"})
			if err != nil {
				t.Fatal(err)
			}
			return h.Health
		}

		// The troublemaker's arguments fail, ten times over the threshold.
		for i := range 5 {
			resp, err := order("troublemaker", fmt.Sprint("poison-", i))
			if err != nil || resp.Outcome != unknown {
				t.Fatalf("call %d: %v %v", i, resp, err)
			}
		}
		if h := health(); h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY || h.ConsecutiveErrors != 5 {
			t.Fatalf("after one principal's 5 errors: %v", h)
		}
		// Its own calls are refused now, without reaching the upstream ...
		before := hits.Load()
		_, err = order("troublemaker", "poison-again")
		r := wantError(t, err, codes.Unavailable, "TOOL_UNAVAILABLE")
		if r.info.Metadata["scope"] != "principal" || r.retryDelay(t) <= 0 {
			t.Fatalf("the troublemaker's refusal: %v", r.info.Metadata)
		}
		if hits.Load() != before {
			t.Fatal("a refused call reached the upstream")
		}
		// ... while everyone else is served.
		for _, who := range []string{"agent-b", "agent-c"} {
			if resp, err := order(who, "good-"+who); err != nil || resp.Outcome != succeeded {
				t.Fatalf("%s among one principal's failures: %v %v", who, resp, err)
			}
		}
		if h := health(); h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY || h.ConsecutiveErrors != 0 {
			t.Fatalf("after others' successes: %v", h)
		}

		// A 400 is the caller's mistake: it never counts against the tool.
		for range 8 {
			if resp, err := order("clumsy", "malformed"); err != nil || resp.Outcome != failed {
				t.Fatalf("a 400: %v %v", resp, err)
			}
		}
		if h := health(); h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY || h.ConsecutiveErrors != 0 {
			t.Fatalf("after 8 answers of 400: %v", h)
		}
		if resp, err := order("clumsy", "good"); err != nil || resp.Outcome != succeeded {
			t.Fatalf("the clumsy caller after its 400s: %v %v", resp, err)
		}

		// Several principals failing in a row: evidence about the tool.
		for i := range 5 {
			if resp, err := order(fmt.Sprint("agent-x", i), fmt.Sprint("poison-x", i)); err != nil || resp.Outcome != unknown {
				t.Fatalf("x%d: %v %v", i, resp, err)
			}
		}
		if h := health(); h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE || h.CooldownEndTime == nil {
			t.Fatalf("after five principals' errors: %v", h)
		}
		_, err = order("agent-b", "good-again")
		if r := wantError(t, err, codes.Unavailable, "TOOL_UNAVAILABLE"); r.info.Metadata["scope"] == "principal" {
			t.Fatalf("the shared circuit's refusal says %v", r.info.Metadata)
		}
	})
}
