package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/secrets"
)

// JSON-RPC methods the transports look at.
const (
	methodCallTool = "tools/call"
	methodListen   = "subscriptions/listen"
)

// callTrace records what the transport did with one tools/call request: the
// difference between "the server never got it" (retryable) and "the server
// may have acted" (unknown) is decided by whether the request was written.
type callTrace struct {
	wrote  atomic.Bool
	status atomic.Int32 // HTTP status of the response to the request, 0 for stdio

	mu     sync.Mutex
	header http.Header // headers of that response (Retry-After)
}

type traceKey struct{}

// withTrace attaches tr to ctx; the transports find it on the context the
// SDK passes down with the request.
func withTrace(ctx context.Context, tr *callTrace) context.Context {
	return context.WithValue(ctx, traceKey{}, tr)
}

func traceFrom(ctx context.Context) *callTrace {
	tr, _ := ctx.Value(traceKey{}).(*callTrace)
	return tr
}

func (tr *callTrace) responseHeader() http.Header {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.header
}

// tracedTransport wraps a stdio transport so that the write of a tools/call
// is observed. (Only stdio: the streamable HTTP connection must not be
// wrapped, the SDK tells it about the session through an unexported method;
// HTTP writes are observed in roundTripper instead.)
type tracedTransport struct {
	inner sdk.Transport
	conn  *tracedConn // once connected
}

func (t *tracedTransport) Connect(ctx context.Context) (sdk.Connection, error) {
	conn, err := t.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	t.conn = &tracedConn{Connection: conn}
	return t.conn, nil
}

type tracedConn struct {
	sdk.Connection
}

func (c *tracedConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	if tr := traceFrom(ctx); tr != nil && isToolCall(msg) && (err == nil || mayHaveReached(err)) {
		tr.wrote.Store(true)
	}
	return err
}

func isToolCall(msg jsonrpc.Message) bool {
	req, ok := msg.(*jsonrpc.Request)
	return ok && req.IsCall() && req.Method == methodCallTool
}

// mayHaveReached reports whether a failed write to a server's stdin may
// still have delivered the request: only failures that prove the bytes
// went nowhere (the process is gone, the pipe is closed, the write never
// started) say no.
func mayHaveReached(err error) bool {
	return !errors.Is(err, syscall.EPIPE) && !errors.Is(err, os.ErrClosed) &&
		!errors.Is(err, io.ErrClosedPipe) && !errors.Is(err, context.Canceled) &&
		!errors.Is(err, context.DeadlineExceeded)
}

// tail keeps the last bytes a server wrote to stderr, for the log line that
// reports its exit.
type tail struct {
	mu   sync.Mutex
	buf  []byte
	max  int
	lost bool // bytes were dropped from the front
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
		t.lost = true
	}
	return len(p), nil
}

// String returns the kept text; when the front was dropped, from the first
// whole line on (a secret cut in half would escape scrubbing).
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := string(t.buf)
	if t.lost {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		} else {
			s = ""
		}
	}
	return strings.TrimSpace(s)
}

// header is one configured HTTP header with its resolved value.
type header struct {
	name  string
	value secrets.Secret
}

// roundTripper is the HTTP transport of one session: it adds the
// configured headers (only to the endpoint's origin), records what happened
// to tools/call requests, and reports the end of the 2026-07-28
// notification stream, which the SDK drops silently.
type roundTripper struct {
	base   *http.Transport
	origin string
	// onListenEnd is called (once per stream) when a subscriptions/listen
	// response ends: the server went away or dropped the subscription.
	onListenEnd func()

	mu      sync.Mutex
	headers []header // nil once the session is closed
}

func (t *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if origin(req.URL) == t.origin {
		t.mu.Lock()
		hs := t.headers
		t.mu.Unlock()
		for _, h := range hs {
			req.Header.Set(h.name, h.value.Reveal())
		}
	}
	method := rpcMethod(req)
	tr := traceFrom(req.Context()) //nolint:contextcheck // derived from the request's context
	isCall := tr != nil && method == methodCallTool
	if isCall {
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{ //nolint:contextcheck // derived from the request's context
			WroteRequest: func(info httptrace.WroteRequestInfo) {
				// A request whose body was not written whole cannot be
				// processed by the server.
				if info.Err == nil {
					tr.wrote.Store(true)
				}
			},
		}))
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if isCall {
		tr.status.Store(int32(resp.StatusCode))
		tr.mu.Lock()
		tr.header = resp.Header.Clone()
		tr.mu.Unlock()
	}
	if method == methodListen && t.onListenEnd != nil && resp.StatusCode/100 == 2 {
		resp.Body = &endWatcher{ReadCloser: resp.Body, onEnd: t.onListenEnd}
	}
	// The SDK reads error bodies and JSON answers whole; event streams it
	// bounds per event.
	switch {
	case resp.StatusCode/100 != 2:
		resp.Body = &capped{ReadCloser: resp.Body, left: maxErrorBody}
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"):
		resp.Body = &capped{ReadCloser: resp.Body, left: maxJSONBody}
	}
	return resp, nil
}

// Bounds on HTTP bodies the SDK reads whole.
const (
	maxErrorBody = 64 << 10
	maxJSONBody  = sdk.DefaultMaxLineLength // what stdio allows one message
)

// errTooLarge ends a body that exceeds its bound: an error, not a silent
// cut, so that no truncated message is ever taken for a whole one.
var errTooLarge = errors.New("the server's response is too large")

// capped fails reads past left bytes.
type capped struct {
	io.ReadCloser
	left int64
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// Exactly at the bound is fine if the body ends there.
		var one [1]byte
		for {
			n, err := c.ReadCloser.Read(one[:])
			if n > 0 {
				return 0, errTooLarge
			}
			if err != nil {
				return 0, err
			}
		}
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.ReadCloser.Read(p)
	c.left -= int64(n)
	return n, err
}

// close forgets the headers (the session's secrets) and its connections.
func (t *roundTripper) close() {
	t.mu.Lock()
	t.headers = nil
	t.mu.Unlock()
	t.base.CloseIdleConnections()
}

// rpcMethod returns the JSON-RPC method of a POST the SDK is sending, or "".
func rpcMethod(req *http.Request) string {
	if req.Method != http.MethodPost || req.GetBody == nil {
		return ""
	}
	body, err := req.GetBody()
	if err != nil {
		return ""
	}
	defer body.Close()
	var m struct {
		Method string `json:"method"`
	}
	if err := json.NewDecoder(body).Decode(&m); err != nil {
		return ""
	}
	return m.Method
}

// origin is scheme://host of u, lowercased.
func origin(u *url.URL) string {
	return strings.ToLower(u.Scheme + "://" + u.Host)
}

// endWatcher calls onEnd the first time a read fails or the stream ends.
type endWatcher struct {
	io.ReadCloser
	once  sync.Once
	onEnd func()
}

func (w *endWatcher) Read(p []byte) (int, error) {
	n, err := w.ReadCloser.Read(p)
	if err != nil {
		w.once.Do(w.onEnd)
	}
	return n, err
}

// errCrossOriginRedirect: a redirect would carry the session's headers to
// another origin, or take a request where the operator did not point it.
var errCrossOriginRedirect = errors.New("the server redirected to another origin; not followed")

func checkRedirect(req *http.Request, via []*http.Request) error {
	if origin(req.URL) != origin(via[0].URL) {
		return errCrossOriginRedirect
	}
	if len(via) >= 5 {
		return errors.New("stopped after 5 redirects")
	}
	return nil
}
