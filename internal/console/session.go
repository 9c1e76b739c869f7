package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Cookies. With Secure cookies the session's carries the __Host- prefix:
// the browser then only accepts it over https, for this host, on path /.
const (
	sessionCookie = "toolsvc_session"
	signinCookie  = "toolsvc_signin"
	hostPrefix    = "__Host-"
)

// Credentials a session was signed in with (store.Session.Credential).
const (
	credToken = "token:"
	credCert  = "certificate:"
	credDev   = "dev"
)

// session is a signed-in request's session and principal.
type session struct {
	rec       *store.Session
	secret    string // the cookie's value; the CSRF token derives from it
	principal *auth.Principal
}

// csrf is the session's CSRF token: an HMAC of a constant under the
// session's secret, so that every replica derives the same one and none is
// stored. Only a page of the session can know it.
func (s *session) csrf() string {
	mac := hmac.New(sha256.New, []byte(s.secret))
	mac.Write([]byte("toolsvc console csrf"))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func (c *Console) cookieName(name string) string {
	if c.o.SecureCookies {
		return hostPrefix + name
	}
	return name
}

func (c *Console) setCookie(w http.ResponseWriter, name, value string, maxAge int) {
	// Secure unless the console is configured for plain HTTP (a local
	// trial): a browser would not send a Secure cookie back over it.
	http.SetCookie(w, &http.Cookie{ //nolint:gosec // G124: see above
		Name: c.cookieName(name), Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: c.o.SecureCookies, SameSite: http.SameSiteStrictMode,
	})
}

// sessionID is the store's id of a session secret: its SHA-256, so that
// the store (a database dump, a replica's memory) never holds a usable
// cookie.
func sessionID(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func randomSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

// errSignedOut: no valid session (none, expired, signed out, or its
// credential no longer names its principal).
var errSignedOut = errors.New("signed out")

// current returns the request's session.
func (c *Console) current(r *http.Request) (*session, error) {
	ck, err := r.Cookie(c.cookieName(sessionCookie))
	if err != nil || ck.Value == "" {
		return nil, errSignedOut
	}
	rec, err := c.o.Store.GetSession(r.Context(), sessionID(ck.Value))
	if errors.Is(err, store.ErrNotFound) {
		return nil, errSignedOut
	}
	if err != nil {
		return nil, err
	}
	if !c.now().Before(rec.ExpiresAt) {
		return nil, errSignedOut
	}
	p, err := c.recheck(r, rec)
	if err != nil {
		return nil, errSignedOut
	}
	return &session{rec: rec, secret: ck.Value, principal: p}, nil
}

// recheck establishes a session's principal again from the credential it
// was signed in with, so that a token or certificate no longer configured
// (or a principal whose roles changed) takes effect at once.
func (c *Console) recheck(r *http.Request, rec *store.Session) (*auth.Principal, error) {
	var p *auth.Principal
	var err error
	switch cred := rec.Credential; {
	case strings.HasPrefix(cred, credToken):
		v, ok := c.o.Authenticator.(interface {
			AuthenticateTokenHash(auth.TokenHash) (*auth.Principal, error)
		})
		if !ok {
			return nil, errSignedOut
		}
		h, perr := auth.ParseTokenHash(strings.TrimPrefix(cred, credToken))
		if perr != nil {
			return nil, perr
		}
		p, err = v.AuthenticateTokenHash(h)
	case strings.HasPrefix(cred, credCert):
		// The certificate is presented on every connection: it must be the
		// one the session was signed in with, and still valid.
		chain := peerCertificates(r)
		if len(chain) == 0 || certID(chain) != strings.TrimPrefix(cred, credCert) {
			return nil, errSignedOut
		}
		p, err = c.o.Authenticator.Authenticate(r.Context(), auth.Credentials{Certificates: chain})
	case cred == credDev && c.o.DevMode:
		p, err = c.o.Authenticator.Authenticate(r.Context(), auth.Credentials{PrincipalHeader: []string{rec.PrincipalID}})
	default:
		return nil, errSignedOut
	}
	if err != nil {
		return nil, err
	}
	if p.ID != rec.PrincipalID || !mayUse(p) {
		return nil, errSignedOut
	}
	return p, nil
}

func peerCertificates(r *http.Request) []*x509.Certificate {
	if r.TLS == nil {
		return nil
	}
	return r.TLS.PeerCertificates
}

func certID(chain []*x509.Certificate) string {
	sum := sha256.Sum256(chain[0].Raw)
	return hex.EncodeToString(sum[:])
}

// mayUse reports whether a principal may use the console: the console
// shows everybody's approvals, so those who read them all
// (auth.ReadsAllApprovals: approvers and operators); agents see nothing
// here.
func mayUse(p *auth.Principal) bool {
	return auth.ReadsAllApprovals(p)
}

// signed wraps a handler that needs a session: without one, a page asks to
// sign in (and comes back after), anything else is refused.
func (c *Console) signed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, err := c.current(r)
		switch {
		case errors.Is(err, errSignedOut):
			if r.Method == http.MethodGet && r.URL.Path != "/events" {
				http.Redirect(w, r, "/signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, http.StatusUnauthorized, "SIGNED_OUT", "Your session has ended. Sign in again.")
			return
		case err != nil:
			c.storeFailed(w, r, nil, err)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		if r.Method == http.MethodPost && !c.validCSRF(r, s) {
			c.fail(w, r, s, http.StatusForbidden, "CSRF", "This form is not from your session (it may be from another site, or from before you signed in again). Reload the page and try again.")
			return
		}
		h(w, r, s)
	}
}

// validCSRF checks a posted form's csrf field against the session's token.
func (c *Console) validCSRF(r *http.Request, s *session) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf())) == 1
}

// safeNext returns a local path to go to after signing in, or the landing
// page: never another site (//evil.example, /\evil.example, https://...).
func safeNext(next string) string {
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") ||
		strings.ContainsAny(next, "\\\r\n\t") || strings.HasPrefix(next, "/signin") {
		return landing
	}
	return next
}

// landing is where signing in leads.
const landing = "/approvals?state=pending"

type signinData struct {
	Next     string
	DevMode  bool
	CertUser string // the principal a presented certificate names
	Token    string // the sign-in form's CSRF token
	Error    string
}

func (c *Console) home(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, landing, http.StatusSeeOther)
}

// signinPage shows the sign-in form, also to someone signed in (who may
// sign in as someone else: the current session then ends).
func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.renderSignin(w, r, http.StatusOK, "")
}

// renderSignin shows the sign-in form with a fresh sign-in token: a random
// value in a cookie and in the form, which must match when it is posted
// (the form's CSRF protection: no session exists yet).
func (c *Console) renderSignin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	tok := randomSecret()
	c.setCookie(w, signinCookie, tok, 600)
	d := signinData{Next: safeNext(r.FormValue("next")), DevMode: c.o.DevMode, Token: tok, Error: msg}
	if chain := peerCertificates(r); len(chain) > 0 {
		if p, err := c.o.Authenticator.Authenticate(r.Context(), auth.Credentials{Certificates: chain}); err == nil {
			d.CertUser = p.ID
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	c.render(w, r, status, "signin", nil, "Sign in", d)
}

// signin signs a person in with a token, their client certificate or (in
// development) a principal's name, and starts a new session: whatever
// session cookie the browser had is ended and replaced (no fixation).
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	ck, err := r.Cookie(c.cookieName(signinCookie))
	form := r.PostFormValue("signin_token")
	if err != nil || ck.Value == "" || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(form)) != 1 {
		c.renderSignin(w, r, http.StatusForbidden, "This sign-in form has expired or is not from this site. Try again.")
		return
	}
	var (
		creds auth.Credentials
		cred  string
	)
	switch method := r.PostFormValue("method"); {
	case method == "certificate":
		chain := peerCertificates(r)
		if len(chain) == 0 {
			c.renderSignin(w, r, http.StatusUnauthorized, "Your browser presented no client certificate.")
			return
		}
		creds, cred = auth.Credentials{Certificates: chain}, credCert+certID(chain)
	case c.o.DevMode:
		name := strings.TrimSpace(r.PostFormValue("principal"))
		if name == "" {
			c.renderSignin(w, r, http.StatusBadRequest, "Name the principal to sign in as.")
			return
		}
		creds, cred = auth.Credentials{PrincipalHeader: []string{name}}, credDev
	default:
		token := strings.TrimSpace(r.PostFormValue("token"))
		if token == "" {
			c.renderSignin(w, r, http.StatusBadRequest, "Enter your bearer token.")
			return
		}
		creds, cred = auth.Credentials{Authorization: []string{"Bearer " + token}}, credToken+auth.HashToken(token).String()
	}
	p, err := c.o.Authenticator.Authenticate(r.Context(), creds)
	if err != nil {
		msg := "Those credentials are not valid."
		if f, ok := fault.As(err); ok && f.Kind != fault.Unauthenticated {
			msg = f.Message
		}
		c.log.Info("console sign-in refused", "remote", r.RemoteAddr)
		c.renderSignin(w, r, http.StatusUnauthorized, msg)
		return
	}
	if !mayUse(p) {
		c.renderSignin(w, r, http.StatusForbidden, "The console is for approvers and operators; "+p.ID+" is neither.")
		return
	}
	// A session cookie the browser already had — perhaps planted — is
	// ended, never adopted.
	if old, err := r.Cookie(c.cookieName(sessionCookie)); err == nil && old.Value != "" {
		_ = c.o.Store.DeleteSession(r.Context(), sessionID(old.Value))
	}
	secret, now := randomSecret(), c.now()
	rec := &store.Session{ID: sessionID(secret), PrincipalID: p.ID, Credential: cred, CreatedAt: now, ExpiresAt: now.Add(c.o.SessionTTL)}
	if err := c.o.Store.CreateSession(r.Context(), rec); err != nil {
		c.storeFailed(w, r, nil, err)
		return
	}
	c.setCookie(w, sessionCookie, secret, int(c.o.SessionTTL/time.Second))
	c.setCookie(w, signinCookie, "", -1)
	c.log.Info("console sign-in", "principal", p.ID, "method", strings.TrimSuffix(strings.SplitN(cred, ":", 2)[0], ":"))
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther) //nolint:gosec // G710: safeNext keeps only local paths
}

// signout ends the session on the server (every replica) and in the
// browser.
func (c *Console) signout(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if err := c.o.Store.DeleteSession(ctx, s.rec.ID); err != nil {
		c.storeFailed(w, r, s, err)
		return
	}
	c.setCookie(w, sessionCookie, "", -1)
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}
