package replicas_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// exportAll asks for every format, plain and strict, and returns the bytes
// by format.
func exportAll(ctx context.Context, t *testing.T, conn *grpc.ClientConn) map[string]string {
	t.Helper()
	reg := toolsvcv1.NewRegistryServiceClient(conn)
	out := map[string]string{}
	for f := range toolsvcv1.ExportFormat_name {
		format := toolsvcv1.ExportFormat(f)
		if format == toolsvcv1.ExportFormat_EXPORT_FORMAT_UNSPECIFIED {
			continue
		}
		for _, strict := range []bool{false, true} {
			resp, err := reg.ExportTools(apptest.As(ctx, agent), &toolsvcv1.ExportToolsRequest{Format: format, Strict: strict})
			if err != nil {
				t.Fatalf("%s: %v", format, err)
			}
			out[format.String()+map[bool]string{true: " strict"}[strict]] = resp.GetToolsJson() + "\n" + resp.GetGuidanceMarkdown()
		}
	}
	return out
}

func sameExports(t *testing.T, what string, a, b map[string]string) {
	t.Helper()
	for k, v := range a {
		if b[k] != v {
			t.Fatalf("%s: %s differs:\n%.400s\n%.400s", what, k, v, b[k])
		}
	}
}

// Two replicas on one database export the same bytes, follow each other's
// changes of tools and toolsets, and a replica started later (a restart)
// exports the same bytes again.
func TestExportsByteStableAcrossReplicasAndRestart(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	rs := startReplicas(t, 2, cfg, app.Options{}, nil)
	r1, r2 := rs[0], rs[1]
	op := apptest.As(ctx, "ops")
	// A tool whose schema has keys out of order, escapes and non-ASCII text,
	// registered as text on replica 1, with guidance; and a toolset.
	if _, err := r1.reg.RegisterTool(op, &toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{
		Name: "weather", Description: "Weather for a city", ConnectorId: "weather-mcp",
		ProviderType: toolsvcv1.ProviderType_PROVIDER_TYPE_MCP, DefaultRisk: toolsvcv1.RiskLevel_RISK_LEVEL_LOW,
		Guidance: "Say which city — always.",
		Actions: []*toolsvcv1.Action{{Name: "current", Description: "Weather now",
			InputSchemaJson: `{"type":"object","required":["city"],"properties":{"units":{"enum":["metric","imperial"]},"city":{"type":"string","description":"caf\u00e9 <b> \"quoted\"","minLength":1}}}`,
			Examples:        []*toolsvcv1.ActionExample{{Description: "Paris", InputJson: `{"city":"Paris"}`}}}},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r1.reg.RegisterToolset(op, &toolsvcv1.RegisterToolsetRequest{Toolset: &toolsvcv1.Toolset{
		Name: "outdoors", Title: "Outdoors", Guidance: "Check the weather first.", Tools: []string{"weather", "clock"}}}); err != nil {
		t.Fatal(err)
	}
	want := exportAll(ctx, t, r1.conn)
	testutil.EventuallyNil(t, 10*time.Second, func() error {
		got := exportAll(ctx, t, r2.conn)
		for k, v := range want {
			if got[k] != v {
				return fmt.Errorf("replica 2's %s differs", k)
			}
		}
		return nil
	})
	// A change on replica 2 reaches replica 1.
	if _, err := r2.reg.RegisterToolset(op, &toolsvcv1.RegisterToolsetRequest{Toolset: &toolsvcv1.Toolset{
		Name: "outdoors", Title: "Outdoors", Guidance: "Check the weather first.", Tools: []string{"weather", "clock"}, Disabled: true}}); err != nil {
		t.Fatal(err)
	}
	changed := exportAll(ctx, t, r2.conn)
	if changed["EXPORT_FORMAT_MCP"] == want["EXPORT_FORMAT_MCP"] {
		t.Fatal("disabling the toolset changed nothing")
	}
	testutil.EventuallyNil(t, 10*time.Second, func() error {
		if exportAll(ctx, t, r1.conn)["EXPORT_FORMAT_MCP"] != changed["EXPORT_FORMAT_MCP"] {
			return errors.New("replica 1 has not followed the change")
		}
		return nil
	})
	sameExports(t, "replicas after the change", changed, exportAll(ctx, t, r1.conn))

	// A new process on the same database: the same bytes, at once.
	r3 := start(t, cfg, app.Options{})
	sameExports(t, "after a restart", changed, exportAll(ctx, t, r3.conn))
}
