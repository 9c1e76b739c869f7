package auth

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"

	"github.com/toolsvc/toolsvc/internal/fault"
)

// Request metadata keys an authenticator reads. The server layer copies
// their values out of the transport into Credentials; this package never
// sees the transport.
const (
	// PrincipalHeader names the calling principal while authentication is
	// off. With authentication on it is refused.
	PrincipalHeader = "x-toolsvc-principal"
	// AuthorizationHeader carries a bearer token: "Bearer <token>".
	AuthorizationHeader = "authorization"
)

// Credentials are what one request presents, as plain values read from the
// transport by the server layer.
type Credentials struct {
	// Authorization holds every value of the request's authorization
	// metadata (more than one is refused).
	Authorization []string
	// PrincipalHeader holds every value of the x-toolsvc-principal metadata.
	PrincipalHeader []string
	// Certificates is the client certificate chain presented in the TLS
	// handshake, leaf first; nil without TLS or without a client certificate.
	// The handshake proved that the client holds the leaf's private key;
	// nothing else about the chain has been checked.
	Certificates []*x509.Certificate
}

// Authenticator establishes the principal of a request from its
// credentials. It returns a *fault.Error of kind Unauthenticated, whose
// metadata "cause" says which check failed (a Cause), when the caller cannot
// be identified. It never puts a presented secret into an error.
type Authenticator interface {
	Authenticate(ctx context.Context, c Credentials) (*Principal, error)
}

// Cause says why authentication failed, in the refusal's metadata and its
// audit event. It never includes the credential.
type Cause string

// Causes.
const (
	CauseNoCredentials          Cause = "no_credentials"
	CauseMalformedAuthorization Cause = "malformed_authorization"
	CauseUnknownToken           Cause = "unknown_token"
	CausePrincipalHeader        Cause = "principal_header_refused"
	CauseBadPrincipalHeader     Cause = "invalid_principal_header"
	CauseCertificateUntrusted   Cause = "certificate_untrusted"
	CauseCertificateExpired     Cause = "certificate_expired"
	CauseCertificateUnmapped    Cause = "certificate_unmapped"
	CauseCertificateAmbiguous   Cause = "certificate_ambiguous"
	CauseConflictingCredentials Cause = "conflicting_credentials"
)

// CauseKey is the metadata key of an authentication refusal's Cause.
const CauseKey = "cause"

func refuse(cause Cause, format string, args ...any) *fault.Error {
	return fault.NotAuthenticated(fmt.Sprintf(format, args...)).With(CauseKey, string(cause))
}

// maxTokenLength bounds a presented bearer token: anything longer is not a
// token this service issued.
const maxTokenLength = 512

// bearerToken returns the token of the request's one authorization value,
// "" if there is none. The error never quotes the value: it may be a secret.
func bearerToken(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", refuse(CauseMalformedAuthorization, "the %s metadata is given %d times; give it once", AuthorizationHeader, len(values))
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", refuse(CauseMalformedAuthorization, `the %s metadata must be "Bearer <token>"`, AuthorizationHeader)
	}
	token = strings.TrimLeft(token, " ")
	if token == "" || len(token) > maxTokenLength || !b64token(token) {
		return "", refuse(CauseMalformedAuthorization, `the %s metadata must be "Bearer <token>" with a token of at most %d characters of A-Z a-z 0-9 - . _ ~ + / and trailing =`, AuthorizationHeader, maxTokenLength)
	}
	return token, nil
}

// b64token reports whether s is an RFC 6750 b64token.
func b64token(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/':
		default:
			return false
		}
	}
	return true
}
