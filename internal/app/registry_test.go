package app_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// forEachBackend runs fn against a fresh App on every store.
func forEachBackend(t *testing.T, fn func(t *testing.T, conn *grpc.ClientConn, a *app.App)) {
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			conn, a := apptest.Start(t, apptest.Config(t, backend), app.Options{})
			fn(t, conn, a)
		})
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// weatherTool is a full definition: an MCP tool (no provider needed in this
// process) using every field of the message.
func weatherTool(t *testing.T) *toolsvcv1.Tool {
	out, err := structpb.NewValue(map[string]any{"temp_c": 21.5})
	if err != nil {
		t.Fatal(err)
	}
	return &toolsvcv1.Tool{
		Name:           "weather",
		Description:    "Current weather and forecasts",
		ConnectorId:    "weather-mcp",
		ProviderType:   toolsvcv1.ProviderType_PROVIDER_TYPE_MCP,
		Capabilities:   []string{"forecast"},
		RequiredScopes: []string{"weather:read"},
		DefaultRisk:    toolsvcv1.RiskLevel_RISK_LEVEL_LOW,
		Timeout:        durationpb.New(10 * time.Second),
		ApprovalTtl:    durationpb.New(2 * time.Hour),
		ConfigRef:      "config/weather",
		AuditPayloads:  true,
		Actions: []*toolsvcv1.Action{
			{
				Name:        "current",
				Description: "Weather now",
				InputSchema: mustStruct(t, map[string]any{
					"type":       "object",
					"properties": map[string]any{"city": map[string]any{"type": "string"}},
					"required":   []any{"city"},
				}),
				OutputSchema:     mustStruct(t, map[string]any{"type": "object"}),
				ResourceArgument: "city",
				Examples: []*toolsvcv1.ActionExample{{
					Description: "Paris",
					Input:       mustStruct(t, map[string]any{"city": "Paris"}),
					Output:      out,
				}},
			},
			{Name: "alert", Description: "Send a weather alert", Risk: toolsvcv1.RiskLevel_RISK_LEVEL_HIGH},
		},
		Policies: []*toolsvcv1.Policy{
			{Kind: &toolsvcv1.Policy_SequentialDependency{SequentialDependency: &toolsvcv1.SequentialDependency{Action: "alert", Requires: []string{"current"}}}},
		},
	}
}

func violations(t *testing.T, err error) (codes.Code, map[string]string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a status: %v", err)
	}
	out := map[string]string{}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.FieldViolations {
				out[v.Field] = v.Description
			}
		}
	}
	return st.Code(), out
}

func reason(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

func auditTypes(t *testing.T, ctx context.Context, a *app.App, tool string) []string {
	t.Helper()
	evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Tool: tool})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type+" by "+e.Principal)
	}
	return types
}

func TestRegisterGetDeregister(t *testing.T) {
	forEachBackend(t, func(t *testing.T, conn *grpc.ClientConn, a *app.App) {
		ctx := testCtx(t)
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		def := weatherTool(t)

		// validate_only answers what would be stored and writes nothing.
		vo, err := reg.RegisterTool(apptest.As(ctx, "ops"), &toolsvcv1.RegisterToolRequest{Tool: def, ValidateOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if !vo.Created || vo.Tool.Version != 1 {
			t.Fatalf("validate_only answered %v", vo)
		}
		if _, err := a.Store().GetTool(ctx, "weather"); err == nil {
			t.Fatal("validate_only stored the tool")
		}

		created, err := reg.RegisterTool(apptest.As(ctx, "ops"), &toolsvcv1.RegisterToolRequest{Tool: def})
		if err != nil {
			t.Fatal(err)
		}
		if !created.Created || created.Tool.Version != 1 || created.Tool.Source != toolsvcv1.ToolSource_TOOL_SOURCE_API ||
			created.Tool.CreateTime == nil || created.Tool.UpdateTime == nil {
			t.Fatalf("register answered %v", created)
		}

		// What GetTool returns is what was registered, output-only fields aside.
		got, err := reg.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: "weather"})
		if err != nil {
			t.Fatal(err)
		}
		stripped := proto.Clone(got.Tool).(*toolsvcv1.Tool)
		stripped.Version, stripped.Source, stripped.CreateTime, stripped.UpdateTime = 0, 0, nil, nil
		// The documents' text forms come back too (the e2e tests check
		// them); the definition sent had only the Structs.
		for _, a := range stripped.Actions {
			if a.ExportedName != "weather__"+a.Name {
				t.Errorf("action %s is exported as %q", a.Name, a.ExportedName)
			}
			a.InputSchemaJson, a.OutputSchemaJson, a.ExportedName = "", "", ""
			for _, ex := range a.Examples {
				ex.InputJson, ex.OutputJson = "", ""
			}
		}
		if !proto.Equal(stripped, def) {
			t.Fatalf("round trip changed the tool:\n got  %v\n want %v", stripped, def)
		}
		stored, err := a.Store().GetTool(ctx, "weather")
		if err != nil {
			t.Fatal(err)
		}
		if stored.Timeout != 10*time.Second || stored.ApprovalTTL != 2*time.Hour || stored.ProviderType != store.ProviderMCP ||
			string(stored.Actions[0].InputSchema) != `{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}` ||
			stored.Policies[0].SequentialDependency.Action != "alert" {
			t.Fatalf("stored %+v", stored)
		}

		// Re-registering the same definition changes nothing.
		same, err := reg.RegisterTool(apptest.As(ctx, "ops"), &toolsvcv1.RegisterToolRequest{Tool: def})
		if err != nil || same.Created || same.Tool.Version != 1 {
			t.Fatalf("identical re-register: %v %v", same, err)
		}
		// A change bumps the version, guarded by expected_version.
		def.Description = "Weather, now with alerts"
		_, err = reg.RegisterTool(apptest.As(ctx, "ops"), &toolsvcv1.RegisterToolRequest{Tool: def, ExpectedVersion: 7})
		if status.Code(err) != codes.FailedPrecondition || reason(err) != "VERSION_CONFLICT" {
			t.Fatalf("stale expected_version: %v", err)
		}
		updated, err := reg.RegisterTool(apptest.As(ctx, "ops"), &toolsvcv1.RegisterToolRequest{Tool: def, ExpectedVersion: 1})
		if err != nil || updated.Created || updated.Tool.Version != 2 || updated.Tool.Description != "Weather, now with alerts" {
			t.Fatalf("update: %v %v", updated, err)
		}

		gone, err := reg.DeregisterTool(apptest.As(ctx, "ops-2"), &toolsvcv1.DeregisterToolRequest{Name: "weather", ExpectedVersion: 2})
		if err != nil || gone.Tool.Version != 2 || gone.Tool.Name != "weather" {
			t.Fatalf("deregister: %v %v", gone, err)
		}
		// GetTool reads the registry cache, which the deregistration updated
		// before answering: no window in which the tool is still there.
		_, err = reg.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: "weather"})
		if status.Code(err) != codes.NotFound || reason(err) != "TOOL_NOT_FOUND" {
			t.Fatalf("get after deregister: %v", err)
		}
		_, err = reg.DeregisterTool(ctx, &toolsvcv1.DeregisterToolRequest{Name: "weather"})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("second deregister: %v", err)
		}

		want := []string{"tool.registered by ops", "tool.updated by ops", "tool.deregistered by ops-2"}
		if got := auditTypes(t, ctx, a, "weather"); !slices.Equal(got, want) {
			t.Fatalf("audit %v, want %v", got, want)
		}
	})
}

func TestRegisterBadToolWritesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, conn *grpc.ClientConn, a *app.App) {
		ctx := testCtx(t)
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		before, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		toolsBefore, err := a.Store().ListTools(ctx, store.ListToolsParams{})
		if err != nil {
			t.Fatal(err)
		}

		bad := &toolsvcv1.Tool{
			Name:         "Bad Name",
			Description:  "  ",
			ConnectorId:  "weather-mcp",
			ProviderType: toolsvcv1.ProviderType_PROVIDER_TYPE_MCP,
			Timeout:      durationpb.New(2 * time.Hour),
			Actions: []*toolsvcv1.Action{
				{Name: "ok", Description: "Fine", InputSchema: mustStruct(t, map[string]any{"type": "string"})},
				{Name: "ok", Description: "Duplicate"},
			},
			Policies:    []*toolsvcv1.Policy{{}},
			ApprovalTtl: &durationpb.Duration{Seconds: 1, Nanos: -5},
		}
		_, err = reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: bad, ExpectedVersion: -1})
		code, vs := violations(t, err)
		if code != codes.InvalidArgument || reason(err) != "INVALID_REQUEST" {
			t.Fatalf("want INVALID_ARGUMENT INVALID_REQUEST, got %v", err)
		}
		for _, field := range []string{
			"expected_version", "tool.name", "tool.description", "tool.default_risk", "tool.timeout",
			"tool.approval_ttl", "tool.actions[0].input_schema", "tool.actions[1].name", "tool.policies[0]",
		} {
			if vs[field] == "" {
				t.Errorf("no violation for %s in %v", field, vs)
			}
		}

		after, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		toolsAfter, err := a.Store().ListTools(ctx, store.ListToolsParams{})
		if err != nil {
			t.Fatal(err)
		}
		if len(after) != len(before) || len(toolsAfter) != len(toolsBefore) {
			t.Fatalf("a refused registration wrote: %d->%d events, %d->%d tools", len(before), len(after), len(toolsBefore), len(toolsAfter))
		}

		// Envelope checks.
		_, err = reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{})
		if _, vs := violations(t, err); vs["tool"] == "" {
			t.Fatalf("missing tool: %v", err)
		}
		for _, name := range []string{"", "UPPER", strings.Repeat("a", 65)} {
			_, err = reg.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: name})
			if code, vs := violations(t, err); code != codes.InvalidArgument || vs["name"] == "" {
				t.Fatalf("GetTool(%q): %v", name, err)
			}
			_, err = reg.DeregisterTool(ctx, &toolsvcv1.DeregisterToolRequest{Name: name})
			if code, vs := violations(t, err); code != codes.InvalidArgument || vs["name"] == "" {
				t.Fatalf("DeregisterTool(%q): %v", name, err)
			}
		}
		_, err = reg.DeregisterTool(ctx, &toolsvcv1.DeregisterToolRequest{Name: "echo", ExpectedVersion: -3})
		if _, vs := violations(t, err); vs["expected_version"] == "" {
			t.Fatalf("negative expected_version: %v", err)
		}
		if _, err := a.Store().GetTool(ctx, "echo"); err != nil {
			t.Fatalf("refused deregistration removed the tool: %v", err)
		}
	})
}

func TestListToolsPagination(t *testing.T) {
	forEachBackend(t, func(t *testing.T, conn *grpc.ClientConn, a *app.App) {
		ctx := testCtx(t)
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		for i := range 6 {
			tool := weatherTool(t)
			tool.Name = fmt.Sprintf("w%02d", i)
			if _, err := reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: tool}); err != nil {
				t.Fatal(err)
			}
		}
		all, err := a.Store().ListTools(ctx, store.ListToolsParams{})
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, tl := range all {
			want = append(want, tl.Name)
		}
		if len(want) != 12 { // 6 demo tools + 6
			t.Fatalf("store has %v", want)
		}

		var got []string
		token, pages := "", 0
		for {
			resp, err := reg.ListTools(ctx, &toolsvcv1.ListToolsRequest{PageSize: 3, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if len(resp.Tools) > 3 {
				t.Fatalf("page of %d", len(resp.Tools))
			}
			for _, tl := range resp.Tools {
				got = append(got, tl.Name)
			}
			if resp.NextPageToken == "" {
				break
			}
			token = resp.NextPageToken
		}
		if !slices.Equal(got, want) || !sort.StringsAreSorted(got) || pages != 4 {
			t.Fatalf("paged %v in %d pages, want %v in 4", got, pages, want)
		}

		// An exact multiple of the page size has no empty last page.
		resp, err := reg.ListTools(ctx, &toolsvcv1.ListToolsRequest{PageSize: 12})
		if err != nil || len(resp.Tools) != 12 || resp.NextPageToken != "" {
			t.Fatalf("single full page: %d tools, token %q, %v", len(resp.Tools), resp.NextPageToken, err)
		}
		// The default page holds them all.
		resp, err = reg.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
		if err != nil || len(resp.Tools) != 12 {
			t.Fatalf("default page: %v", err)
		}

		for _, req := range []*toolsvcv1.ListToolsRequest{
			{PageToken: "garbage"},
			{PageToken: token + "x"},
			{PageSize: -1},
		} {
			_, err := reg.ListTools(ctx, req)
			code, vs := violations(t, err)
			if code != codes.InvalidArgument || (vs["page_token"] == "" && vs["page_size"] == "") {
				t.Fatalf("%v: %v", req, err)
			}
		}
	})
}

// Concurrent registrations of one tool each either apply, with their own
// version and audit event, or answer ABORTED VERSION_CONFLICT (the registry
// gives up after a few rounds of contention; the caller may retry). Nothing
// is lost or applied twice.
func TestConcurrentRegistrations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, conn *grpc.ClientConn, a *app.App) {
		ctx := testCtx(t)
		reg := toolsvcv1.NewRegistryServiceClient(conn)
		const n = 8
		var (
			wg                         sync.WaitGroup
			mu                         sync.Mutex
			applied, aborted, creators int
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tool := weatherTool(t)
				tool.Description = fmt.Sprintf("Weather, writer %d", i)
				resp, err := reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: tool})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					applied++
					if resp.Created {
						creators++
					}
				case status.Code(err) == codes.Aborted && reason(err) == "VERSION_CONFLICT":
					aborted++
				default:
					t.Errorf("concurrent register: %v", err)
				}
			}()
		}
		wg.Wait()
		if creators != 1 || applied+aborted != n || applied == 0 {
			t.Fatalf("%d applied (%d created), %d aborted of %d", applied, creators, aborted, n)
		}
		stored, err := a.Store().GetTool(ctx, "weather")
		if err != nil {
			t.Fatal(err)
		}
		if stored.Version != int64(applied) {
			t.Fatalf("version %d after %d applied registrations", stored.Version, applied)
		}
		types := auditTypes(t, ctx, a, "weather")
		if len(types) != applied || !strings.HasPrefix(types[0], "tool.registered") {
			t.Fatalf("audit %v for %d applied registrations", types, applied)
		}
	})
}
