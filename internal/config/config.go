// Package config owns toolsvc's configuration: its schema and defaults, how
// it is read (a YAML file, TOOLSVC_* environment variables and command-line
// flags, in increasing precedence) and its validation, which reports every
// problem at once, each naming its key.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/gate"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/notify"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/server"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Defaults.
const (
	DefaultListen          = "127.0.0.1:50051"
	DefaultShutdownTimeout = 15 * time.Second
	DefaultShutdownGrace   = server.DefaultShutdownGrace
	DefaultApprovalTTL     = time.Hour
	DefaultPreviewTTL      = 10 * time.Minute
	DefaultLogLevel        = "info"
	DefaultLogFormat       = "json"
	DefaultAuditPageBytes  = server.DefaultAuditPageBytes
	// DefaultAuditRetention keeps the trail for 90 days.
	DefaultAuditRetention = 90 * 24 * time.Hour
)

// Config is the whole configuration of the server. Keys are the mapstructure
// tags, nested with "." (file) or "_" (environment: TOOLSVC_LOG_LEVEL).
type Config struct {
	// Listen is the gRPC listen address, host:port. While authentication is
	// off it must be a loopback address.
	Listen string `mapstructure:"listen"`
	// DatabaseURL selects the Postgres store; empty means the in-memory store.
	DatabaseURL string `mapstructure:"database_url"`
	// Migrate applies pending migrations at start (Postgres only).
	Migrate bool `mapstructure:"migrate"`
	// ToolsFile is a YAML file of tool definitions synced at start.
	ToolsFile string `mapstructure:"tools_file"`
	// DemoTools registers the demo tools. Unset means on with the memory
	// store and off with Postgres; see DemoToolsEnabled.
	DemoTools *bool `mapstructure:"demo_tools"`
	// Log configures the server's log (on stderr).
	Log LogConfig `mapstructure:"log"`
	// ShutdownTimeout bounds how long in-flight calls may run after a
	// shutdown signal.
	ShutdownTimeout time.Duration `mapstructure:"shutdown_timeout"`
	// ShutdownGrace is how long, once ShutdownTimeout has passed and the
	// calls still running were aborted, their outcomes may take to be
	// recorded and answered before the connections close.
	ShutdownGrace time.Duration `mapstructure:"shutdown_grace"`
	// Server holds the server's limits and its store probe.
	Server server.Config `mapstructure:"server"`
	// Audit configures audit pages and retention.
	Audit AuditConfig `mapstructure:"audit"`
	// Auth configures authentication.
	Auth AuthConfig `mapstructure:"auth"`
	// TLS configures TLS and client certificates on the listener.
	TLS TLSConfig `mapstructure:"tls"`
	// PrincipalLimits are every principal's limits on each replica (with
	// authentication on); principals[].limits override them.
	PrincipalLimits LimitsConfig `mapstructure:"principal_limits"`
	// Principals are the identities. With authentication on, each has the
	// credentials that authenticate it (a token hash, certificate names) and
	// nobody else can call. Off, a request naming one of these ids in
	// x-toolsvc-principal gets exactly these roles and scopes, and any other
	// id gets every role and scope.
	Principals []PrincipalConfig `mapstructure:"principals"`
	// Approvals configures approvals.
	Approvals TTLConfig `mapstructure:"approvals"`
	// Previews configures preview tokens.
	Previews TTLConfig `mapstructure:"previews"`
	// Gate configures risk adjusters and the autonomy x risk matrix.
	Gate gate.Config `mapstructure:"gate"`
	// Health configures the tool health state machine.
	Health health.Config `mapstructure:"health"`
	// Idempotency configures call leases, retention and the reaper.
	Idempotency idempotency.Config `mapstructure:"idempotency"`
	// Secrets configures where connectors' credentials come from.
	Secrets SecretsConfig `mapstructure:"secrets"`
	// Metrics configures the operations port (Prometheus metrics, probes).
	Metrics MetricsConfig `mapstructure:"metrics"`
	// Memory bounds the in-memory store (used without database_url).
	Memory MemoryConfig `mapstructure:"memory"`
	// Console configures the approvers' web console.
	Console ConsoleConfig `mapstructure:"console"`
	// Notifications configures webhooks and Slack messages about approvals.
	Notifications notify.Config `mapstructure:"notifications"`
}

// MemoryConfig bounds what the in-memory store keeps, so that a long-running
// process stays within a fixed size whatever the retention settings.
type MemoryConfig struct {
	// MaxCalls bounds the call records kept: past it the oldest finished
	// ones are forgotten, and their keys may run again. 0: no bound.
	MaxCalls int `mapstructure:"max_calls"`
	// MaxAuditEvents bounds the audit events kept: past it the oldest are
	// deleted. 0: no bound.
	MaxAuditEvents int `mapstructure:"max_audit_events"`
}

// MetricsConfig configures the operations port. (Traces and OTLP metrics
// are configured by the standard OTEL_* environment variables.)
type MetricsConfig struct {
	// Listen is the host:port serving GET /metrics and grpc.health.v1 for
	// probes; empty means none. It serves no API, so it may listen beyond
	// loopback.
	Listen string `mapstructure:"listen"`
}

// SecretsConfig configures the secrets store. The environment
// (TOOLSVC_SECRET_<CONNECTOR>_<KEY>) is always looked in; a directory, if
// set, is looked in first.
type SecretsConfig struct {
	// Dir is a directory of secret files, DIR/<connector>/<key>, as
	// Kubernetes mounts a Secret (mount each connector's at DIR/<id>).
	Dir string `mapstructure:"dir"`
}

// LogConfig configures logging.
type LogConfig struct {
	// Level is debug, info, warn or error.
	Level string `mapstructure:"level"`
	// Format is json or text.
	Format string `mapstructure:"format"`
}

// AuditConfig configures the audit trail.
type AuditConfig struct {
	// PageBytes bounds the encoded events of one ListAuditEvents page (a
	// page holds at least one event).
	PageBytes int `mapstructure:"page_bytes"`
	// Retention is how long events are kept; the reaper deletes older ones.
	// 0 keeps them forever.
	Retention time.Duration `mapstructure:"retention"`
	// DetailMaxBytes bounds the encoded detail of each event of a call
	// (arguments, results and messages ride in it); a larger detail is
	// truncated with a marker (audit.EncodeDetail).
	DetailMaxBytes int `mapstructure:"detail_max_bytes"`
}

// TTLConfig is a section with a time to live.
type TTLConfig struct {
	TTL time.Duration `mapstructure:"ttl"`
}

// PrincipalConfig declares an identity.
type PrincipalConfig struct {
	// ID is the principal's id; it is canonicalised (auth.CanonicalPrincipalID).
	ID     string   `mapstructure:"id"`
	Roles  []string `mapstructure:"roles"`
	Scopes []string `mapstructure:"scopes"`
	// MaxAutonomy defaults to AUTONOMOUS.
	MaxAutonomy string `mapstructure:"max_autonomy"`
	// DefaultAutonomy defaults to SUPERVISED, capped by MaxAutonomy.
	DefaultAutonomy string `mapstructure:"default_autonomy"`
	// TokenSHA256 is the SHA-256, in hex, of the bearer token that
	// authenticates the principal (`toolsvc token new` prints both).
	TokenSHA256 string `mapstructure:"token_sha256"`
	// CertificateSANs are URI (with a ":") or DNS subject alternative names
	// of client certificates that authenticate the principal.
	CertificateSANs []string `mapstructure:"certificate_sans"`
	// Limits override principal_limits for this principal.
	Limits *PrincipalLimitsConfig `mapstructure:"limits"`
}

// Default returns the configuration with every default applied.
func Default() *Config {
	return &Config{
		Listen:          DefaultListen,
		Log:             LogConfig{Level: DefaultLogLevel, Format: DefaultLogFormat},
		ShutdownTimeout: DefaultShutdownTimeout,
		ShutdownGrace:   DefaultShutdownGrace,
		Server:          server.DefaultConfig(),
		Audit: AuditConfig{PageBytes: DefaultAuditPageBytes, Retention: DefaultAuditRetention,
			DetailMaxBytes: audit.DefaultDetailMaxBytes},
		Auth:            defaultAuth(),
		PrincipalLimits: defaultLimits(),
		Approvals:       TTLConfig{TTL: DefaultApprovalTTL},
		Previews:        TTLConfig{TTL: DefaultPreviewTTL},
		Gate:            gate.DefaultConfig(),
		Health:          health.DefaultConfig(),
		Idempotency:     idempotency.DefaultConfig(),
		Memory:          MemoryConfig{MaxCalls: memory.DefaultMaxCalls, MaxAuditEvents: memory.DefaultMaxAuditEvents},
		Console:         ConsoleConfig{SessionTTL: DefaultSessionTTL},
		Notifications:   notify.DefaultConfig(),
	}
}

// StoreKind names the store the configuration selects: "memory" or "postgres".
func (c *Config) StoreKind() string {
	if c.DatabaseURL == "" {
		return "memory"
	}
	return "postgres"
}

// DemoToolsEnabled reports whether the demo tools are registered: as set, or
// else on with the memory store and off with Postgres (a production database
// should not fill up with demo tools by accident).
func (c *Config) DemoToolsEnabled() bool {
	if c.DemoTools != nil {
		return *c.DemoTools
	}
	return c.DatabaseURL == ""
}

// Error is an invalid configuration: every problem found, one per line, each
// starting with the key it concerns.
type Error struct {
	Problems []string
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		// Continuation lines of a problem are indented under it.
		lines[i] = strings.ReplaceAll(p, "\n", "\n    ")
	}
	return "invalid configuration:\n  - " + strings.Join(lines, "\n  - ")
}

// problems collects validation problems.
type problems []string

func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, key+": "+fmt.Sprintf(format, args...))
}

// addErr adds the lines of a (possibly joined) error, each prefixed with
// section unless it already names a key in it.
func (p *problems) addErr(section string, err error) {
	for _, line := range errorLines(err) {
		if !strings.HasPrefix(line, section+".") && !strings.HasPrefix(line, section+":") {
			line = section + "." + line
		}
		*p = append(*p, line)
	}
}

// errorLines flattens a joined error into its leaves' messages. A leaf's
// message may span lines (a CEL error shows the expression and a caret).
func errorLines(err error) []string {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, errorLines(e)...)
		}
		return out
	}
	return []string{strings.TrimSpace(err.Error())}
}

// Validate checks the whole configuration and returns an *Error listing every
// problem, or nil.
func (c *Config) Validate() error {
	var p problems
	c.validateListen(&p)
	if c.DatabaseURL != "" {
		// The parser's own messages may quote the URL, password included.
		if _, err := pgconn.ParseConfig(c.DatabaseURL); err != nil {
			p.add("database_url", "not a valid Postgres connection string (want postgres://user:password@host:5432/dbname or key=value pairs)")
		}
	}
	if c.Migrate && c.DatabaseURL == "" {
		p.add("migrate", "needs database_url: the in-memory store has no migrations")
	}
	if c.ToolsFile != "" {
		if _, err := registry.LoadFile(c.ToolsFile); err != nil {
			var fe *registry.FileError
			if errors.As(err, &fe) {
				for _, prob := range fe.Problems {
					p.add("tools_file", "%s", prob)
				}
			} else {
				p.add("tools_file", "%v", err)
			}
		}
	}
	switch strings.ToLower(c.Log.Level) {
	case "debug", "info", "warn", "error":
	default:
		p.add("log.level", "must be debug, info, warn or error, not %q", c.Log.Level)
	}
	switch strings.ToLower(c.Log.Format) {
	case "json", "text":
	default:
		p.add("log.format", "must be json or text, not %q", c.Log.Format)
	}
	if c.ShutdownTimeout <= 0 {
		p.add("shutdown_timeout", "must be positive, not %s", c.ShutdownTimeout)
	}
	if c.ShutdownGrace <= 0 {
		p.add("shutdown_grace", "must be positive, not %s", c.ShutdownGrace)
	}
	p.addErr("server", c.Server.Validate())
	c.validateAudit(&p)
	c.validatePrincipals(&p)
	c.validateAccess(&p)
	switch {
	case c.Approvals.TTL <= 0:
		p.add("approvals.ttl", "must be positive, not %s", c.Approvals.TTL)
	case c.Approvals.TTL > registry.MaxApprovalTTL:
		p.add("approvals.ttl", "must be at most %s, not %s", registry.MaxApprovalTTL, c.Approvals.TTL)
	}
	if c.Previews.TTL <= 0 {
		p.add("previews.ttl", "must be positive, not %s", c.Previews.TTL)
	}
	// Building the gate compiles the CEL adjusters: a mistake in one is a
	// configuration error reported with the rest.
	if _, err := gate.New(c.Gate); err != nil {
		p.addErr("gate", err)
	}
	if c.Secrets.Dir != "" {
		if st, err := os.Stat(c.Secrets.Dir); err != nil {
			p.add("secrets.dir", "%v", err)
		} else if !st.IsDir() {
			p.add("secrets.dir", "%s is not a directory", c.Secrets.Dir)
		}
	}
	p.addErr("health", c.Health.Validate())
	p.addErr("idempotency", c.Idempotency.Validate())
	if c.Memory.MaxCalls < 0 {
		p.add("memory.max_calls", "must not be negative (0: no bound), not %d", c.Memory.MaxCalls)
	}
	if c.Memory.MaxAuditEvents < 0 {
		p.add("memory.max_audit_events", "must not be negative (0: no bound), not %d", c.Memory.MaxAuditEvents)
	}
	c.validateConsole(&p)
	p.addErr("notifications", c.Notifications.Validate())
	if c.Metrics.Listen != "" {
		if _, port, err := net.SplitHostPort(c.Metrics.Listen); err != nil {
			p.add("metrics.listen", "want host:port (e.g. 127.0.0.1:9464 or :9464), got %q", c.Metrics.Listen)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			p.add("metrics.listen", "port must be a number from 0 to 65535, got %q", port)
		}
	}
	if len(p) > 0 {
		return &Error{Problems: p}
	}
	return nil
}

// auditPageReserve is what a ListAuditEvents response needs besides its
// events (framing, the page token).
const auditPageReserve = 64 << 10

func (c *Config) validateAudit(p *problems) {
	switch maxPage := c.Server.MaxSendMessageBytes - auditPageReserve; {
	case c.Audit.PageBytes < 16<<10:
		p.add("audit.page_bytes", "must be at least 16384 (16 KiB), not %d", c.Audit.PageBytes)
	case c.Audit.PageBytes > maxPage:
		p.add("audit.page_bytes", "must be at most server.max_send_message_bytes less 64 KiB (%d), not %d", maxPage, c.Audit.PageBytes)
	}
	if c.Audit.Retention < 0 {
		p.add("audit.retention", "must not be negative (0 keeps events forever), not %s", c.Audit.Retention)
	}
	if n := c.Audit.DetailMaxBytes; n < audit.MinDetailMaxBytes || n > audit.MaxDetailMaxBytes {
		p.add("audit.detail_max_bytes", "must be between %d and %d bytes, not %d", audit.MinDetailMaxBytes, audit.MaxDetailMaxBytes, n)
	}
}

func (c *Config) validateListen(p *problems) {
	host, port, err := splitListen(c.Listen)
	if err != nil {
		p.add("listen", "want host:port (e.g. %s), got %q", DefaultListen, c.Listen)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		p.add("listen", "port must be a number from 0 to 65535, got %q", port)
	}
	if !c.Auth.Enabled && !loopback(host) {
		p.add("listen", "%q is not a loopback address: authentication is off (see auth.enabled), so toolsvc only listens on loopback (127.0.0.1, ::1 or localhost); anyone who can connect may act as any principal", c.Listen)
	}
}

func splitListen(listen string) (host, port string, err error) {
	return net.SplitHostPort(listen)
}

// loopback reports whether host only ever means this machine. An empty host
// means every interface.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.IsLoopback()
}

func (c *Config) validatePrincipals(p *problems) {
	seen := map[string]int{}
	for i, pc := range c.Principals {
		key := fmt.Sprintf("principals[%d]", i)
		if id, err := auth.CanonicalPrincipalID(pc.ID); err != nil {
			p.add(key+".id", "%v", err)
		} else if j, dup := seen[id]; dup {
			p.add(key+".id", "%q is also principals[%d] (ids are compared as %q: trimmed, NFC, lowercase)", pc.ID, j, id)
		} else {
			seen[id] = i
		}
		if len(pc.Roles) == 0 {
			p.add(key+".roles", "at least one role is required (agent, approver, operator)")
		}
		for j, r := range pc.Roles {
			if _, err := auth.ParseRole(r); err != nil {
				p.add(fmt.Sprintf("%s.roles[%d]", key, j), "%v", err)
			}
		}
		for j, s := range pc.Scopes {
			if strings.TrimSpace(s) == "" {
				p.add(fmt.Sprintf("%s.scopes[%d]", key, j), "must not be empty")
			}
		}
		maxA, errMax := parseAutonomy(pc.MaxAutonomy, toolkit.AutonomyAutonomous)
		if errMax != nil {
			p.add(key+".max_autonomy", "%v", errMax)
		}
		if pc.DefaultAutonomy != "" {
			def, err := parseAutonomy(pc.DefaultAutonomy, toolkit.AutonomySupervised)
			switch {
			case err != nil:
				p.add(key+".default_autonomy", "%v", err)
			case errMax == nil && def > maxA:
				p.add(key+".default_autonomy", "%s is above max_autonomy %s", def, maxA)
			}
		}
	}
}

func parseAutonomy(s string, def toolkit.AutonomyLevel) (toolkit.AutonomyLevel, error) {
	if strings.TrimSpace(s) == "" {
		return def, nil
	}
	return toolkit.ParseAutonomyLevel(s)
}

// DevPrincipals returns the configured principals (without their
// credentials), their ids canonical. Call it on a validated configuration.
func (c *Config) DevPrincipals() ([]*auth.Principal, error) {
	out := make([]*auth.Principal, 0, len(c.Principals))
	for i, pc := range c.Principals {
		id, err := auth.CanonicalPrincipalID(pc.ID)
		if err != nil {
			return nil, fmt.Errorf("principals[%d].id: %w", i, err)
		}
		pr := &auth.Principal{ID: id, Scopes: slices.Clone(pc.Scopes)}
		for _, r := range pc.Roles {
			role, err := auth.ParseRole(r)
			if err != nil {
				return nil, fmt.Errorf("principals[%d]: %w", i, err)
			}
			if !slices.Contains(pr.Roles, role) {
				pr.Roles = append(pr.Roles, role)
			}
		}
		if pr.MaxAutonomy, err = parseAutonomy(pc.MaxAutonomy, toolkit.AutonomyAutonomous); err != nil {
			return nil, fmt.Errorf("principals[%d].max_autonomy: %w", i, err)
		}
		if pr.DefaultAutonomy, err = parseAutonomy(pc.DefaultAutonomy, toolkit.AutonomySupervised); err != nil {
			return nil, fmt.Errorf("principals[%d].default_autonomy: %w", i, err)
		}
		// An unset default never exceeds the maximum.
		pr.DefaultAutonomy = min(pr.DefaultAutonomy, pr.MaxAutonomy)
		out = append(out, pr)
	}
	return out, nil
}
