package app

import (
	"crypto/tls"
	"fmt"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/quota"
)

// access is who may call, over what, how often.
type access struct {
	authn    auth.Authenticator
	tls      *tls.Config // nil: plaintext
	limits   *quota.Limiter
	throttle *quota.Throttle
}

// newAccess builds the authenticator, TLS and limits the configuration
// asks for: with authentication on, tokens and client certificates of the
// configured principals and their limits; off, the development
// authenticator and no limits (a caller that names its own principal could
// step around them).
func newAccess(cfg *config.Config, now func() time.Time) (*access, error) {
	a := &access{throttle: quota.NewThrottle(quota.ThrottleOptions{
		PerSource: cfg.Auth.FailureAudit.PerSourcePerMinute, Total: cfg.Auth.FailureAudit.PerMinute, Now: now,
	})}
	tc, clientCAs, err := cfg.ServerTLS()
	if err != nil {
		return nil, err
	}
	a.tls = tc
	if !cfg.Auth.Enabled {
		principals, err := cfg.DevPrincipals()
		if err != nil {
			return nil, err
		}
		if a.authn, err = auth.NewDevAuthenticator(principals); err != nil {
			return nil, fmt.Errorf("principals: %w", err)
		}
		return a, nil
	}
	ids, err := cfg.Identities()
	if err != nil {
		return nil, err
	}
	if a.authn, err = auth.NewVerifier(auth.VerifierOptions{Identities: ids, ClientCAs: clientCAs, Now: now}); err != nil {
		return nil, fmt.Errorf("principals: %w", err)
	}
	def, per := cfg.Limits()
	a.limits = quota.NewLimiter(def, per, now)
	return a, nil
}

// logAccess says at start who may call and how.
func (a *App) logAccess() {
	c := a.cfg
	if !c.Auth.Enabled {
		a.log.Warn("authentication is off: any caller may act as any principal (x-toolsvc-principal metadata); listening on loopback only")
		if c.HasCredentials() {
			a.log.Warn("principals have token_sha256 or certificate_sans, which are ignored while auth.enabled is false")
		}
		return
	}
	tokens, certs := 0, 0
	for _, p := range c.Principals {
		if p.TokenSHA256 != "" {
			tokens++
		}
		if len(p.CertificateSANs) > 0 {
			certs++
		}
	}
	def, _ := c.Limits()
	a.log.Info("authentication on",
		"principals", len(c.Principals), "with_token", tokens, "with_certificate", certs,
		"tls", c.TLS.Enabled(), "client_certificates", c.TLS.ClientCAFile != "",
		"public_health", c.Auth.PublicHealth, "public_reflection", c.Auth.PublicReflection,
		"calls_per_second", def.CallsPerSecond, "burst", def.Burst, "concurrent_executions", def.ConcurrentExecutions)
}
