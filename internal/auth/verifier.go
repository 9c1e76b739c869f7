package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Identity is a principal and the credentials that authenticate it.
type Identity struct {
	Principal *Principal
	// TokenHashes are the hashes of the bearer tokens that authenticate the
	// principal (several while a token is being replaced).
	TokenHashes []TokenHash
	// SANs are subject alternative names of client certificates that
	// authenticate the principal: URIs (an entry with a ":", such as
	// spiffe://example.org/agent) and DNS names (any other entry).
	SANs []string
}

// VerifierOptions configure a Verifier.
type VerifierOptions struct {
	Identities []Identity
	// ClientCAs verify client certificates; nil refuses every certificate.
	ClientCAs *x509.CertPool
	// Now is the clock certificates are checked against; nil means time.Now.
	Now func() time.Time
}

// Verifier authenticates requests by bearer token and by client
// certificate, the authenticator of a server with authentication on. A
// request presents a token, a certificate or both (then both must name the
// same principal); the x-toolsvc-principal metadata is refused.
type Verifier struct {
	tokens []tokenEntry
	sans   map[string]*Principal
	roots  *x509.CertPool
	now    func() time.Time

	// checked remembers what chains of certificates were found to be, so
	// that a connection's certificate is verified once rather than on every
	// call (a chain verification costs about as much as a database round
	// trip). What depends on the time — the validity period — is checked on
	// every call.
	mu      sync.Mutex
	checked map[[sha256.Size]byte]checkedChain
}

// maxCheckedChains bounds the remembered chains; when it is reached they are
// all forgotten.
const maxCheckedChains = 4096

// checkedChain is what a certificate chain was found to be: its principal
// while it is valid, or why it was refused.
type checkedChain struct {
	principal           *Principal
	refusal             error
	notBefore, notAfter time.Time
	leafNotAfter        time.Time
}

type tokenEntry struct {
	hash      TokenHash
	principal *Principal
}

var _ Authenticator = (*Verifier)(nil)

// NewVerifier checks the identities — canonical, unique ids; at least one
// credential each; no credential shared by two principals; certificate
// names only with ClientCAs — and returns their Verifier.
func NewVerifier(o VerifierOptions) (*Verifier, error) {
	v := &Verifier{sans: map[string]*Principal{}, roots: o.ClientCAs, now: o.Now, checked: map[[sha256.Size]byte]checkedChain{}}
	if v.now == nil {
		v.now = time.Now
	}
	ids := map[string]bool{}
	tokens := map[TokenHash]string{}
	var errs []error
	for i, ident := range o.Identities {
		p := ident.Principal
		if p == nil {
			errs = append(errs, fmt.Errorf("identity %d has no principal", i))
			continue
		}
		if err := checkCanonical(p.ID); err != nil {
			errs = append(errs, fmt.Errorf("identity %d: %w", i, err))
			continue
		}
		if ids[p.ID] {
			errs = append(errs, fmt.Errorf("principal %q is configured twice", p.ID))
			continue
		}
		ids[p.ID] = true
		if len(ident.TokenHashes) == 0 && len(ident.SANs) == 0 {
			errs = append(errs, fmt.Errorf("principal %q has no credential (a token hash or a certificate name)", p.ID))
		}
		p = clonePrincipal(p)
		for _, h := range ident.TokenHashes {
			if other, dup := tokens[h]; dup {
				errs = append(errs, fmt.Errorf("principals %q and %q have the same token", other, p.ID))
				continue
			}
			tokens[h] = p.ID
			v.tokens = append(v.tokens, tokenEntry{hash: h, principal: p})
		}
		if len(ident.SANs) > 0 && o.ClientCAs == nil {
			errs = append(errs, fmt.Errorf("principal %q is named by certificates, but no client CA is configured", p.ID))
		}
		for _, s := range ident.SANs {
			key, err := SANKey(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("principal %q: %w", p.ID, err))
				continue
			}
			if other, dup := v.sans[key]; dup {
				errs = append(errs, fmt.Errorf("principals %q and %q are both named by the certificate name %s", other.ID, p.ID, s))
				continue
			}
			v.sans[key] = p
		}
	}
	if len(ids) == 0 {
		errs = append(errs, errors.New("no principals: nobody could call"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return v, nil
}

// SANKey returns the form in which a certificate name is compared: URIs
// (entries with a ":") as parsed and printed again, DNS names in lowercase
// without a trailing dot. Wildcards are not names of a principal.
func SANKey(s string) (string, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, ":") {
		u, err := url.Parse(s)
		if err != nil || u.Scheme == "" || (u.Host == "" && u.Opaque == "" && u.Path == "") {
			return "", fmt.Errorf("certificate name %q is not a URI (such as spiffe://example.org/agent)", s)
		}
		return "uri:" + u.String(), nil
	}
	name := strings.TrimSuffix(strings.ToLower(s), ".")
	if !dnsName(name) {
		return "", fmt.Errorf("certificate name %q is neither a URI (spiffe://example.org/agent) nor a DNS name (agent.example.org; no wildcards)", s)
	}
	return "dns:" + name, nil
}

// dnsName reports whether s is a DNS name of LDH labels.
func dnsName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') && c != '-' {
				return false
			}
		}
	}
	return true
}

// Authenticate returns the principal the request's token or certificate
// names.
func (v *Verifier) Authenticate(_ context.Context, c Credentials) (*Principal, error) {
	if len(c.PrincipalHeader) > 0 {
		return nil, refuse(CausePrincipalHeader,
			"the %s metadata is not accepted: authentication is on; present a bearer token or a client certificate", PrincipalHeader)
	}
	token, err := bearerToken(c.Authorization)
	if err != nil {
		return nil, err
	}
	var byToken, byCert *Principal
	if token != "" {
		if byToken = v.tokenPrincipal(HashToken(token)); byToken == nil {
			return nil, refuse(CauseUnknownToken, "the bearer token is not valid (unknown, revoked or mistyped)")
		}
	}
	if len(c.Certificates) > 0 {
		if byCert, err = v.certificatePrincipal(c.Certificates); err != nil {
			return nil, err
		}
	}
	switch {
	case byToken != nil && byCert != nil && byToken.ID != byCert.ID:
		return nil, refuse(CauseConflictingCredentials,
			"the bearer token and the client certificate name different principals; present one, or both of one principal")
	case byToken != nil:
		return clonePrincipal(byToken), nil
	case byCert != nil:
		return clonePrincipal(byCert), nil
	}
	return nil, refuse(CauseNoCredentials,
		"no credentials: present a bearer token (%s: Bearer <token>) or a client certificate", AuthorizationHeader)
}

// tokenPrincipal returns the principal of the token hashed h, or nil. Every
// configured hash is compared, in constant time, whatever matches.
func (v *Verifier) tokenPrincipal(h TokenHash) *Principal {
	var found *Principal
	for i := range v.tokens {
		if subtle.ConstantTimeCompare(v.tokens[i].hash[:], h[:]) == 1 {
			found = v.tokens[i].principal
		}
	}
	return found
}

// certificatePrincipal returns the principal a client certificate chain
// names, if it verifies against the client CAs, for client authentication,
// now.
func (v *Verifier) certificatePrincipal(chain []*x509.Certificate) (*Principal, error) {
	if v.roots == nil {
		return nil, refuse(CauseCertificateUntrusted, "client certificates are not accepted by this server")
	}
	key := chainKey(chain)
	v.mu.Lock()
	c, ok := v.checked[key]
	v.mu.Unlock()
	if !ok {
		var cacheable bool
		c, cacheable = v.checkChain(chain)
		if cacheable {
			v.mu.Lock()
			if len(v.checked) >= maxCheckedChains {
				clear(v.checked)
			}
			v.checked[key] = c
			v.mu.Unlock()
		}
	}
	if c.refusal != nil {
		return nil, c.refusal
	}
	if now := v.now(); now.Before(c.notBefore) || now.After(c.notAfter) {
		if now.After(c.leafNotAfter) {
			return nil, refuse(CauseCertificateExpired, "the client certificate expired at %s", c.leafNotAfter.UTC().Format(time.RFC3339))
		}
		return nil, refuse(CauseCertificateExpired, "the client certificate chain is not valid at this time")
	}
	return c.principal, nil
}

// checkChain verifies a chain and maps its names to a principal. It says
// whether the answer may be remembered: all but a refusal for the time,
// which time may change.
func (v *Verifier) checkChain(chain []*x509.Certificate) (checkedChain, bool) {
	leaf := chain[0]
	c := checkedChain{leafNotAfter: leaf.NotAfter}
	inter := x509.NewCertPool()
	for _, ic := range chain[1:] {
		inter.AddCert(ic)
	}
	verified, err := leaf.Verify(x509.VerifyOptions{
		Roots: v.roots, Intermediates: inter, CurrentTime: v.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		var inv x509.CertificateInvalidError
		switch {
		case errors.As(err, &inv) && inv.Reason == x509.Expired:
			c.refusal = refuse(CauseCertificateExpired, "the client certificate chain is not valid at this time")
			if v.now().After(leaf.NotAfter) {
				c.refusal = refuse(CauseCertificateExpired, "the client certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			return c, false
		case errors.As(err, &inv) && inv.Reason == x509.IncompatibleUsage:
			c.refusal = refuse(CauseCertificateUntrusted, "the client certificate is not for client authentication (extended key usage)")
		default:
			c.refusal = refuse(CauseCertificateUntrusted, "the client certificate is not signed by a client CA this server trusts")
		}
		return c, true
	}
	// The chain holds while every certificate of it does.
	c.notBefore, c.notAfter = leaf.NotBefore, leaf.NotAfter
	for _, cert := range verified[0] {
		if cert.NotBefore.After(c.notBefore) {
			c.notBefore = cert.NotBefore
		}
		if cert.NotAfter.Before(c.notAfter) {
			c.notAfter = cert.NotAfter
		}
	}
	for _, name := range certificateNames(leaf) {
		p, ok := v.sans[name]
		if !ok {
			continue
		}
		if c.principal != nil && c.principal.ID != p.ID {
			c.principal, c.refusal = nil, refuse(CauseCertificateAmbiguous,
				"the client certificate's names map to more than one principal (%q and %q)", c.principal.ID, p.ID)
			return c, true
		}
		c.principal = p
	}
	if c.principal == nil {
		c.refusal = refuse(CauseCertificateUnmapped, "the client certificate names no configured principal (its URI and DNS subject alternative names are compared)")
	}
	return c, true
}

// chainKey identifies a presented chain by its certificates' bytes.
func chainKey(chain []*x509.Certificate) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, c := range chain {
		binary.BigEndian.PutUint64(n[:], uint64(len(c.Raw)))
		h.Write(n[:])
		h.Write(c.Raw)
	}
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}

// certificateNames returns the keys (SANKey) of a certificate's URI and DNS
// subject alternative names. The subject's common name is not a name.
func certificateNames(c *x509.Certificate) []string {
	var out []string
	for _, u := range c.URIs {
		out = append(out, "uri:"+u.String())
	}
	for _, d := range c.DNSNames {
		out = append(out, "dns:"+strings.TrimSuffix(strings.ToLower(d), "."))
	}
	return out
}
