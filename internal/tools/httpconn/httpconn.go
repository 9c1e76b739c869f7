// Package httpconn is the HTTP connector: an in-process tool (toolkit.Tool,
// run by the connector host) that calls a JSON HTTP API declared by a
// connector definition (connector.Spec of type http): per action a method, a path template filled from the arguments
// (each value escaped into its segment, so that "../", "@", "#" and "?"
// cannot change the target), and the arguments that go in the query and in
// the JSON body. Credentials come from the secrets store right before each
// request and are scrubbed from everything the connector returns.
//
// What an answer means:
//   - 2xx: success; a JSON body is the value (another body is text);
//   - 429, and 503 naming a reset: rate limited until the reset given by
//     Retry-After (seconds or an HTTP date), RateLimit / RateLimit-Reset or
//     X-RateLimit-Reset (toolkit.RateLimitReset), else a default wait;
//   - 503 and, for GET and HEAD (which change nothing), every 5xx and every
//     transport failure: retryable; for other methods a 5xx or a transport
//     failure after the request was written is an unknown outcome, before
//     it was written retryable;
//   - other 4xx: a failure whose message is the body's (bounded, cleaned,
//     scrubbed);
//   - a redirect to another host, port or scheme is not followed: a failure,
//     or an unknown outcome for a 303 See Other to a request that changes
//     things (it says the request was carried out).
package httpconn

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Defaults.
const (
	// DefaultRateLimitWait is how long a 429 that names no reset shuts the
	// tool out.
	DefaultRateLimitWait = time.Minute
	// maxRedirects bounds redirects followed on the same host.
	maxRedirects = 5
	// maxErrorBody bounds what is read of a response that is not a success.
	maxErrorBody = 64 << 10
	// maxMessage bounds a message taken from an upstream body.
	maxMessage = 500
	// userAgent identifies toolsvc to the API.
	userAgent = "toolsvc"
)

// Options configure a Tool.
type Options struct {
	// Secrets is the secrets store; nil means every secret is missing.
	Secrets secrets.Store
	// Transport sends the requests; nil means http.DefaultTransport.
	Transport http.RoundTripper
	// Now is the clock for rate-limit resets; nil means time.Now.
	Now func() time.Time
	// RateLimitWait is used when a 429 names no reset; 0 means the default.
	RateLimitWait time.Duration
}

// Tool is an HTTP connector bound to one registered definition. It is
// immutable and safe for concurrent use.
type Tool struct {
	name     string
	spec     *connector.Spec
	base     *url.URL
	actions  map[string]*action
	client   *http.Client
	secrets  secrets.Store
	now      func() time.Time
	wait     time.Duration
	maxBytes int64
}

// action is one declared action, ready to fill.
type action struct {
	decl  connector.Action
	tmpl  *connector.Template
	query map[string]bool
	body  map[string]bool
	path  map[string]bool
}

var (
	_ toolkit.Tool      = (*Tool)(nil)
	_ toolkit.Previewer = (*Tool)(nil)
)

// New binds a registered definition (a tool whose connector is of type
// http). It does no I/O.
func New(def *store.Tool, o Options) (*Tool, error) {
	if def == nil || def.Connector == nil {
		return nil, errors.New("http connector: no connector definition")
	}
	spec := connector.Normalize(def.Connector)
	if spec.Type != connector.TypeHTTP {
		return nil, fmt.Errorf("http connector: a connector of type %q", spec.Type)
	}
	base, err := url.Parse(spec.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("http connector %q: base_url must be an http or https URL", def.Name)
	}
	t := &Tool{
		name: def.Name, spec: spec, base: base, actions: map[string]*action{},
		secrets: o.Secrets, now: o.Now, wait: o.RateLimitWait, maxBytes: spec.MaxResponseBytes,
	}
	if t.now == nil {
		t.now = time.Now
	}
	if t.wait <= 0 {
		t.wait = DefaultRateLimitWait
	}
	if t.maxBytes <= 0 {
		t.maxBytes = connector.DefaultMaxResponseBytes
	}
	for _, a := range spec.Actions {
		tmpl, err := connector.ParsePath(a.Path)
		if err != nil {
			return nil, fmt.Errorf("http connector %q: action %q: path %v", def.Name, a.Name, err)
		}
		act := &action{decl: a, tmpl: tmpl, query: set(a.Query), body: set(a.Body), path: set(tmpl.Params())}
		t.actions[a.Name] = act
	}
	rt := o.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	t.client = &http.Client{Transport: rt, CheckRedirect: sameOrigin}
	return t, nil
}

func set(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// sameOrigin follows a redirect only to the scheme, host and port of the
// first request, at most maxRedirects times; otherwise the redirect itself
// is the answer.
func sameOrigin(req *http.Request, via []*http.Request) error {
	if len(via) > maxRedirects || origin(req.URL) != origin(via[0].URL) {
		return http.ErrUseLastResponse
	}
	return nil
}

// origin is scheme://host:port with the default port made explicit.
func origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + strings.ToLower(net.JoinHostPort(u.Hostname(), port))
}

// Definition implements toolkit.Tool. The registry reads a connector's
// definition from the store, not from here; the actions are listed so that
// a reader of the implementation sees what it serves.
func (t *Tool) Definition() toolkit.Definition {
	d := toolkit.Definition{Name: t.name, Description: "HTTP API " + t.base.Redacted()}
	for _, a := range t.spec.Actions {
		d.Actions = append(d.Actions, toolkit.Action{Name: a.Name, Description: a.Description})
	}
	return d
}

// argError is a problem with the arguments that the model can correct: a
// failure, not a fault of the tool.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

// request is a request ready to send, and what it shows in a preview.
type request struct {
	method  string
	url     *url.URL
	header  http.Header
	body    []byte
	display map[string]any
}

// resolver gives the value of a configured value: the secret itself when
// executing, its redacted form when previewing.
type resolver func(v secrets.Value) (string, error)

// build makes the request of a call.
func (t *Tool) build(a *action, raw json.RawMessage, resolve resolver, scrub *secrets.Scrubber) (*request, error) {
	args := map[string]any{}
	if len(bytes.TrimSpace(raw)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&args); err != nil {
			return nil, &argError{"arguments must be a JSON object"}
		}
	}
	pathVals := map[string]string{}
	query := url.Values{}
	body := map[string]any{}
	// Arguments not placed by the definition go in the body of the methods
	// that usually carry one, in the query of the others.
	bodyMethod := a.decl.Method == http.MethodPost || a.decl.Method == http.MethodPut || a.decl.Method == http.MethodPatch
	for _, name := range slices.Sorted(maps.Keys(args)) {
		v := args[name]
		switch {
		case a.path[name]:
			s, ok := scalar(v)
			if !ok {
				return nil, &argError{fmt.Sprintf("argument %q goes in the path and must be a string, number or boolean", name)}
			}
			pathVals[name] = s
		case a.query[name] || (!a.body[name] && !bodyMethod):
			if err := addQuery(query, name, v); err != nil {
				return nil, err
			}
		default:
			body[name] = v
		}
	}
	path, err := a.tmpl.Render(pathVals, url.PathEscape)
	if err != nil {
		return nil, &argError{err.Error()}
	}
	u := *t.base
	u.RawQuery, u.Fragment, u.RawFragment = "", "", ""
	// The template is appended to the base path in its escaped form; the
	// decoded form goes in Path so that url.URL keeps the escapes.
	basePath := strings.TrimSuffix(u.EscapedPath(), "/")
	escaped := basePath + path
	dec, err := url.PathUnescape(escaped)
	if err != nil {
		return nil, &argError{"the path arguments do not make a valid path"}
	}
	u.Path, u.RawPath = dec, escaped
	if u.EscapedPath() != escaped || origin(&u) != origin(t.base) || !strings.HasPrefix(u.EscapedPath(), basePath+"/") {
		return nil, &argError{"the path arguments would change where the request goes"}
	}

	header := http.Header{}
	header.Set("Accept", "application/json")
	header.Set("User-Agent", userAgent)
	for _, k := range slices.Sorted(maps.Keys(t.spec.Headers)) {
		v, err := resolve(t.spec.Headers[k])
		if err != nil {
			return nil, err
		}
		header.Set(k, v)
	}
	displayQuery := url.Values{}
	for k, vs := range query {
		displayQuery[k] = slices.Clone(vs)
	}
	if err := t.auth(header, query, displayQuery, resolve, scrub); err != nil {
		return nil, err
	}
	u.RawQuery = query.Encode()
	shown := u
	shown.RawQuery = strings.ReplaceAll(displayQuery.Encode(), url.QueryEscape(secrets.Redacted), secrets.Redacted)

	r := &request{method: a.decl.Method, url: &u, header: header}
	if len(body) > 0 || len(a.body) > 0 {
		r.body, err = json.Marshal(body)
		if err != nil {
			return nil, &argError{"the body arguments are not JSON"}
		}
		header.Set("Content-Type", "application/json")
	}
	shownHeaders := map[string]any{}
	for k := range header {
		shownHeaders[k] = header.Get(k)
	}
	for k, v := range t.spec.Headers {
		if v.IsSecret() {
			shownHeaders[http.CanonicalHeaderKey(k)] = v.Redacted()
		}
	}
	if au := t.spec.Auth; au != nil {
		switch {
		case au.Bearer != nil:
			shownHeaders["Authorization"] = "Bearer " + secrets.Redacted
		case au.Basic != nil:
			shownHeaders["Authorization"] = "Basic " + secrets.Redacted
		case au.Header != nil:
			shownHeaders[http.CanonicalHeaderKey(au.Header.Name)] = secrets.Redacted
		}
	}
	r.display = map[string]any{"method": r.method, "url": shown.String(), "headers": shownHeaders}
	if r.body != nil {
		r.display["body"] = body
	}
	return r, nil
}

// auth adds the credentials: to header and query for sending, and to
// shown (the query as a preview shows it) redacted.
func (t *Tool) auth(header http.Header, query, shown url.Values, resolve resolver, scrub *secrets.Scrubber) error {
	a := t.spec.Auth
	if a == nil {
		return nil
	}
	ref := func(r secrets.Ref) (string, error) { return resolve(secrets.Value{Secret: &r}) }
	switch {
	case a.Bearer != nil:
		v, err := ref(*a.Bearer)
		if err != nil {
			return err
		}
		header.Set("Authorization", "Bearer "+v)
	case a.Basic != nil:
		user, err := resolve(a.Basic.Username)
		if err != nil {
			return err
		}
		pass, err := ref(a.Basic.Password)
		if err != nil {
			return err
		}
		cred := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
		if scrub != nil {
			scrub.Add(secrets.New(cred))
		}
		header.Set("Authorization", "Basic "+cred)
	case a.Header != nil:
		v, err := ref(a.Header.Value)
		if err != nil {
			return err
		}
		header.Set(a.Header.Name, v)
	case a.Query != nil:
		v, err := ref(a.Query.Value)
		if err != nil {
			return err
		}
		query.Set(a.Query.Name, v)
		shown.Set(a.Query.Name, secrets.Redacted)
	}
	return nil
}

// scalar renders a JSON scalar for a path or query.
func scalar(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		if x {
			return "true", true
		}
		return "false", true
	}
	return "", false
}

// addQuery adds an argument to the query: a scalar once, an array of
// scalars once per element; null is left out.
func addQuery(q url.Values, name string, v any) error {
	if v == nil {
		return nil
	}
	if list, ok := v.([]any); ok {
		for _, e := range list {
			s, ok := scalar(e)
			if !ok {
				return &argError{fmt.Sprintf("argument %q goes in the query: its items must be strings, numbers or booleans", name)}
			}
			q.Add(name, s)
		}
		return nil
	}
	s, ok := scalar(v)
	if !ok {
		return &argError{fmt.Sprintf("argument %q goes in the query and cannot be an object", name)}
	}
	q.Add(name, s)
	return nil
}

// Preview implements toolkit.Previewer: the exact request the call would
// send, with every secret redacted. No secret is fetched to build it.
func (t *Tool) Preview(ctx context.Context, call *toolkit.Call) (*toolkit.PreviewResult, error) {
	a, ok := t.actions[call.Action]
	if !ok {
		return nil, fmt.Errorf("http connector %q has no action %q", t.name, call.Action)
	}
	r, err := t.build(a, call.Arguments, func(v secrets.Value) (string, error) { return v.Redacted(), nil }, nil)
	if err != nil {
		return nil, err
	}
	return &toolkit.PreviewResult{
		Message: fmt.Sprintf("Would send %s %s", r.method, r.display["url"]),
		Value:   r.display,
	}, nil
}

// Execute implements toolkit.Tool.
func (t *Tool) Execute(ctx context.Context, call *toolkit.Call) (res *toolkit.Result, err error) {
	sc := secrets.NewScrubber()
	defer tools.RepanicScrubbed(sc)
	defer func() {
		res, err = tools.ScrubResult(sc, res), tools.ScrubError(sc, err)
	}()
	a, ok := t.actions[call.Action]
	if !ok {
		return nil, fmt.Errorf("http connector %q has no action %q", t.name, call.Action)
	}
	st := secrets.Recording(t.secrets, sc)
	r, err := t.build(a, call.Arguments, func(v secrets.Value) (string, error) {
		s, err := v.Resolve(ctx, st, t.name)
		return s.Reveal(), err
	}, sc)
	var ae *argError
	switch {
	case errors.As(err, &ae):
		return toolkit.Failure(ae.msg), nil
	case err != nil:
		// A secret that cannot be had: nothing was sent.
		return nil, toolkit.Retryable(err)
	}
	return t.send(ctx, r, sc)
}

// send sends the request and says what its answer means.
func (t *Tool) send(ctx context.Context, r *request, sc *secrets.Scrubber) (*toolkit.Result, error) {
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			wrote.Store(true)
		}
	}}
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), r.method, r.url.String(), body)
	if err != nil {
		return nil, toolkit.Retryable(fmt.Errorf("build the request: %w", err))
	}
	req.Header = r.header
	safe := r.method == http.MethodGet || r.method == http.MethodHead
	what := r.method + " " + r.url.EscapedPath()
	resp, err := t.client.Do(req)
	if err != nil {
		if !wrote.Load() || safe {
			return nil, toolkit.Retryable(fmt.Errorf("%s: %w", what, err))
		}
		return nil, toolkit.OutcomeUnknown(fmt.Errorf("%s: the request was sent, then: %w", what, err))
	}
	defer resp.Body.Close()
	status := fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))

	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return t.success(resp, what, status, sc, safe)
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		now := t.now()
		reset, ok := toolkit.RateLimitReset(resp.Header, now)
		msg := errorMessage(resp, sc)
		if code == http.StatusTooManyRequests || ok {
			if !ok {
				reset = now.Add(t.wait)
			}
			return nil, toolkit.RateLimited(reset, fmt.Errorf("%s: %s%s", what, status, msg))
		}
		return nil, toolkit.Retryable(fmt.Errorf("%s: %s%s", what, status, msg))
	case code >= 500:
		msg := errorMessage(resp, sc)
		if safe {
			return nil, toolkit.Retryable(fmt.Errorf("%s: %s%s", what, status, msg))
		}
		return nil, toolkit.OutcomeUnknown(fmt.Errorf("%s: %s%s", what, status, msg))
	case code >= 300 && code < 400:
		loc := sc.Scrub(resp.Header.Get("Location"))
		if u, err := resp.Location(); err == nil {
			loc = sc.Scrub(u.Redacted())
		}
		msg := fmt.Sprintf("%s: %s redirects to %s, which is not followed (only redirects to the same scheme, host and port are)",
			what, status, safetext.Bound(loc, 200))
		if code == http.StatusSeeOther && !safe {
			return nil, toolkit.OutcomeUnknown(errors.New(msg + "; a 303 says the request was carried out"))
		}
		return toolkit.Failure(msg), nil
	default:
		return toolkit.Failure(fmt.Sprintf("%s: %s%s", what, status, errorMessage(resp, sc))), nil
	}
}

// success reads a 2xx answer: the JSON body is the value.
func (t *Tool) success(resp *http.Response, what, status string, sc *secrets.Scrubber, safe bool) (*toolkit.Result, error) {
	b, err := io.ReadAll(io.LimitReader(resp.Body, t.maxBytes+1))
	if err != nil {
		if safe {
			return nil, toolkit.Retryable(fmt.Errorf("%s: %s, then reading the body: %w", what, status, err))
		}
		// The API said it succeeded; only its answer was lost.
		return toolkit.OK(nil, fmt.Sprintf("%s: %s; the response body could not be read (%s)", what, status, sc.Scrub(err.Error()))), nil
	}
	if int64(len(b)) > t.maxBytes {
		return toolkit.OK(nil, fmt.Sprintf("%s: %s; the response body is larger than %d bytes and was not kept", what, status, t.maxBytes)), nil
	}
	msg := fmt.Sprintf("%s: %s", what, status)
	if len(bytes.TrimSpace(b)) == 0 {
		return toolkit.OK(nil, msg), nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil || dec.More() {
		return toolkit.OK(safetext.Clean(string(b)), msg), nil
	}
	return toolkit.OK(v, msg), nil
}

// errorMessage is the message of an answer that is not a success, taken
// from its body: a JSON API's usual fields (message, error,
// error_description, detail, title, errors[0]) or the text, bounded,
// cleaned and scrubbed; "" when the body says nothing.
func errorMessage(resp *http.Response, sc *secrets.Scrubber) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var doc any
	text := ""
	if json.Unmarshal(b, &doc) == nil {
		text = messageOf(doc, 0)
	} else {
		text = strings.Join(strings.Fields(string(b)), " ")
	}
	text = safetext.Bound(sc.Scrub(safetext.Clean(text)), maxMessage)
	if text == "" {
		return ""
	}
	return ": " + text
}

func messageOf(doc any, depth int) string {
	if depth > 3 {
		return ""
	}
	switch x := doc.(type) {
	case string:
		return strings.Join(strings.Fields(x), " ")
	case []any:
		if len(x) > 0 {
			return messageOf(x[0], depth+1)
		}
	case map[string]any:
		for _, k := range []string{"message", "error_description", "error", "detail", "title", "errors", "msg", "description"} {
			if v, ok := x[k]; ok {
				if s := messageOf(v, depth+1); s != "" {
					return s
				}
			}
		}
	}
	return ""
}
