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
	"github.com/toolsvc/toolsvc/internal/connector"
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
	// DefaultAutonomy is a configured principal's default_autonomy, and its
	// max_autonomy unless it says otherwise.
	DefaultAutonomy = toolkit.AutonomySupervised
)

// Config is the whole configuration of the server. Keys are the mapstructure
// tags, nested with "." (file) or "_" (environment: TOOLSVC_LOG_LEVEL).
type Config struct {
	// Listen is the gRPC listen address, host:port. While authentication is
	// off it must be a loopback address.
	Listen string `mapstructure:"listen"`
	// DatabaseURL selects the Postgres store; empty means the in-memory store.
	DatabaseURL string `mapstructure:"database_url"`
	// Store names the store: "memory", "postgres", or empty to follow
	// DatabaseURL. With authentication on and no DatabaseURL, "memory" must
	// be said explicitly: a production server that lost its database URL
	// must not come up on a store that forgets everything at restart.
	Store string `mapstructure:"store"`
	// Migrate applies pending migrations at start (Postgres only).
	Migrate bool `mapstructure:"migrate"`
	// ToolsFile is a YAML file of tool definitions synced at start.
	ToolsFile string `mapstructure:"tools_file"`
	// DemoTools registers the demo tools. Unset means on with the memory
	// store and authentication off, off otherwise; see DemoToolsEnabled.
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
	Approvals ApprovalsConfig `mapstructure:"approvals"`
	// Parked bounds what callers may park behind approvals and previews.
	Parked ParkedConfig `mapstructure:"parked"`
	// Previews configures preview tokens.
	Previews TTLConfig `mapstructure:"previews"`
	// Gate configures risk adjusters and the autonomy x risk matrix.
	Gate gate.Config `mapstructure:"gate"`
	// Health configures the tool health state machine.
	Health health.Config `mapstructure:"health"`
	// Idempotency configures call leases, retention and the reaper.
	Idempotency idempotency.Config `mapstructure:"idempotency"`
	// Secrets configures where connectors' credentials come from, and where
	// they may go.
	Secrets SecretsConfig `mapstructure:"secrets"`
	// Connectors configures what connectors registered through the API may
	// do.
	Connectors ConnectorsConfig `mapstructure:"connectors"`
	// Metrics configures the operations port (Prometheus metrics, probes).
	Metrics MetricsConfig `mapstructure:"metrics"`
	// Memory bounds the in-memory store (used without database_url).
	Memory MemoryConfig `mapstructure:"memory"`
	// MCP configures the MCP front door.
	MCP MCPConfig `mapstructure:"mcp"`
	// Nested bounds the calls native tools make as steps of theirs.
	Nested NestedConfig `mapstructure:"nested"`
	// Console configures the approvers' web console.
	Console ConsoleConfig `mapstructure:"console"`
	// Notifications configures webhooks and Slack messages about approvals.
	Notifications notify.Config `mapstructure:"notifications"`
}

// NestedConfig bounds nested calls: the steps a native tool's call runs
// through the pipeline (docs/native-tools.md).
type NestedConfig struct {
	// MaxDepth bounds how deeply calls nest: a call's steps are at depth 1,
	// their steps at 2. A step deeper than this is refused
	// (NESTING_TOO_DEEP).
	MaxDepth int `mapstructure:"max_depth"`
}

// Bounds of nested.max_depth.
const (
	DefaultNestedMaxDepth = 4
	MaxNestedMaxDepth     = 16
)

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
	// MaxConnections bounds the connections open at once on it; past it,
	// new ones wait until one closes. A connection that has not sent its
	// request headers within server.handshake_timeout is closed.
	MaxConnections int `mapstructure:"max_connections"`
}

// DefaultMetricsMaxConnections is far more than scrapers and probes need.
const DefaultMetricsMaxConnections = 64

// SecretsConfig configures the secrets store. The environment
// (TOOLSVC_SECRET_<CONNECTOR>_<KEY>) is always looked in; a directory, if
// set, is looked in first.
type SecretsConfig struct {
	// Dir is a directory of secret files, DIR/<connector>/<key>, as
	// Kubernetes mounts a Secret (mount each connector's at DIR/<id>).
	Dir string `mapstructure:"dir"`
	// Destinations list where connectors' secrets may be sent besides where
	// the tools file declares them: a connector registered or changed
	// through the API that references secrets must send them to one of
	// these (docs/connectors.md#threat-model).
	Destinations []SecretDestinationConfig `mapstructure:"destinations"`
}

// SecretDestinationConfig lists where one connector's secrets (every key,
// or one) may be sent.
type SecretDestinationConfig struct {
	// Connector is the connector id.
	Connector string `mapstructure:"connector"`
	// Key, if set, limits the entry to that secret of the connector.
	Key string `mapstructure:"key"`
	// Hosts are "host" (any port, either scheme), "host:port" or
	// "https://host[:port]": where an HTTP connector's base_url or an MCP
	// connector's url may point.
	Hosts []string `mapstructure:"hosts"`
	// Commands are programs (absolute paths, or names resolved in PATH at
	// start) of stdio MCP connectors that may be given the secrets.
	Commands []string `mapstructure:"commands"`
}

// ConnectorsConfig configures what connectors registered through the API
// may do. Connectors declared in the tools file are the server's own
// configuration and are not limited by it.
type ConnectorsConfig struct {
	// Stdio configures MCP connectors over stdio.
	Stdio StdioConfig `mapstructure:"stdio"`
}

// StdioConfig configures MCP connectors over stdio.
type StdioConfig struct {
	// AllowedCommands are the programs a stdio connector registered
	// through the API may run: absolute paths, or names resolved in PATH
	// at start (a name that is not found is a configuration error). Empty
	// (the default): commands come from the tools file only.
	AllowedCommands []string `mapstructure:"allowed_commands"`
}

// TrustConfig is the connector trust rules of c, anchored on the tools
// file's connectors (anchors, by id).
func (c *Config) TrustConfig(anchors map[string]*connector.Spec) connector.TrustConfig {
	tc := connector.TrustConfig{AllowedCommands: c.Connectors.Stdio.AllowedCommands, Anchors: anchors, Reserved: ReservedSecretIDs()}
	for _, d := range c.Secrets.Destinations {
		tc.Destinations = append(tc.Destinations, connector.Destination{
			Connector: d.Connector, Key: d.Key, Hosts: d.Hosts, Commands: d.Commands,
		})
	}
	return tc
}

// ReservedSecretIDs are the secrets ids toolsvc reads for itself: the
// approvers' notifications read theirs under "notifications". No
// connector's secret may be read from their namespace.
func ReservedSecretIDs() []string { return []string{"notifications"} }

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

// ApprovalsConfig configures approvals.
type ApprovalsConfig struct {
	// TTL is how long an approval stays valid unless its tool says
	// otherwise.
	TTL time.Duration `mapstructure:"ttl"`
	// PageBytes bounds the encoded approvals of one ListApprovals page (a
	// page holds at least one), as audit.page_bytes does audit pages.
	PageBytes int `mapstructure:"page_bytes"`
}

// ParkedConfig bounds the calls parked behind approvals and previews: each
// call's arguments, and per principal how many calls and how many bytes.
// Parked calls are held until resolved or expired, whatever bounds the
// stores keep otherwise, so these are what keep them bounded.
type ParkedConfig struct {
	// MaxArgumentBytes bounds the arguments (canonical JSON) of a call that
	// would wait for an approval or a preview; a larger one is refused
	// RESOURCE_EXHAUSTED ARGUMENTS_TOO_LARGE.
	MaxArgumentBytes int `mapstructure:"max_argument_bytes"`
	// MaxCallsPerPrincipal bounds the calls one principal has parked at
	// once; 0: no bound.
	MaxCallsPerPrincipal int `mapstructure:"max_calls_per_principal"`
	// MaxBytesPerPrincipal bounds the bytes they hold (approval arguments,
	// preview messages and values); 0: no bound.
	MaxBytesPerPrincipal int64 `mapstructure:"max_bytes_per_principal"`
}

func defaultParked() ParkedConfig {
	return ParkedConfig{MaxArgumentBytes: DefaultParkedArgumentBytes, MaxCallsPerPrincipal: DefaultParkedCallsPerPrincipal,
		MaxBytesPerPrincipal: DefaultParkedBytesPerPrincipal}
}

// Defaults of the parked bounds: arguments a person can still read, and per
// principal enough pending work for any agent, at most a few MiB of it.
const (
	DefaultParkedArgumentBytes     = 256 << 10
	DefaultParkedCallsPerPrincipal = 100
	DefaultParkedBytesPerPrincipal = 8 << 20
)

// PrincipalConfig declares an identity.
type PrincipalConfig struct {
	// ID is the principal's id; it is canonicalised (auth.CanonicalPrincipalID).
	ID     string   `mapstructure:"id"`
	Roles  []string `mapstructure:"roles"`
	Scopes []string `mapstructure:"scopes"`
	// MaxAutonomy is the most autonomy a request may ask for; it defaults
	// to DefaultAutonomy, so that only a principal configured for more
	// gets more (an approver asking for AUTONOMOUS must not turn a HIGH
	// risk call's approval into a preview it confirms itself).
	MaxAutonomy string `mapstructure:"max_autonomy"`
	// DefaultAutonomy applies to requests that ask for none; it defaults
	// to SUPERVISED, capped by MaxAutonomy.
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
		Approvals:       ApprovalsConfig{TTL: DefaultApprovalTTL, PageBytes: DefaultAuditPageBytes},
		Parked:          defaultParked(),
		Previews:        TTLConfig{TTL: DefaultPreviewTTL},
		Gate:            gate.DefaultConfig(),
		Health:          health.DefaultConfig(),
		Idempotency:     idempotency.DefaultConfig(),
		Memory:          MemoryConfig{MaxCalls: memory.DefaultMaxCalls, MaxAuditEvents: memory.DefaultMaxAuditEvents},
		MCP:             defaultMCP(),
		Nested:          NestedConfig{MaxDepth: DefaultNestedMaxDepth},
		Metrics:         MetricsConfig{MaxConnections: DefaultMetricsMaxConnections},
		Console:         ConsoleConfig{SessionTTL: DefaultSessionTTL},
		Notifications:   notify.DefaultConfig(),
	}
}

// Store kinds (the store key).
const (
	StoreMemory   = "memory"
	StorePostgres = "postgres"
)

// StoreKind names the store the configuration selects: "memory" or "postgres".
func (c *Config) StoreKind() string {
	if c.DatabaseURL == "" {
		return StoreMemory
	}
	return StorePostgres
}

// DemoToolsEnabled reports whether the demo tools are registered: as set, or
// else on only for the development default, the memory store with
// authentication off (a production database, or a server that callers
// authenticate to, should not offer demo tools by accident).
func (c *Config) DemoToolsEnabled() bool {
	if c.DemoTools != nil {
		return *c.DemoTools
	}
	return c.DatabaseURL == "" && !c.Auth.Enabled
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
	c.validateStore(&p)
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
	c.validateMCP(&p)
	if c.Nested.MaxDepth < 1 || c.Nested.MaxDepth > MaxNestedMaxDepth {
		p.add("nested.max_depth", "must be between 1 and %d, not %d", MaxNestedMaxDepth, c.Nested.MaxDepth)
	}
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
	if _, err := connector.NewTrust(c.TrustConfig(nil)); err != nil {
		for _, line := range errorLines(err) {
			p = append(p, line)
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
	if c.Metrics.MaxConnections < 1 {
		p.add("metrics.max_connections", "must be positive, not %d", c.Metrics.MaxConnections)
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

// validateStore checks the store key against database_url, and refuses the
// memory store with authentication on unless it is asked for by name.
func (c *Config) validateStore(p *problems) {
	switch strings.ToLower(strings.TrimSpace(c.Store)) {
	case "":
		if c.Auth.Enabled && c.DatabaseURL == "" {
			p.add("database_url", "authentication is on but no database is configured: set database_url "+
				"(TOOLSVC_DATABASE_URL), or set store: memory to run on the in-memory store on purpose "+
				"(everything is lost at restart, and it holds at most memory.max_calls calls)")
		}
	case StoreMemory:
		if c.DatabaseURL != "" {
			p.add("store", "is memory, but database_url is set too: remove one of them")
		}
	case StorePostgres:
		if c.DatabaseURL == "" {
			p.add("store", "is postgres, but database_url is empty: set database_url (TOOLSVC_DATABASE_URL)")
		}
	default:
		p.add("store", "must be memory or postgres (or empty: postgres with database_url, else memory), not %q", c.Store)
	}
}

// auditPageReserve is what a ListAuditEvents response needs besides its
// events (framing, the page token).
const auditPageReserve = 64 << 10

func (c *Config) validateAudit(p *problems) {
	maxPage := c.Server.MaxSendMessageBytes - auditPageReserve
	for key, v := range map[string]int{"audit.page_bytes": c.Audit.PageBytes, "approvals.page_bytes": c.Approvals.PageBytes} {
		switch {
		case v < 16<<10:
			p.add(key, "must be at least 16384 (16 KiB), not %d", v)
		case v > maxPage:
			p.add(key, "must be at most server.max_send_message_bytes less 64 KiB (%d), not %d", maxPage, v)
		}
	}
	// A parked call's arguments must fit whole in one GetApproval answer.
	switch a := c.Parked.MaxArgumentBytes; {
	case a < 1<<10:
		p.add("parked.max_argument_bytes", "must be at least 1024 (1 KiB), not %d", a)
	case a > maxPage:
		p.add("parked.max_argument_bytes", "must be at most server.max_send_message_bytes less 64 KiB (%d), so that an approval's arguments can be read whole, not %d", maxPage, a)
	}
	if c.Parked.MaxCallsPerPrincipal < 0 {
		p.add("parked.max_calls_per_principal", "must not be negative (0: no bound), not %d", c.Parked.MaxCallsPerPrincipal)
	}
	switch b := c.Parked.MaxBytesPerPrincipal; {
	case b < 0:
		p.add("parked.max_bytes_per_principal", "must not be negative (0: no bound), not %d", b)
	case b > 0 && b < int64(c.Parked.MaxArgumentBytes):
		p.add("parked.max_bytes_per_principal", "must be at least parked.max_argument_bytes (%d), or 0 for no bound, not %d", c.Parked.MaxArgumentBytes, b)
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
		def, errDef := parseAutonomy(pc.DefaultAutonomy, DefaultAutonomy)
		if errDef != nil {
			p.add(key+".default_autonomy", "%v", errDef)
		}
		if pc.MaxAutonomy != "" {
			maxA, err := parseAutonomy(pc.MaxAutonomy, def)
			switch {
			case err != nil:
				p.add(key+".max_autonomy", "%v", err)
			case errDef == nil && pc.DefaultAutonomy != "" && def > maxA:
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
		if pr.DefaultAutonomy, err = parseAutonomy(pc.DefaultAutonomy, DefaultAutonomy); err != nil {
			return nil, fmt.Errorf("principals[%d].default_autonomy: %w", i, err)
		}
		// An unset maximum is the default: a principal asks for more
		// autonomy than it gets by default only if the configuration says
		// it may.
		if pr.MaxAutonomy, err = parseAutonomy(pc.MaxAutonomy, pr.DefaultAutonomy); err != nil {
			return nil, fmt.Errorf("principals[%d].max_autonomy: %w", i, err)
		}
		// An unset default never exceeds the maximum.
		pr.DefaultAutonomy = min(pr.DefaultAutonomy, pr.MaxAutonomy)
		out = append(out, pr)
	}
	return out, nil
}
