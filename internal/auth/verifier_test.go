package auth_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/auth/pkitest"
	"github.com/toolsvc/toolsvc/internal/fault"
)

func newToken(t *testing.T) (string, auth.TokenHash) {
	t.Helper()
	tok, h, err := auth.NewToken(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return tok, h
}

func wantCause(t *testing.T, err error, cause auth.Cause) *fault.Error {
	t.Helper()
	f, ok := fault.As(err)
	if !ok || f.Kind != fault.Unauthenticated || f.Reason != fault.ReasonUnauthenticated || f.Metadata[auth.CauseKey] != string(cause) {
		t.Fatalf("want UNAUTHENTICATED cause %s, got %#v", cause, err)
	}
	return f
}

func TestNewToken(t *testing.T) {
	a, ha := newToken(t)
	b, hb := newToken(t)
	if a == b || ha == hb {
		t.Fatal("two tokens alike")
	}
	if !strings.HasPrefix(a, auth.TokenPrefix) || len(a) != len(auth.TokenPrefix)+43 {
		t.Fatalf("token %q", a)
	}
	if auth.HashToken(a) != ha {
		t.Fatal("hash is not the token's")
	}
	parsed, err := auth.ParseTokenHash(strings.ToUpper(ha.String()))
	if err != nil || parsed != ha {
		t.Fatalf("hex round trip: %v", err)
	}
	for _, bad := range []string{"", "abc", strings.Repeat("g", 64), ha.String() + "00"} {
		if _, err := auth.ParseTokenHash(bad); err == nil {
			t.Errorf("hash %q accepted", bad)
		}
	}
	if _, _, err := auth.NewToken(bytes.NewReader(make([]byte, 3))); err == nil {
		t.Fatal("a short random source made a token")
	}
}

// fixture is a verifier with three principals: agent (token), approver
// (certificate by URI), operator (token and certificate by DNS name).
type fixture struct {
	v                     *auth.Verifier
	ca, otherCA           *pkitest.CA
	agentTok, operatorTok string
	now                   time.Time
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{ca: pkitest.NewCA(t, "clients"), otherCA: pkitest.NewCA(t, "elsewhere"), now: time.Now()}
	var agentHash, opHash auth.TokenHash
	f.agentTok, agentHash = newToken(t)
	f.operatorTok, opHash = newToken(t)
	v, err := auth.NewVerifier(auth.VerifierOptions{
		Identities: []auth.Identity{
			{Principal: &auth.Principal{ID: "agent", Roles: []auth.Role{auth.RoleAgent}}, TokenHashes: []auth.TokenHash{agentHash}},
			{Principal: &auth.Principal{ID: "approver", Roles: []auth.Role{auth.RoleApprover}}, SANs: []string{"spiffe://example.org/approver"}},
			{Principal: &auth.Principal{ID: "operator", Roles: []auth.Role{auth.RoleOperator}}, TokenHashes: []auth.TokenHash{opHash},
				SANs: []string{"Ops.Example.org."}},
		},
		ClientCAs: f.ca.Pool(),
		Now:       func() time.Time { return f.now },
	})
	if err != nil {
		t.Fatal(err)
	}
	f.v = v
	return f
}

func bearer(tok string) []string { return []string{"Bearer " + tok} }

func TestVerifierTokens(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p, err := f.v.Authenticate(ctx, auth.Credentials{Authorization: bearer(f.agentTok)})
	if err != nil || p.ID != "agent" || !p.HasRole(auth.RoleAgent) || p.HasRole(auth.RoleOperator) {
		t.Fatalf("agent token: %+v, %v", p, err)
	}
	// The scheme is case-insensitive.
	if p, err := f.v.Authenticate(ctx, auth.Credentials{Authorization: []string{"bearer " + f.operatorTok}}); err != nil || p.ID != "operator" {
		t.Fatalf("operator token: %+v, %v", p, err)
	}

	canary := auth.TokenPrefix + "CANARYcanaryCANARYcanaryCANARYcanaryCANARY1"
	for _, tc := range []struct {
		name  string
		c     auth.Credentials
		cause auth.Cause
	}{
		{"nothing", auth.Credentials{}, auth.CauseNoCredentials},
		{"unknown token", auth.Credentials{Authorization: bearer(canary)}, auth.CauseUnknownToken},
		{"token's hash as the token", auth.Credentials{Authorization: bearer(auth.HashToken(f.agentTok).String())}, auth.CauseUnknownToken},
		{"twice", auth.Credentials{Authorization: []string{"Bearer " + f.agentTok, "Bearer " + canary}}, auth.CauseMalformedAuthorization},
		{"twice the same", auth.Credentials{Authorization: []string{"Bearer " + f.agentTok, "Bearer " + f.agentTok}}, auth.CauseMalformedAuthorization},
		{"basic", auth.Credentials{Authorization: []string{"Basic " + canary}}, auth.CauseMalformedAuthorization},
		{"no scheme", auth.Credentials{Authorization: []string{canary}}, auth.CauseMalformedAuthorization},
		{"empty", auth.Credentials{Authorization: []string{""}}, auth.CauseMalformedAuthorization},
		{"scheme only", auth.Credentials{Authorization: []string{"Bearer "}}, auth.CauseMalformedAuthorization},
		{"inner space", auth.Credentials{Authorization: []string{"Bearer " + canary + " x"}}, auth.CauseMalformedAuthorization},
		{"non-ASCII", auth.Credentials{Authorization: []string{"Bearer " + canary + "é"}}, auth.CauseMalformedAuthorization},
		{"too long", auth.Credentials{Authorization: bearer(canary + strings.Repeat("A", 600))}, auth.CauseMalformedAuthorization},
		{"principal header", auth.Credentials{PrincipalHeader: []string{"operator"}}, auth.CausePrincipalHeader},
		{"principal header with a token", auth.Credentials{Authorization: bearer(f.agentTok), PrincipalHeader: []string{"operator"}}, auth.CausePrincipalHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.v.Authenticate(ctx, tc.c)
			e := wantCause(t, err, tc.cause)
			text := e.Message
			for k, v := range e.Metadata {
				text += k + v
			}
			if strings.Contains(text, "CANARY") || strings.Contains(text, f.agentTok) {
				t.Fatalf("the refusal repeats the credential: %q", text)
			}
		})
	}
}

func TestVerifierCertificates(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	chain := func(l *pkitest.Leaf) auth.Credentials {
		return auth.Credentials{Certificates: []*x509.Certificate{l.Cert}}
	}
	ok := func(name string, c auth.Credentials, want string) {
		t.Helper()
		p, err := f.v.Authenticate(ctx, c)
		if err != nil || p.ID != want {
			t.Fatalf("%s: got %+v, %v; want %s", name, p, err, want)
		}
	}
	ok("URI SAN", chain(f.ca.Client(t, "spiffe://example.org/approver")), "approver")
	ok("DNS SAN, other case", chain(f.ca.Client(t, "OPS.example.org")), "operator")
	ok("several SANs, one known", chain(f.ca.Client(t, "unknown.example.org", "spiffe://example.org/nobody", "spiffe://example.org/approver")), "approver")
	ok("URI and DNS of one principal", auth.Credentials{Certificates: []*x509.Certificate{f.ca.Client(t, "ops.example.org").Cert}, Authorization: bearer(f.operatorTok)}, "operator")

	past := f.ca.Issue(t, pkitest.Options{Names: []string{"spiffe://example.org/approver"}, NotBefore: f.now.Add(-2 * time.Hour), NotAfter: f.now.Add(-time.Minute)})
	future := f.ca.Issue(t, pkitest.Options{Names: []string{"spiffe://example.org/approver"}, NotBefore: f.now.Add(time.Hour), NotAfter: f.now.Add(2 * time.Hour)})
	serverOnly := f.ca.Issue(t, pkitest.Options{Names: []string{"spiffe://example.org/approver"}, Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	for _, tc := range []struct {
		name  string
		c     auth.Credentials
		cause auth.Cause
	}{
		{"no SAN", chain(f.ca.Issue(t, pkitest.Options{CommonName: "approver"})), auth.CauseCertificateUnmapped},
		{"unknown SANs", chain(f.ca.Client(t, "spiffe://example.org/nobody", "nobody.example.org")), auth.CauseCertificateUnmapped},
		{"URI spelled as DNS", chain(f.ca.Client(t, "example.org")), auth.CauseCertificateUnmapped},
		{"SANs of two principals", chain(f.ca.Client(t, "spiffe://example.org/approver", "ops.example.org")), auth.CauseCertificateAmbiguous},
		{"wrong CA", chain(f.otherCA.Client(t, "spiffe://example.org/approver")), auth.CauseCertificateUntrusted},
		{"self-signed CA as client", auth.Credentials{Certificates: []*x509.Certificate{f.otherCA.Cert}}, auth.CauseCertificateUntrusted},
		{"expired", chain(past), auth.CauseCertificateExpired},
		{"not yet valid", chain(future), auth.CauseCertificateExpired},
		{"server certificate", chain(serverOnly), auth.CauseCertificateUntrusted},
		{"token and certificate of different principals", auth.Credentials{Certificates: []*x509.Certificate{f.ca.Client(t, "ops.example.org").Cert}, Authorization: bearer(f.agentTok)}, auth.CauseConflictingCredentials},
		{"good token, bad certificate", auth.Credentials{Certificates: []*x509.Certificate{f.otherCA.Client(t, "ops.example.org").Cert}, Authorization: bearer(f.operatorTok)}, auth.CauseCertificateUntrusted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.v.Authenticate(ctx, tc.c)
			wantCause(t, err, tc.cause)
		})
	}

	// A certificate that was valid expires with the clock (its check is
	// remembered, its validity is not); one not yet valid becomes valid.
	c := chain(f.ca.Issue(t, pkitest.Options{Names: []string{"spiffe://example.org/approver"}, NotAfter: f.now.Add(time.Minute)}))
	ok("valid", c, "approver")
	ok("valid again", c, "approver")
	early := chain(future)
	f.now = f.now.Add(2 * time.Minute)
	_, err := f.v.Authenticate(ctx, c)
	wantCause(t, err, auth.CauseCertificateExpired)
	f.now = f.now.Add(time.Hour)
	ok("valid now", early, "approver")
	// Refusals that do not depend on the time stay refusals.
	for range 2 {
		_, err = f.v.Authenticate(ctx, chain(serverOnly))
		wantCause(t, err, auth.CauseCertificateUntrusted)
	}
}

func TestNewVerifierRefuses(t *testing.T) {
	_, h := newToken(t)
	_, h2 := newToken(t)
	pool := pkitest.NewCA(t, "c").Pool()
	pr := func(id string) *auth.Principal { return &auth.Principal{ID: id, Roles: []auth.Role{auth.RoleAgent}} }
	for _, tc := range []struct {
		name string
		o    auth.VerifierOptions
		want string
	}{
		{"nobody", auth.VerifierOptions{}, "no principals"},
		{"no credential", auth.VerifierOptions{Identities: []auth.Identity{{Principal: pr("a")}}}, "no credential"},
		{"not canonical", auth.VerifierOptions{Identities: []auth.Identity{{Principal: pr("Alice"), TokenHashes: []auth.TokenHash{h}}}}, "not canonical"},
		{"twice", auth.VerifierOptions{Identities: []auth.Identity{
			{Principal: pr("a"), TokenHashes: []auth.TokenHash{h}}, {Principal: pr("a"), TokenHashes: []auth.TokenHash{h2}}}}, "twice"},
		{"shared token", auth.VerifierOptions{Identities: []auth.Identity{
			{Principal: pr("a"), TokenHashes: []auth.TokenHash{h}}, {Principal: pr("b"), TokenHashes: []auth.TokenHash{h}}}}, "same token"},
		{"shared SAN", auth.VerifierOptions{ClientCAs: pool, Identities: []auth.Identity{
			{Principal: pr("a"), SANs: []string{"a.example.org"}}, {Principal: pr("b"), SANs: []string{"A.example.org."}}}}, "both named"},
		{"SAN without CA", auth.VerifierOptions{Identities: []auth.Identity{{Principal: pr("a"), SANs: []string{"a.example.org"}}}}, "no client CA"},
		{"wildcard", auth.VerifierOptions{ClientCAs: pool, Identities: []auth.Identity{{Principal: pr("a"), SANs: []string{"*.example.org"}}}}, "no wildcards"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := auth.NewVerifier(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Whatever the authorization metadata holds, the refusal never repeats it.
func FuzzAuthorizationNeverEchoed(f *testing.F) {
	tok, h, _ := auth.NewToken(rand.Reader)
	v, err := auth.NewVerifier(auth.VerifierOptions{Identities: []auth.Identity{
		{Principal: &auth.Principal{ID: "a"}, TokenHashes: []auth.TokenHash{h}}}})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"Bearer " + tok, "Bearer secretsecret", "bearer  x=", "Basic abc", "Bearer a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := v.Authenticate(context.Background(), auth.Credentials{Authorization: []string{s}})
		if err == nil {
			if p.ID != "a" {
				t.Fatalf("%q authenticated %q", s, p.ID)
			}
			return
		}
		fe, ok := fault.As(err)
		if !ok || fe.Kind != fault.Unauthenticated {
			t.Fatalf("%q: %v", s, err)
		}
		secret := strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(s, "Bearer"), "bearer"))
		if len(secret) >= 6 && strings.Contains(fe.Message, secret) {
			t.Fatalf("refusal %q repeats %q", fe.Message, secret)
		}
	})
}

// BenchmarkAuthenticate: what establishing a principal costs per call, by
// credential. A client certificate is verified on every call (x509 chain
// verification, ECDSA P-256), a token hashed once and compared with every
// configured hash.
func BenchmarkAuthenticate(b *testing.B) {
	ca := pkitest.NewCA(b, "clients")
	tok, h, _ := auth.NewToken(rand.Reader)
	var ids []auth.Identity
	for i := range 100 {
		_, hi, _ := auth.NewToken(rand.Reader)
		ids = append(ids, auth.Identity{Principal: &auth.Principal{ID: fmt.Sprint("p-", i)}, TokenHashes: []auth.TokenHash{hi},
			SANs: []string{fmt.Sprintf("spiffe://example.org/p-%d", i)}})
	}
	ids = append(ids, auth.Identity{Principal: &auth.Principal{ID: "me"}, TokenHashes: []auth.TokenHash{h}, SANs: []string{"spiffe://example.org/me"}})
	v, err := auth.NewVerifier(auth.VerifierOptions{Identities: ids, ClientCAs: ca.Pool()})
	if err != nil {
		b.Fatal(err)
	}
	dev, _ := auth.NewDevAuthenticator(nil)
	cert := ca.Client(b, "spiffe://example.org/me").Cert
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		a    auth.Authenticator
		c    auth.Credentials
	}{
		{"dev-header", dev, auth.Credentials{PrincipalHeader: []string{"me"}}},
		{"token-of-101", v, auth.Credentials{Authorization: bearer(tok)}},
		{"certificate", v, auth.Credentials{Certificates: []*x509.Certificate{cert}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := bc.a.Authenticate(ctx, bc.c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
