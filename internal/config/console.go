package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults of the console.
const (
	DefaultSessionTTL = 12 * time.Hour
	MaxSessionTTL     = 30 * 24 * time.Hour
)

// ConsoleConfig configures the approvers' console (docs/console.md).
type ConsoleConfig struct {
	// Listen is the console's host:port; empty (the default) means no
	// console. While authentication is off it must be a loopback address.
	Listen string `mapstructure:"listen"`
	// PublicURL is the console's address as people reach it (through a
	// proxy, say): the base of the absolute links in notifications and in
	// the MCP front door's answers. Empty: derived from the listener.
	PublicURL string `mapstructure:"public_url"`
	// SessionTTL is how long a sign-in lasts.
	SessionTTL time.Duration `mapstructure:"session_ttl"`
	// TLS, when its certificate is set, is the console's own; otherwise
	// the console serves with tls.*.
	TLS TLSConfig `mapstructure:"tls"`
}

// consoleTLS is the TLS the console serves with: console.tls if set, else
// tls.*, and the key prefix its problems are reported under.
func (c *Config) consoleTLS() (TLSConfig, string) {
	if c.Console.TLS.Enabled() {
		return c.Console.TLS, "console.tls"
	}
	return c.TLS, "tls"
}

// ConsoleTLS returns the console's TLS configuration (nil: plaintext) and
// the CAs of client certificates it accepts for sign-in (nil: none).
func (c *Config) ConsoleTLS() (*tls.Config, *x509.CertPool, error) {
	t, key := c.consoleTLS()
	if !t.Enabled() {
		return nil, nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%s.cert_file: %w", key, err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	var cas *x509.CertPool
	if t.ClientCAFile != "" {
		if cas, err = loadCAs(t.ClientCAFile); err != nil {
			return nil, nil, fmt.Errorf("%s.client_ca_file: %w", key, err)
		}
		// Asked for, not required: people without a certificate sign in
		// with a token. The authenticator verifies what is presented.
		tc.ClientAuth = tls.RequestClientCert
	}
	return tc, cas, nil
}

// ConsoleSecureCookies reports whether the console's cookies are marked
// Secure: it serves TLS, or people reach it over https through a proxy.
func (c *Config) ConsoleSecureCookies() bool {
	t, _ := c.consoleTLS()
	return t.Enabled() || strings.HasPrefix(strings.ToLower(c.Console.PublicURL), "https://")
}

func (c *Config) validateConsole(p *problems) {
	cc := c.Console
	if cc.SessionTTL < time.Minute || cc.SessionTTL > MaxSessionTTL {
		p.add("console.session_ttl", "must be from 1m to %s, not %s", MaxSessionTTL, cc.SessionTTL)
	}
	if cc.PublicURL != "" {
		u, err := url.Parse(cc.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			p.add("console.public_url", "want an absolute http or https URL without query, such as https://toolsvc.example.com, got %q", cc.PublicURL)
		}
	}
	if cc.TLS.Enabled() {
		c.validateTLSConfig(p, "console.tls", cc.TLS)
	} else if cc.TLS.ClientCAFile != "" {
		p.add("console.tls.client_ca_file", "needs console.tls.cert_file and key_file (without them the console uses tls.*)")
	}
	if cc.Listen == "" {
		return
	}
	host, port, err := splitListen(cc.Listen)
	if err != nil {
		p.add("console.listen", "want host:port (e.g. 127.0.0.1:8080), got %q", cc.Listen)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		p.add("console.listen", "port must be a number from 0 to 65535, got %q", port)
	}
	switch {
	case !c.Auth.Enabled && !loopback(host):
		p.add("console.listen", "%q is not a loopback address: authentication is off (see auth.enabled), so the console only listens on loopback, where anyone may sign in as any principal", cc.Listen)
	case !loopback(host) && !c.ConsoleSecureCookies():
		p.add("console.listen", "%q is not a loopback address and the console has no TLS: set tls.* or console.tls.*, or console.public_url to the https address of the proxy in front of it (tokens and session cookies must not cross a network in the clear)", cc.Listen)
	}
}

// validateTLSConfig checks a TLS section other than tls.* (whose own checks
// are validateTLS's), reporting under key.
func (c *Config) validateTLSConfig(p *problems, key string, t TLSConfig) {
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		p.add(key+".key_file", "required with %s.cert_file", key)
	case t.KeyFile != "" && t.CertFile == "":
		p.add(key+".cert_file", "required with %s.key_file", key)
	default:
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			p.add(key+".cert_file", "with %s.key_file: %v", key, err)
		}
	}
	if t.ClientCAFile != "" {
		if _, err := loadCAs(t.ClientCAFile); err != nil {
			p.add(key+".client_ca_file", "%v", err)
		}
	}
}
