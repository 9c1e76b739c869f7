package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/quota"
)

// Defaults of authentication, TLS and the per-principal limits.
const (
	DefaultCallsPerSecond       = 50
	DefaultBurst                = 100
	DefaultConcurrentExecutions = 16
	DefaultFailureAuditPerPeer  = 30
	DefaultFailureAuditTotal    = 600
)

// AuthConfig configures authentication.
type AuthConfig struct {
	// Enabled turns authentication on: every call presents a bearer token
	// or a client certificate of a configured principal, and the
	// x-toolsvc-principal metadata is refused. Off (the development
	// default), a caller names its principal and toolsvc listens on
	// loopback only.
	Enabled bool `mapstructure:"enabled"`
	// PublicHealth leaves grpc.health.v1 open to callers without
	// credentials (load balancers and probes). With authentication on and
	// this false, health checks need the credentials of any principal.
	PublicHealth bool `mapstructure:"public_health"`
	// PublicReflection does the same for gRPC server reflection (grpcurl
	// uses it to learn the API; it reveals only what the protos say).
	PublicReflection bool `mapstructure:"public_reflection"`
	// FailureAudit bounds the audit events of refused authentication and of
	// calls refused by the per-principal limits.
	FailureAudit FailureAuditConfig `mapstructure:"failure_audit"`
}

// FailureAuditConfig bounds the audit events of failed authentication (per
// peer address) and of per-principal limit refusals (per principal): a
// flood of them must not flood the audit table. Events left out are counted
// in the next event of the same source ("suppressed" in its detail).
type FailureAuditConfig struct {
	// PerSourcePerMinute is how many such events one peer address or
	// principal may leave per minute.
	PerSourcePerMinute int `mapstructure:"per_source_per_minute"`
	// PerMinute is how many all sources together may leave per minute.
	PerMinute int `mapstructure:"per_minute"`
}

// TLSConfig configures TLS on the listener.
type TLSConfig struct {
	// CertFile and KeyFile are the server's certificate chain and private
	// key (PEM). Set both to serve TLS.
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
	// ClientCAFile holds the CA certificates (PEM) that sign client
	// certificates. Set, the server asks for a client certificate (mTLS);
	// a caller may still present a bearer token instead.
	ClientCAFile string `mapstructure:"client_ca_file"`
}

// Enabled reports whether TLS is configured.
func (t TLSConfig) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// LimitsConfig are the limits of each principal on each replica (a zero
// field: no limit). They apply with authentication on; off, a caller names
// its own principal and could step around them.
type LimitsConfig struct {
	// CallsPerSecond is the sustained rate of RPCs of one principal.
	CallsPerSecond float64 `mapstructure:"calls_per_second"`
	// Burst is how many RPCs may come at once above the rate (0: the rate,
	// rounded up).
	Burst int `mapstructure:"burst"`
	// ConcurrentExecutions bounds one principal's ExecuteTool calls in
	// progress.
	ConcurrentExecutions int `mapstructure:"concurrent_executions"`
}

// PrincipalLimitsConfig overrides the principal_limits of one principal;
// unset fields keep them.
type PrincipalLimitsConfig struct {
	CallsPerSecond       *float64 `mapstructure:"calls_per_second"`
	Burst                *int     `mapstructure:"burst"`
	ConcurrentExecutions *int     `mapstructure:"concurrent_executions"`
}

func (l LimitsConfig) quota() quota.Limits {
	return quota.Limits{CallsPerSecond: l.CallsPerSecond, Burst: l.Burst, ConcurrentExecutions: l.ConcurrentExecutions}
}

func (o *PrincipalLimitsConfig) apply(l LimitsConfig) LimitsConfig {
	if o == nil {
		return l
	}
	if o.CallsPerSecond != nil {
		l.CallsPerSecond = *o.CallsPerSecond
	}
	if o.Burst != nil {
		l.Burst = *o.Burst
	}
	if o.ConcurrentExecutions != nil {
		l.ConcurrentExecutions = *o.ConcurrentExecutions
	}
	return l
}

func defaultAuth() AuthConfig {
	return AuthConfig{
		PublicHealth: true, PublicReflection: true,
		FailureAudit: FailureAuditConfig{PerSourcePerMinute: DefaultFailureAuditPerPeer, PerMinute: DefaultFailureAuditTotal},
	}
}

func defaultLimits() LimitsConfig {
	return LimitsConfig{CallsPerSecond: DefaultCallsPerSecond, Burst: DefaultBurst, ConcurrentExecutions: DefaultConcurrentExecutions}
}

// validateAccess checks authentication, TLS, the limits and the principals'
// credentials. Listening beyond loopback is judged in validateListen.
func (c *Config) validateAccess(p *problems) {
	if c.Auth.FailureAudit.PerSourcePerMinute < 0 {
		p.add("auth.failure_audit.per_source_per_minute", "must not be negative (0 audits none), not %d", c.Auth.FailureAudit.PerSourcePerMinute)
	}
	if c.Auth.FailureAudit.PerMinute < 0 {
		p.add("auth.failure_audit.per_minute", "must not be negative (0: no limit beyond per_source_per_minute), not %d", c.Auth.FailureAudit.PerMinute)
	}
	if err := c.PrincipalLimits.quota().Validate(); err != nil {
		p.add("principal_limits", "%v", err)
	}
	c.validateTLS(p)
	if c.Auth.Enabled && len(c.Principals) == 0 {
		p.add("principals", "auth.enabled is true but no principal is configured: nobody could call; add principals with token_sha256 or certificate_sans")
	}
	tokens := map[auth.TokenHash]int{}
	sans := map[string]int{}
	for i, pc := range c.Principals {
		key := fmt.Sprintf("principals[%d]", i)
		if c.Auth.Enabled && strings.TrimSpace(pc.TokenSHA256) == "" && len(pc.CertificateSANs) == 0 {
			p.add(key, "principal %q has no credential: with auth.enabled, set token_sha256 (from `toolsvc token new`) or certificate_sans", pc.ID)
		}
		if pc.TokenSHA256 != "" {
			h, err := auth.ParseTokenHash(pc.TokenSHA256)
			switch j, dup := tokens[h]; {
			case err != nil && strings.Trim(pc.TokenSHA256, "0123456789.+-eE") == "":
				p.add(key+".token_sha256", "%v; YAML read this one as a number: put the hash in quotes", err)
			case err != nil:
				p.add(key+".token_sha256", "%v", err)
			case dup:
				p.add(key+".token_sha256", "is also principals[%d].token_sha256: one token names one principal", j)
			default:
				tokens[h] = i
			}
		}
		if len(pc.CertificateSANs) > 0 && c.TLS.ClientCAFile == "" {
			p.add(key+".certificate_sans", "client certificates need tls.client_ca_file (the CA that signs them)")
		}
		for j, s := range pc.CertificateSANs {
			k, err := auth.SANKey(s)
			switch prev, dup := sans[k]; {
			case err != nil:
				p.add(fmt.Sprintf("%s.certificate_sans[%d]", key, j), "%v", err)
			case dup:
				p.add(fmt.Sprintf("%s.certificate_sans[%d]", key, j), "%q also names principals[%d]: one certificate name names one principal", s, prev)
			default:
				sans[k] = i
			}
		}
		if pc.Limits != nil {
			if err := pc.Limits.apply(c.PrincipalLimits).quota().Validate(); err != nil {
				p.add(key+".limits", "%v", err)
			}
		}
	}
	if c.Auth.Enabled && len(tokens) > 0 && !c.TLS.Enabled() {
		if host, _, err := splitListen(c.Listen); err == nil && !loopback(host) {
			p.add("tls.cert_file", "bearer tokens would cross the network in plaintext: listen is %q, not loopback, and TLS is off; set tls.cert_file and tls.key_file (or listen on loopback behind a proxy that terminates TLS)", c.Listen)
		}
	}
}

// validateTLS checks that the TLS files are given together and load.
func (c *Config) validateTLS(p *problems) {
	t := c.TLS
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		p.add("tls.key_file", "required with tls.cert_file: the server's private key (PEM)")
	case t.KeyFile != "" && t.CertFile == "":
		p.add("tls.cert_file", "required with tls.key_file: the server's certificate chain (PEM)")
	case t.CertFile != "":
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			p.add("tls.cert_file", "with tls.key_file: %v", err)
		}
	}
	if t.ClientCAFile != "" {
		if !t.Enabled() {
			p.add("tls.client_ca_file", "client certificates need TLS: set tls.cert_file and tls.key_file")
		}
		if _, err := loadCAs(t.ClientCAFile); err != nil {
			p.add("tls.client_ca_file", "%v", err)
		}
	}
}

// loadCAs reads a PEM file of CA certificates.
func loadCAs(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: certificate %d: %v", file, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// ServerTLS returns the listener's TLS configuration and the pool of client
// CAs (nil without client certificates), or nil without TLS. Call it on a
// validated configuration.
//
// A client certificate is requested but not verified in the handshake: the
// authenticator verifies it per call, so that a wrong, expired or unknown
// certificate is answered UNAUTHENTICATED and audited like a bad token
// rather than as a broken connection. The handshake still proves that the
// client holds the certificate's key.
func (c *Config) ServerTLS() (*tls.Config, *x509.CertPool, error) {
	if !c.TLS.Enabled() {
		return nil, nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("tls.cert_file: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	var cas *x509.CertPool
	if c.TLS.ClientCAFile != "" {
		if cas, err = loadCAs(c.TLS.ClientCAFile); err != nil {
			return nil, nil, fmt.Errorf("tls.client_ca_file: %w", err)
		}
		tc.ClientAuth = tls.RequestClientCert
	}
	return tc, cas, nil
}

// Identities returns the principals with their credentials, for the
// authenticator of a server with authentication on. Call it on a validated
// configuration.
func (c *Config) Identities() ([]auth.Identity, error) {
	ps, err := c.DevPrincipals()
	if err != nil {
		return nil, err
	}
	out := make([]auth.Identity, len(ps))
	for i, pc := range c.Principals {
		out[i] = auth.Identity{Principal: ps[i], SANs: pc.CertificateSANs}
		if pc.TokenSHA256 != "" {
			h, err := auth.ParseTokenHash(pc.TokenSHA256)
			if err != nil {
				return nil, fmt.Errorf("principals[%d].token_sha256: %w", i, err)
			}
			out[i].TokenHashes = []auth.TokenHash{h}
		}
	}
	return out, nil
}

// Limits returns the default limits and those of each principal whose own
// differ, by canonical id. Call it on a validated configuration.
func (c *Config) Limits() (quota.Limits, map[string]quota.Limits) {
	per := map[string]quota.Limits{}
	for _, pc := range c.Principals {
		if pc.Limits == nil {
			continue
		}
		if id, err := auth.CanonicalPrincipalID(pc.ID); err == nil {
			per[id] = pc.Limits.apply(c.PrincipalLimits).quota()
		}
	}
	return c.PrincipalLimits.quota(), per
}

// HasCredentials reports whether any principal has a token or certificate
// name configured (which only matter with authentication on).
func (c *Config) HasCredentials() bool {
	for _, pc := range c.Principals {
		if pc.TokenSHA256 != "" || len(pc.CertificateSANs) > 0 {
			return true
		}
	}
	return false
}
