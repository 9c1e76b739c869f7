package app_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

var demoTools = []string{"clock", "echo", "flaky", "notes", "pipeline", "release"}

func storedTools(t *testing.T, ctx context.Context, s store.Store) map[string]store.ToolSource {
	t.Helper()
	ts, err := s.ListTools(ctx, store.ListToolsParams{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.ToolSource{}
	for _, tl := range ts {
		out[tl.Name] = tl.Source
	}
	return out
}

func names(m map[string]store.ToolSource) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func TestServesDemoToolsOnEachStore(t *testing.T) {
	forEachBackend(t, func(t *testing.T, conn *grpc.ClientConn, a *app.App) {
		ctx := testCtx(t)
		resp, err := toolsvcv1.NewRegistryServiceClient(conn).ListTools(ctx, &toolsvcv1.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, tl := range resp.Tools {
			got = append(got, tl.Name)
			if tl.Source != toolsvcv1.ToolSource_TOOL_SOURCE_BUILTIN || tl.ConnectorId != "demo" {
				t.Errorf("%s: source %v connector %q", tl.Name, tl.Source, tl.ConnectorId)
			}
		}
		if !slices.Equal(got, demoTools) {
			t.Fatalf("tools %v, want %v", got, demoTools)
		}
		// Builtin syncs are audited as the system's doing.
		evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Types: []string{"tool.registered"}, Tool: "echo"})
		if err != nil || len(evs) != 1 || evs[0].Principal != app.SystemActor {
			t.Fatalf("echo registration events %v %v", evs, err)
		}
	})
}

func TestDemoToolsOffRemovesSyncedBuiltins(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	a, err := app.New(ctx, cfg, app.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(storedTools(t, ctx, a.Store())); !slices.Equal(got, demoTools) {
		t.Fatalf("first start: %v", got)
	}
	a.Close()

	off := false
	cfg.DemoTools = &off
	a, err = app.New(ctx, cfg, app.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := storedTools(t, ctx, a.Store()); len(got) != 0 {
		t.Fatalf("demo tools still stored with demo_tools off: %v", got)
	}
	evs, err := a.Store().ListAuditEvents(ctx, store.AuditFilter{Types: []string{"tool.deregistered"}})
	if err != nil || len(evs) != len(demoTools) {
		t.Fatalf("deregistration events %d (%v), want %d", len(evs), err, len(demoTools))
	}
}

func TestPostgresDefaultsToNoDemoTools(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	cfg.DemoTools = nil
	a, err := app.New(ctx, cfg, app.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := storedTools(t, ctx, a.Store()); len(got) != 0 {
		t.Fatalf("Postgres without demo_tools has %v", got)
	}
}

const toolsFile = `tools:
  - name: weather
    description: Current weather
    connector_id: weather-mcp
    provider_type: mcp
    default_risk: LOW
    actions:
      - name: current
        description: Weather now
        input_schema:
          type: object
          properties:
            city: {type: string}
`

func TestToolsFileSynced(t *testing.T) {
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			cfg := apptest.Config(t, backend)
			path := filepath.Join(t.TempDir(), "tools.yaml")
			if err := os.WriteFile(path, []byte(toolsFile), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg.ToolsFile = path
			a, err := app.New(ctx, cfg, app.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			got := storedTools(t, ctx, a.Store())
			if got["weather"] != store.SourceFile || got["echo"] != store.SourceBuiltin {
				t.Fatalf("stored %v", got)
			}
		})
	}
}

func TestBadToolsFileRefusesToStart(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Memory)
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(toolsFile, "default_risk: LOW", "default_risk: SEVERE", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.ToolsFile = path
	_, err := app.New(ctx, cfg, app.Options{})
	if err == nil || !strings.Contains(err.Error(), "default_risk") {
		t.Fatalf("want a refusal naming default_risk, got %v", err)
	}
}

func TestSchemaBehindRefusesToStart(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Memory)
	cfg.Store, cfg.DatabaseURL = "", pgtest.NewEmptyDatabase(t)
	_, err := app.New(ctx, cfg, app.Options{})
	if !errors.Is(err, postgres.ErrSchemaBehind) || !strings.Contains(err.Error(), "toolsvc migrate up") {
		t.Fatalf("want ErrSchemaBehind saying what to run, got %v", err)
	}

	// With migrate on, the same database is brought up to date and served.
	cfg.Migrate = true
	conn, a := apptest.Start(t, cfg, app.Options{})
	if err := postgres.CheckSchema(ctx, a.Store().(*postgres.Store).Pool()); err != nil {
		t.Fatalf("schema after --migrate: %v", err)
	}
	resp, err := toolsvcv1.NewRegistryServiceClient(conn).ListTools(ctx, &toolsvcv1.ListToolsRequest{})
	if err != nil || len(resp.Tools) != len(demoTools) {
		t.Fatalf("serving after --migrate: %v %v", resp, err)
	}
}

func TestInvalidConfigRefused(t *testing.T) {
	cfg := apptest.Config(t, apptest.Memory)
	cfg.Listen = "0.0.0.0:0"
	if _, err := app.New(testCtx(t), cfg, app.Options{}); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("non-loopback listen accepted: %v", err)
	}
}
