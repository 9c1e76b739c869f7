package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	mcpauth "github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// operation names MCP in the audit events and refusals of the front door.
const operation = "MCP"

// principalExtra is the key of a verified token's principal in the SDK's
// TokenInfo.Extra.
const principalExtra = "toolsvc.principal"

// requestKey carries the HTTP request's context into the handlers, whose
// own contexts keep its values but not always its end (see hold.go).
type requestKey struct{}

// authenticate establishes every request's principal before the SDK reads
// the request, as the gRPC interceptors do: bearer tokens (verified through
// the SDK's auth.RequireBearerToken, with the Authenticator as verifier),
// client certificates, or x-toolsvc-principal with authentication off. A
// request that cannot be identified is answered 401 and one whose
// principal is no agent 403, each audited (failures through the refusal
// throttle) before it is answered.
func (s *Server) authenticate(next http.Handler) http.Handler {
	admitted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := auth.FromContext(r.Context())
		if !ok {
			// A token verified by the SDK's middleware.
			if ti := mcpauth.TokenInfoFromContext(r.Context()); ti != nil {
				p, ok = ti.Extra[principalExtra].(*auth.Principal)
			}
		}
		if !ok || p == nil {
			s.refuse(w, r, "", fault.NotAuthenticated("no principal"))
			return
		}
		if err := auth.RequireAnyRole(p, operation, auth.RoleAgent); err != nil {
			s.record(r.Context(), r, p.ID, err, 0)
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		ctx := auth.NewContext(r.Context(), p)
		ctx = context.WithValue(ctx, requestKey{}, r.Context())
		next.ServeHTTP(w, r.WithContext(ctx))
	})
	var bearer http.Handler
	if s.opts.BearerTokens {
		bearer = mcpauth.RequireBearerToken(s.verifyToken, &mcpauth.RequireBearerTokenOptions{
			// toolsvc's tokens do not expire; they are revoked by removing
			// their hash from the configuration.
			AllowMissingExpiration: true,
		})(admitted)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w = &challenger{ResponseWriter: w}
		if bearer != nil && isBearer(r.Header.Values("Authorization")) {
			bearer.ServeHTTP(w, r)
			return
		}
		p, err := s.opts.Authenticator.Authenticate(r.Context(), credentials(r))
		if err == nil && p == nil {
			err = fault.NotAuthenticated("no principal")
		}
		if err != nil {
			s.refuse(w, r, "", err)
			return
		}
		admitted.ServeHTTP(w, r.WithContext(auth.NewContext(r.Context(), p)))
	})
}

// isBearer reports whether a request presents one "Bearer <token>"
// authorization; anything else is judged (and refused) by the
// Authenticator itself.
func isBearer(values []string) bool {
	if len(values) != 1 {
		return false
	}
	f := strings.Fields(values[0])
	return len(f) == 2 && strings.EqualFold(f[0], "bearer")
}

// verifyToken is the SDK's token verifier: the token (with the request's
// client certificate, which must name the same principal) is verified by
// the Authenticator, and the principal rides in the TokenInfo.
func (s *Server) verifyToken(ctx context.Context, _ string, r *http.Request) (*mcpauth.TokenInfo, error) {
	p, err := s.opts.Authenticator.Authenticate(ctx, credentials(r))
	if err == nil && p == nil {
		err = fault.NotAuthenticated("no principal")
	}
	if err != nil {
		s.recordThrottled(ctx, r, "peer "+peerHost(r), "", err)
		return nil, fmt.Errorf("%w: %s", mcpauth.ErrInvalidToken, refusalText(err))
	}
	return &mcpauth.TokenInfo{UserID: p.ID, Extra: map[string]any{principalExtra: p}}, nil
}

// credentials are what a request presents.
func credentials(r *http.Request) auth.Credentials {
	c := auth.Credentials{
		Authorization:   r.Header.Values("Authorization"),
		PrincipalHeader: r.Header.Values(auth.PrincipalHeader),
	}
	if r.TLS != nil {
		c.Certificates = r.TLS.PeerCertificates
	}
	return c
}

// refuse answers a request whose caller could not be identified (401),
// after auditing it through the throttle.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, principal string, err error) {
	s.recordThrottled(r.Context(), r, "peer "+peerHost(r), principal, err)
	http.Error(w, refusalText(err), http.StatusUnauthorized)
}

// refusalText is what a caller is told of a refusal: the fault's message
// (never a credential), or a generic line for anything else.
func refusalText(err error) string {
	if f, ok := fault.As(err); ok {
		return f.Message
	}
	return "the request could not be authenticated"
}

// challenger adds the bearer challenge to every 401.
type challenger struct {
	http.ResponseWriter
	wrote bool
}

func (c *challenger) WriteHeader(code int) {
	if code == http.StatusUnauthorized && !c.wrote {
		c.Header().Set("WWW-Authenticate", `Bearer realm="toolsvc"`)
	}
	c.wrote = true
	c.ResponseWriter.WriteHeader(code)
}

func (c *challenger) Write(b []byte) (int, error) {
	c.wrote = true
	return c.ResponseWriter.Write(b)
}

// Flush lets the SDK stream server-sent events through the wrapper.
func (c *challenger) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the writer underneath.
func (c *challenger) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// peerHost is the address a request comes from, without the port.
func peerHost(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	if r.RemoteAddr == "" {
		return "unknown"
	}
	return r.RemoteAddr
}

// recordThrottled audits a refusal unless source has had its share of
// audited refusals this minute.
func (s *Server) recordThrottled(ctx context.Context, r *http.Request, source, principal string, refusal error) {
	suppressed := 0
	if t := s.opts.RefusalAudit; t != nil {
		var ok bool
		if ok, suppressed = t.Allow(source); !ok {
			s.log.DebugContext(ctx, "refusal not audited: its source has had its share", "source", source)
			return
		}
	}
	s.record(ctx, r, principal, refusal, suppressed)
}

// record writes the access.denied event of a refused request; the detail
// names the reason, the cause of a failed authentication and the peer,
// never the credential presented.
func (s *Server) record(ctx context.Context, r *http.Request, principal string, refusal error, suppressed int) {
	reason := fault.ReasonInternal
	detail := map[string]any{"method": operation}
	if f, ok := fault.As(refusal); ok {
		reason = f.Reason
		if cause, ok := f.Metadata[auth.CauseKey]; ok {
			detail["cause"] = cause
		}
	}
	detail["reason"] = reason
	if principal == "" && r != nil {
		detail["peer"] = peerHost(r)
	}
	if suppressed > 0 {
		detail["suppressed"] = suppressed
	}
	ev := audit.NewDetail(audit.AccessDenied, store.AuditEvent{Time: s.now(), Principal: principal}, detail)
	if err := s.opts.Store.AppendAuditEvents(context.WithoutCancel(ctx), []store.AuditEvent{ev}); err != nil {
		s.log.ErrorContext(ctx, "could not audit a refused MCP request", "reason", reason, "error", err)
	}
}

// errResolved stops following an approval once it is no longer pending.
var errResolved = errors.New("approval resolved")
