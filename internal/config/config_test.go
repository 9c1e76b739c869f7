package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/toolkit"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// problemsOf returns the problems of a configuration error.
func problemsOf(t *testing.T, err error) []string {
	t.Helper()
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("want *config.Error, got %v", err)
	}
	return ce.Problems
}

// requireProblem asserts that one problem starts with key and contains each
// fragment.
func requireProblem(t *testing.T, problems []string, key string, fragments ...string) {
	t.Helper()
	for _, p := range problems {
		rest, found := strings.CutPrefix(p, key)
		if !found || rest == "" || !strings.ContainsRune(":[ ", rune(rest[0])) {
			continue
		}
		ok := true
		for _, f := range fragments {
			ok = ok && strings.Contains(p, f)
		}
		if ok {
			return
		}
	}
	t.Errorf("no problem for %s containing %q in:\n  %s", key, fragments, strings.Join(problems, "\n  "))
}

func TestDefaults(t *testing.T) {
	cfg, err := config.Load(config.Sources{Env: envOf(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, config.Default()) {
		t.Fatalf("loaded %+v, want the defaults %+v", cfg, config.Default())
	}
	if cfg.Listen != "127.0.0.1:50051" || cfg.ShutdownTimeout != 15*time.Second ||
		cfg.Approvals.TTL != time.Hour || cfg.Previews.TTL != 10*time.Minute ||
		cfg.Log.Format != "json" || cfg.Log.Level != "info" || cfg.Auth.Enabled {
		t.Fatalf("unexpected defaults %+v", cfg)
	}
	if cfg.StoreKind() != "memory" || !cfg.DemoToolsEnabled() {
		t.Fatalf("memory store with demo tools expected: %s %v", cfg.StoreKind(), cfg.DemoToolsEnabled())
	}
	if cfg.Health.DegradedAfter != 3 || cfg.Idempotency.Retention != 24*time.Hour {
		t.Fatalf("package defaults not applied: %+v %+v", cfg.Health, cfg.Idempotency)
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	cfg, err := config.Load(config.Sources{Env: envOf(map[string]string{
		"TOOLSVC_LISTEN":                   "localhost:6000",
		"TOOLSVC_DATABASE_URL":             "postgres://postgres@127.0.0.1:5432/toolsvc",
		"TOOLSVC_MIGRATE":                  "true",
		"TOOLSVC_LOG_LEVEL":                "debug",
		"TOOLSVC_LOG_FORMAT":               "text",
		"TOOLSVC_SHUTDOWN_TIMEOUT":         "3s",
		"TOOLSVC_APPROVALS_TTL":            "2h",
		"TOOLSVC_PREVIEWS_TTL":             "1m",
		"TOOLSVC_GATE_COST_LIMIT":          "500",
		"TOOLSVC_HEALTH_DEGRADED_AFTER":    "2",
		"TOOLSVC_IDEMPOTENCY_LEASE":        "10s",
		"TOOLSVC_IDEMPOTENCY_REAPER_BATCH": "7",
		"UNRELATED":                        "x",
	})})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "localhost:6000" || cfg.DatabaseURL != "postgres://postgres@127.0.0.1:5432/toolsvc" || !cfg.Migrate ||
		cfg.Log.Level != "debug" || cfg.Log.Format != "text" || cfg.ShutdownTimeout != 3*time.Second ||
		cfg.Approvals.TTL != 2*time.Hour || cfg.Previews.TTL != time.Minute || cfg.Gate.CostLimit != 500 ||
		cfg.Health.DegradedAfter != 2 || cfg.Idempotency.Lease != 10*time.Second || cfg.Idempotency.ReaperBatch != 7 {
		t.Fatalf("environment not applied: %+v", cfg)
	}
	// Keys the environment did not set keep their defaults.
	if cfg.Health.UnavailableAfter != 5 || cfg.Idempotency.Retention != 24*time.Hour {
		t.Fatalf("defaults lost: %+v %+v", cfg.Health, cfg.Idempotency)
	}
	if cfg.StoreKind() != "postgres" || cfg.DemoToolsEnabled() {
		t.Fatal("postgres without demo tools expected")
	}

	cfg, err = config.Load(config.Sources{Env: envOf(map[string]string{
		"TOOLSVC_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/toolsvc",
		"TOOLSVC_DEMO_TOOLS":   "true",
	})})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.DemoToolsEnabled() {
		t.Fatal("demo_tools=true with Postgres ignored")
	}
	cfg, err = config.Load(config.Sources{Env: envOf(map[string]string{"TOOLSVC_DEMO_TOOLS": "false"})})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DemoToolsEnabled() {
		t.Fatal("demo_tools=false with the memory store ignored")
	}
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, "c.yaml", "listen: 127.0.0.1:1001\nlog:\n  format: text\n")
	env := map[string]string{"TOOLSVC_LISTEN": "127.0.0.1:1002"}
	newFlags := func(args ...string) *pflag.FlagSet {
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		config.RegisterFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	for _, tc := range []struct {
		name  string
		src   config.Sources
		want  string
		level string
	}{
		{"file", config.Sources{File: file, Flags: newFlags()}, "127.0.0.1:1001", "info"},
		{"env over file", config.Sources{File: file, Env: envOf(env), Flags: newFlags()}, "127.0.0.1:1002", "info"},
		{"flag over env", config.Sources{File: file, Env: envOf(env), Flags: newFlags("--listen", "127.0.0.1:1003", "--log-level", "warn")}, "127.0.0.1:1003", "warn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Load(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Listen != tc.want || cfg.Log.Level != tc.level {
				t.Fatalf("listen %s level %s, want %s %s", cfg.Listen, cfg.Log.Level, tc.want, tc.level)
			}
			// The file's other keys survive.
			if cfg.Log.Format != "text" {
				t.Fatalf("file's log.format lost: %q", cfg.Log.Format)
			}
		})
	}
	// A flag not given does not override the file with its default.
	cfg, err := config.Load(config.Sources{File: writeFile(t, "d.yaml", "demo_tools: true\nshutdown_timeout: 4s\n"), Flags: newFlags()})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.DemoToolsEnabled() || cfg.ShutdownTimeout != 4*time.Second {
		t.Fatalf("unset flags overrode the file: %+v", cfg)
	}
	cfg, err = config.Load(config.Sources{Flags: newFlags("--demo-tools=false", "--database-url", "postgres://x@127.0.0.1/db", "--shutdown-grace", "9s")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DemoToolsEnabled() || cfg.DatabaseURL != "postgres://x@127.0.0.1/db" || cfg.ShutdownGrace != 9*time.Second {
		t.Fatalf("flags ignored: %+v", cfg)
	}
}

func TestFileWithManyErrorsReportsAll(t *testing.T) {
	tools := writeFile(t, "tools.yaml", "tools:\n  - name: Bad Name\n    description: x\n")
	file := writeFile(t, "bad.yaml", `
listen: 0.0.0.0:99999
migrate: true
tools_file: `+tools+`
log:
  level: loud
  colour: blue
shutdown_timeout: 15
auth:
  enabled: true
tls:
  cert_file: server.pem
frobnicate: 1
principals:
  - id: alice
    roles: [agent, admin]
    max_autonomy: ASSISTED
    default_autonomy: AUTONOMOUS
  - id: alice
    roles: []
approvals:
  ttl: -1s
previews:
  ttl: 0s
gate:
  matrix:
    supervised:
      medium: maybe
  adjusters:
    - name: big
      when: "args.amount >"
      level: HIGH
health:
  degraded_after: 0
idempotency:
  reaper_batch: 0
`)
	_, err := config.Load(config.Sources{File: file})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "listen", "port", "99999")
	requireProblem(t, ps, "migrate", "database_url")
	requireProblem(t, ps, "tools_file")
	requireProblem(t, ps, "log.level", "loud")
	requireProblem(t, ps, "log.colour", "unknown key")
	requireProblem(t, ps, "frobnicate", "unknown key")
	requireProblem(t, ps, "shutdown_timeout", "unit")
	requireProblem(t, ps, "principals[0]", "no credential", "token_sha256", "certificate_sans")
	requireProblem(t, ps, "tls.key_file", "required with tls.cert_file")
	requireProblem(t, ps, "principals[0].roles[1]", "admin")
	requireProblem(t, ps, "principals[0].default_autonomy", "above max_autonomy")
	requireProblem(t, ps, "principals[1].id", "principals[0]")
	requireProblem(t, ps, "principals[1].roles", "at least one role")
	requireProblem(t, ps, "approvals.ttl", "positive")
	requireProblem(t, ps, "previews.ttl", "positive")
	requireProblem(t, ps, "gate.matrix.supervised.medium", "maybe")
	requireProblem(t, ps, "gate.adjusters")
	requireProblem(t, ps, "health.degraded_after")
	requireProblem(t, ps, "idempotency.reaper_batch")
	// The message is readable: one line per problem.
	msg := err.Error()
	if !strings.HasPrefix(msg, "invalid configuration:\n  - ") || strings.Count(msg, "\n  - ") != len(ps) {
		t.Fatalf("unreadable message:\n%s", msg)
	}
}

func TestUnknownKey(t *testing.T) {
	_, err := config.Load(config.Sources{File: writeFile(t, "c.yaml", "listen: 127.0.0.1:1\ndatabase_ulr: x\nhealth:\n  cooldwn: 5s\n")})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "database_ulr", "unknown key")
	requireProblem(t, ps, "health.cooldwn", "unknown key")
	if len(ps) != 2 {
		t.Fatalf("want exactly the two unknown keys, got %q", ps)
	}
}

func TestListen(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:50051", "localhost:0", "[::1]:7000", "127.0.0.2:5"} {
		if _, err := config.Load(config.Sources{Env: envOf(map[string]string{"TOOLSVC_LISTEN": ok})}); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"0.0.0.0:50051", ":50051", "[::]:50051", "10.1.2.3:1", "example.com:80"} {
		_, err := config.Load(config.Sources{Env: envOf(map[string]string{"TOOLSVC_LISTEN": bad})})
		requireProblem(t, problemsOf(t, err), "listen", "not a loopback address", "auth.enabled")
	}
	for _, bad := range []string{"50051", "127.0.0.1:http", "127.0.0.1:70000"} {
		_, err := config.Load(config.Sources{Env: envOf(map[string]string{"TOOLSVC_LISTEN": bad})})
		requireProblem(t, problemsOf(t, err), "listen")
	}
}

func TestDatabaseURLProblemHidesPassword(t *testing.T) {
	_, err := config.Load(config.Sources{Env: envOf(map[string]string{
		"TOOLSVC_DATABASE_URL": "postgres://u:hunter2@127.0.0.1:notaport/db",
	})})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "database_url", "not a valid Postgres connection string")
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("password leaked: %v", err)
	}
}

func TestMissingAndBrokenFile(t *testing.T) {
	_, err := config.Load(config.Sources{File: filepath.Join(t.TempDir(), "nope.yaml")})
	if ps := problemsOf(t, err); len(ps) != 1 || !strings.Contains(ps[0], "nope.yaml") {
		t.Fatalf("got %q", ps)
	}
	_, err = config.Load(config.Sources{File: writeFile(t, "b.yaml", "listen: [unclosed\n")})
	if ps := problemsOf(t, err); len(ps) != 1 || !strings.Contains(ps[0], "b.yaml") {
		t.Fatalf("got %q", ps)
	}
}

func TestDevPrincipals(t *testing.T) {
	cfg, err := config.Load(config.Sources{File: writeFile(t, "p.yaml", `
principals:
  - id: approver-1
    roles: [approver]
  - id: cautious-agent
    roles: [agent, agent]
    scopes: ["notes:read"]
    max_autonomy: assisted
  - id: trusted-agent
    roles: [agent]
    default_autonomy: AUTONOMOUS
  - id: bold-agent
    roles: [agent]
    default_autonomy: assisted
    max_autonomy: autonomous
`)})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := cfg.DevPrincipals()
	if err != nil {
		t.Fatal(err)
	}
	// An unset max_autonomy is the default autonomy: no more than a
	// principal gets without asking, unless the configuration says so.
	want := []*auth.Principal{
		{ID: "approver-1", Roles: []auth.Role{auth.RoleApprover}, Scopes: []string{},
			MaxAutonomy: toolkit.AutonomySupervised, DefaultAutonomy: toolkit.AutonomySupervised},
		{ID: "cautious-agent", Roles: []auth.Role{auth.RoleAgent}, Scopes: []string{"notes:read"},
			MaxAutonomy: toolkit.AutonomyAssisted, DefaultAutonomy: toolkit.AutonomyAssisted},
		{ID: "trusted-agent", Roles: []auth.Role{auth.RoleAgent}, Scopes: []string{},
			MaxAutonomy: toolkit.AutonomyAutonomous, DefaultAutonomy: toolkit.AutonomyAutonomous},
		{ID: "bold-agent", Roles: []auth.Role{auth.RoleAgent}, Scopes: []string{},
			MaxAutonomy: toolkit.AutonomyAutonomous, DefaultAutonomy: toolkit.AutonomyAssisted},
	}
	if len(ps) != len(want) {
		t.Fatalf("got %d principals", len(ps))
	}
	for i := range want {
		if ps[i].Scopes == nil {
			ps[i].Scopes = []string{}
		}
		if !reflect.DeepEqual(ps[i], want[i]) {
			t.Fatalf("principal %d: got %+v, want %+v", i, ps[i], want[i])
		}
	}
}

// The annotated example configuration is valid, and sets what it says.
func TestExampleConfiguration(t *testing.T) {
	// Run from anywhere: the example names its tools file relative to
	// itself.
	example, err := filepath.Abs(filepath.Join("..", "..", "deploy", "toolsvc.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	cfg, err := config.Load(config.Sources{File: example})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Principals) != 3 || len(cfg.Gate.Adjusters) != 2 || cfg.ToolsFile != filepath.Join(filepath.Dir(example), "tools.example.yaml") {
		t.Fatalf("example loaded as %+v", cfg)
	}
	// It spells out every limit, at its default.
	d := config.Default()
	if cfg.Server != d.Server || cfg.Audit != d.Audit || cfg.ShutdownGrace != d.ShutdownGrace || cfg.MCP != d.MCP {
		t.Fatalf("example limits %+v %+v %s, want the defaults %+v %+v %s", cfg.Server, cfg.Audit, cfg.ShutdownGrace, d.Server, d.Audit, d.ShutdownGrace)
	}
	ps, err := cfg.DevPrincipals()
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].ID != "agent-1" || ps[0].MaxAutonomy != toolkit.AutonomySupervised || ps[0].DefaultAutonomy != toolkit.AutonomyAssisted {
		t.Fatalf("agent-1: %+v", ps[0])
	}
}

// The limits are keys like any other: defaults a production user would
// pick, set from the file or the environment, validated together.
func TestLimits(t *testing.T) {
	d := config.Default()
	if d.Server.MaxRecvMessageBytes != 4<<20 || d.Server.MaxSendMessageBytes != 4<<20 ||
		d.Server.MaxConcurrentStreams != 250 || d.Server.MaxWatchStreams != 1000 ||
		d.Server.MaxWatchStreamsPerPrincipal != 16 || d.Server.StoreProbeInterval != time.Second ||
		d.Server.Keepalive.Time != time.Minute || d.Server.Keepalive.MinTime != 10*time.Second ||
		!d.Server.Keepalive.PermitWithoutStream || d.ShutdownGrace != 5*time.Second ||
		d.Audit.PageBytes != 1<<20 || d.Audit.Retention != 90*24*time.Hour {
		t.Fatalf("defaults %+v %+v %s", d.Server, d.Audit, d.ShutdownGrace)
	}
	cfg, err := config.Load(config.Sources{Env: envOf(map[string]string{
		"TOOLSVC_SERVER_MAX_RECV_MESSAGE_BYTES":          "1048576",
		"TOOLSVC_SERVER_MAX_WATCH_STREAMS_PER_PRINCIPAL": "4",
		"TOOLSVC_SERVER_STORE_PROBE_INTERVAL":            "250ms",
		"TOOLSVC_SERVER_KEEPALIVE_TIME":                  "30s",
		"TOOLSVC_SERVER_KEEPALIVE_PERMIT_WITHOUT_STREAM": "false",
		"TOOLSVC_SHUTDOWN_GRACE":                         "8s",
		"TOOLSVC_AUDIT_RETENTION":                        "0s",
	})})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.MaxRecvMessageBytes != 1<<20 || cfg.Server.MaxWatchStreamsPerPrincipal != 4 ||
		cfg.Server.StoreProbeInterval != 250*time.Millisecond || cfg.Server.Keepalive.Time != 30*time.Second ||
		cfg.Server.Keepalive.PermitWithoutStream || cfg.ShutdownGrace != 8*time.Second || cfg.Audit.Retention != 0 {
		t.Fatalf("environment not applied: %+v %+v %s", cfg.Server, cfg.Audit, cfg.ShutdownGrace)
	}

	file := writeFile(t, "c.yaml", `
shutdown_grace: 0s
server:
  max_send_message_bytes: 131072
  max_watch_streams: 2
  max_watch_streams_per_principal: 3
  keepalive:
    timeout: 0s
audit:
  page_bytes: 1048576
  retention: -1h
`)
	_, err = config.Load(config.Sources{File: file})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "shutdown_grace", "positive")
	requireProblem(t, ps, "server.max_watch_streams_per_principal", "at most max_watch_streams")
	requireProblem(t, ps, "server.keepalive.timeout", "at least 1s")
	requireProblem(t, ps, "audit.page_bytes", "server.max_send_message_bytes")
	requireProblem(t, ps, "audit.retention", "negative")
}

func TestAuditDetailMaxBytes(t *testing.T) {
	cfg, err := config.Load(config.Sources{Env: envOf(map[string]string{"TOOLSVC_AUDIT_DETAIL_MAX_BYTES": "4096"})})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Audit.DetailMaxBytes != 4096 {
		t.Fatalf("audit.detail_max_bytes = %d, want 4096", cfg.Audit.DetailMaxBytes)
	}
	if config.Default().Audit.DetailMaxBytes != 16<<10 {
		t.Fatalf("default audit.detail_max_bytes = %d, want 16 KiB", config.Default().Audit.DetailMaxBytes)
	}
	_, err = config.Load(config.Sources{File: writeFile(t, "c.yaml", "audit:\n  detail_max_bytes: 100\n")})
	requireProblem(t, problemsOf(t, err), "audit.detail_max_bytes", "between 1024 and 1048576")
}

func TestSecretsDir(t *testing.T) {
	dir := t.TempDir()
	// The environment sets the directory; a connector's secret in the
	// environment (TOOLSVC_SECRET_...) is not a configuration key.
	cfg, err := config.Load(config.Sources{Env: envOf(map[string]string{
		"TOOLSVC_SECRETS_DIR":            dir,
		"TOOLSVC_SECRET_BILLING_API_KEY": "not configuration",
	})})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Secrets.Dir != dir {
		t.Fatalf("secrets.dir = %q", cfg.Secrets.Dir)
	}
	file := writeFile(t, "x", "")
	for _, bad := range []string{filepath.Join(dir, "absent"), file} {
		_, err = config.Load(config.Sources{Env: envOf(map[string]string{"TOOLSVC_SECRETS_DIR": bad})})
		requireProblem(t, problemsOf(t, err), "secrets.dir")
	}
}

// A problem names where the value came from (the file, the environment
// variable or the flag) and the value, except one that may hold a
// credential.
func TestProblemsNameTheirSource(t *testing.T) {
	file := writeFile(t, "c.yaml", "log:\n  format: xml\nshutdown_timeout: soon\n")
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	if err := fs.Parse([]string{"--log-level=loud"}); err != nil {
		t.Fatal(err)
	}
	_, err := config.Load(config.Sources{File: file, Flags: fs, Env: envOf(map[string]string{
		"TOOLSVC_DATABASE_URL":      "mysql://user:hunter2@db/x",
		"TOOLSVC_IDEMPOTENCY_LEASE": "-1s",
	})})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "log.format", `(in `+file+`="xml")`)
	requireProblem(t, ps, "shutdown_timeout", `(in `+file+`="soon")`)
	requireProblem(t, ps, "log.level", `(from --log-level="loud")`)
	requireProblem(t, ps, "idempotency.lease", `(from TOOLSVC_IDEMPOTENCY_LEASE="-1s")`)
	requireProblem(t, ps, "database_url", "(from TOOLSVC_DATABASE_URL)")
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("a credential in the problems: %v", err)
	}
}

// Paths in a configuration file are relative to the file; from the
// environment, to the working directory.
func TestPathsRelativeToTheFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "conf", "secrets"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "conf", "toolsvc.yaml")
	if err := os.WriteFile(file, []byte("secrets:\n  dir: secrets\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	cfg, err := config.Load(config.Sources{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Secrets.Dir != filepath.Join(dir, "conf", "secrets") {
		t.Fatalf("secrets.dir = %q", cfg.Secrets.Dir)
	}
	_, err = config.Load(config.Sources{File: file, Env: envOf(map[string]string{"TOOLSVC_SECRETS_DIR": "secrets"})})
	requireProblem(t, problemsOf(t, err), "secrets.dir", "from TOOLSVC_SECRETS_DIR")
}

// The connectors' trust rules: the allowed stdio programs (from the file or
// the environment, names resolved at start) and where each connector's
// secrets may go; every bad entry is a problem naming its key.
func TestConnectorTrustKeys(t *testing.T) {
	file := writeFile(t, "c.yaml", `connectors:
  stdio:
    allowed_commands: [/usr/local/bin/github-mcp-server, sh]
secrets:
  destinations:
    - {connector: billing, hosts: [api.billing.example.com, "https://billing.internal:8443"]}
    - {connector: github, key: token, commands: [/usr/local/bin/github-mcp-server]}
`)
	cfg, err := config.Load(config.Sources{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Connectors.Stdio.AllowedCommands; len(got) != 2 || got[1] != "sh" {
		t.Fatalf("allowed_commands %v", got)
	}
	d := cfg.Secrets.Destinations
	if len(d) != 2 || d[0].Connector != "billing" || d[0].Hosts[1] != "https://billing.internal:8443" || d[1].Key != "token" || d[1].Commands[0] != "/usr/local/bin/github-mcp-server" {
		t.Fatalf("destinations %+v", d)
	}
	cfg, err = config.Load(config.Sources{Env: envOf(map[string]string{
		"TOOLSVC_CONNECTORS_STDIO_ALLOWED_COMMANDS": "/opt/a,/opt/b",
	})})
	if err != nil || len(cfg.Connectors.Stdio.AllowedCommands) != 2 || cfg.Connectors.Stdio.AllowedCommands[1] != "/opt/b" {
		t.Fatalf("from the environment: %v %v", cfg, err)
	}
	if d := config.Default(); len(d.Connectors.Stdio.AllowedCommands) != 0 || len(d.Secrets.Destinations) != 0 {
		t.Fatal("the defaults trust the API with something")
	}

	bad := writeFile(t, "bad.yaml", `connectors:
  stdio:
    allowed_commands: [no-such-program-anywhere, bin/relative]
secrets:
  destinations:
    - {connector: Billing!, hosts: ["https://h/with/path"]}
    - {connector: github}
`)
	_, err = config.Load(config.Sources{File: bad})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "connectors.stdio.allowed_commands[0]", "not found in PATH")
	requireProblem(t, ps, "connectors.stdio.allowed_commands[1]", "absolute path")
	requireProblem(t, ps, "secrets.destinations[0].connector")
	requireProblem(t, ps, "secrets.destinations[0].hosts[0]")
	requireProblem(t, ps, "secrets.destinations[1]", "list hosts or commands")
}
