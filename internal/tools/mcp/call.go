package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/toolkit"
)

// localCodes are the codes of the SDK's own JSON-RPC errors (closing,
// rejected by the transport): they never come from the server.
var localCodes = map[int64]bool{-32003: true, -32004: true, -32005: true}

// defaultRateLimit is how long a 429 without a reset time holds calls off.
const defaultRateLimit = 30 * time.Second

// Call runs tools/call for the server's tool name with args (a JSON object;
// empty means {}). See the package documentation for how outcomes map. A
// request that provably did not reach the server because the session had
// broken is sent once more on a new session before Call gives up.
func (c *Connector) Call(ctx context.Context, serverToolName string, args json.RawMessage) (*toolkit.Result, error) {
	args = bytes.TrimSpace(args)
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	if args[0] != '{' || !json.Valid(args) {
		return nil, &Error{Kind: ErrArguments, Msg: "the arguments are not a JSON object"}
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	// Close ends calls in flight instead of waiting for them.
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	stop := context.AfterFunc(c.closeCtx, func() { abort(ErrClosed) }) //nolint:contextcheck // derived from ctx; the checker does not follow context.AfterFunc
	defer stop()

	for attempt := 0; ; attempt++ {
		s, err := c.session(ctx)
		if err != nil {
			return nil, toolkit.Retryable(err)
		}
		tr := &callTrace{}
		res, err := s.cs.CallTool(withTrace(ctx, tr), &sdk.CallToolParams{Name: serverToolName, Arguments: args})
		if err == nil {
			return c.result(s, res), nil
		}
		if attempt == 0 && ctx.Err() == nil && (!tr.wrote.Load() || sessionForgotten(err, tr)) {
			// The server never saw the request: the session is broken (the
			// process died, the HTTP server forgot the session). Try once
			// more on a new one.
			c.abandon(s, err)
			continue
		}
		return nil, c.callError(ctx, s, err, tr)
	}
}

// sessionForgotten: the HTTP server answered 404 for the session, which it
// must do only for a session it no longer has; it did not process the
// request.
func sessionForgotten(err error, tr *callTrace) bool {
	return tr.status.Load() == http.StatusNotFound && errors.Is(err, sdk.ErrSessionMissing)
}

// callError maps a failed tools/call to the outcome it proves.
func (c *Connector) callError(ctx context.Context, s *session, err error, tr *callTrace) error {
	wrote := tr.wrote.Load()
	msg := c.text(s, err.Error(), maxMessage)
	if ctx.Err() != nil {
		// The SDK says only "context canceled": say which end came first.
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, ErrClosed):
			msg = "the connector was closed"
		case errors.Is(cause, context.DeadlineExceeded):
			msg = "the call's deadline passed"
		default:
			msg = "the call was cancelled"
		}
		if wrote {
			msg += " before the server answered"
		} else {
			msg += " before the request was sent"
		}
	}
	status := int(tr.status.Load())
	switch {
	case !wrote:
		return toolkit.Retryable(&Error{Kind: ErrUnavailable, Msg: "the request did not reach the server: " + msg})
	case serverRPCError(err) != nil:
		rpc := serverRPCError(err)
		return &Error{Kind: ErrServer, Msg: fmt.Sprintf("the server answered with error %d: %s",
			rpc.Code, c.text(s, rpc.Message, maxMessage))}
	case sessionForgotten(err, tr):
		return toolkit.Retryable(&Error{Kind: ErrUnavailable, Msg: "the server no longer has the session: " + msg})
	case status == http.StatusTooManyRequests:
		reset, ok := toolkit.RateLimitReset(tr.responseHeader(), time.Now())
		if !ok {
			reset = time.Now().Add(defaultRateLimit)
		}
		return toolkit.RateLimited(reset, &Error{Kind: ErrServer, Msg: "the server is rate limiting calls (HTTP 429)"})
	case status >= 300 && status < 500:
		// The server refused the request before acting on it.
		return &Error{Kind: ErrServer, Msg: fmt.Sprintf("the server refused the request with HTTP %d: %s", status, msg)}
	default:
		// Written, and no answer: a broken stream, a dead process, a 5xx
		// from the server or a proxy, the deadline.
		return toolkit.OutcomeUnknown(&Error{Kind: ErrNoAnswer, Msg: msg})
	}
}

// serverRPCError finds a JSON-RPC error that the server sent in err's chain.
func serverRPCError(err error) *jsonrpc.Error {
	var found *jsonrpc.Error
	var walk func(error) bool
	walk = func(e error) bool {
		for e != nil {
			if w, ok := e.(*jsonrpc.Error); ok && !localCodes[w.Code] {
				found = w
				return true
			}
			switch u := e.(type) {
			case interface{ Unwrap() []error }:
				for _, sub := range u.Unwrap() {
					if walk(sub) {
						return true
					}
				}
				return false
			case interface{ Unwrap() error }:
				e = u.Unwrap()
			default:
				return false
			}
		}
		return false
	}
	walk(err)
	return found
}

// result maps a tools/call result.
func (c *Connector) result(s *session, res *sdk.CallToolResult) *toolkit.Result {
	if res.NeedsInput() {
		// A 2026-07-28 server asking for elicitation or sampling before it
		// goes on. Nobody can answer: it stopped without acting.
		return toolkit.Failure("the server asked for input from a user or a model (elicitation or sampling), which toolsvc does not provide")
	}
	text, others := contentText(res.Content)
	msg := c.text(s, text, maxMessage)
	var value any
	switch {
	case res.StructuredContent != nil:
		value = c.scrubValue(s, res.StructuredContent)
	case len(others) > 0:
		// Images, audio, resources: keep the content blocks as the server
		// sent them.
		raw, err := json.Marshal(res.Content)
		if err == nil {
			var v any
			if json.Unmarshal(raw, &v) == nil {
				value = c.scrubValue(s, v)
			}
		}
		if msg == "" {
			msg = "the result holds " + strings.Join(others, ", ") + " content"
		}
	case text != "":
		value = c.scrubValue(s, text)
	}
	if res.IsError {
		if msg == "" {
			msg = "the tool reported an error without a message"
		}
		return &toolkit.Result{Success: false, Message: msg, Value: value}
	}
	return &toolkit.Result{Success: true, Message: msg, Value: value}
}

// contentText joins the text blocks of a result and names the kinds of the
// others.
func contentText(content []sdk.Content) (string, []string) {
	var texts, others []string
	for _, b := range content {
		switch b := b.(type) {
		case *sdk.TextContent:
			texts = append(texts, b.Text)
		case *sdk.ImageContent:
			others = append(others, "image")
		case *sdk.AudioContent:
			others = append(others, "audio")
		case *sdk.ResourceLink:
			others = append(others, "resource link")
		case *sdk.EmbeddedResource:
			others = append(others, "resource")
		default:
			others = append(others, "other")
		}
	}
	return strings.Join(texts, "\n"), others
}

// scrubValue cleans every string of a result value of the session's secrets.
func (c *Connector) scrubValue(s *session, v any) any {
	if s != nil && s.scrub != nil && s.scrub.sc != nil {
		v = scrubWith(s.scrub, v)
	}
	return c.ss.value(v)
}

func scrubWith(sc *scrubber, v any) any {
	switch v := v.(type) {
	case string:
		return sc.scrub(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = scrubWith(sc, e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[sc.scrub(k)] = scrubWith(sc, e)
		}
		return out
	default:
		return v
	}
}
