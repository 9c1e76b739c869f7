// Package mcp is toolsvc's client for MCP servers (docs/connectors.md#mcp-connectors), built on the
// official Go SDK. A Connector holds one long-lived session with one server,
// over stdio (toolsvc starts the server process) or streamable HTTP, shared
// by every concurrent call. It discovers the server's tools (tools/list, all
// pages) as actions with names that follow the registry's rule, executes
// tools/call, and maps what happened to toolkit's outcomes:
//
//   - a result is a toolkit.Result (isError: Success false, the text as the
//     message; structuredContent, else the content, as the value);
//   - a request the server never received (no session could be opened, the
//     write failed, an HTTP session the server had forgotten) is
//     toolkit.Retryable: the tool did not act;
//   - a request that was written and then got no answer (the transport
//     broke, the server died, the deadline passed) is toolkit.OutcomeUnknown:
//     the tool may have acted;
//   - a JSON-RPC error or an HTTP refusal from the server is a plain error
//     (the tool failed; it counts against the tool's health).
//
// Discovery leaves out, with a logged reason (Discovery.Skipped), a tool
// whose input schema is larger than MaxSchemaBytes, not a JSON object, holds
// a $ref that leaves the document or names an unknown $schema, and a tool
// whose name is empty, unusable or listed twice: one bad tool does not take
// the connector's other tools down with it.
//
// The SDK (v1.8.0) offers the newest revision, 2026-07-28, through
// server/discover and falls back to initialize, where the server picks
// 2025-11-25 or older; over streamable HTTP the SDK's servers offer
// 2026-07-28 only when they are stateless. The tests pin servers to
// 2025-06-18, 2025-11-25 and 2026-07-28 over both transports.
//
// Sessions are opened lazily or by Start, and reopened with backoff when the
// server goes away; a stdio server is restarted. Secrets for the server's
// environment and the HTTP headers are fetched each time a session is
// opened and dropped when it closes. The connector never advertises
// sampling, elicitation or roots, and refuses such requests from the server.
// Every text that comes from the server or its transport is made valid
// UTF-8 without NUL, scrubbed of the connection's secret values and bounded
// before it is returned or logged.
package mcp

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/secrets"
)

// Kinds of connector errors (errors.Is). Errors that Call returns are also
// wrapped in toolkit.Retryable or toolkit.OutcomeUnknown as the outcome
// requires.
var (
	// ErrClosed: the connector was closed.
	ErrClosed = errors.New("mcp connector closed")
	// ErrUnavailable: no session could be opened, or the request could not
	// be sent. The server did not act.
	ErrUnavailable = errors.New("mcp server unavailable")
	// ErrServer: the server answered with a JSON-RPC error or refused the
	// HTTP request.
	ErrServer = errors.New("mcp server error")
	// ErrNoAnswer: the request was sent and no answer came (the transport
	// broke, the server died, the deadline passed). The server may have
	// acted.
	ErrNoAnswer = errors.New("mcp server did not answer")
	// ErrDiscovery: the server's tool list could not be read whole.
	ErrDiscovery = errors.New("mcp discovery failed")
	// ErrArguments: the arguments given to Call are not a JSON object.
	ErrArguments = errors.New("invalid arguments")
)

// Error is an error of the connector. Its text is safe to return, store and
// log (bounded, valid UTF-8, scrubbed); Unwrap gives its kind.
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

// Backoff between attempts to open a session, after the first failure.
const (
	minBackoff = 250 * time.Millisecond
	maxBackoff = 30 * time.Second
	// maxIdleConns is how many idle connections to one MCP server are kept.
	maxIdleConns = 64
	// stopGrace is how long a stdio server has to exit after its stdin is
	// closed, and again after SIGTERM, before it is killed.
	stopGrace = 2 * time.Second
	// maxDialWait is the longest a call waits for a scheduled attempt to
	// open a session.
	maxDialWait = time.Second
	// idleConnTimeout closes idle HTTP connections before the server does.
	idleConnTimeout = 4 * time.Second
	// minStable is how long a session must last for its loss not to count
	// as a flap: a server that dies right after each start is restarted
	// with backoff, not in a tight loop.
	minStable = 10 * time.Second
	// stderrTail is how much of a stdio server's stderr is kept for the
	// log line that reports its exit.
	stderrTail = 4096
)

// Connector is a client of one MCP server. It is safe for concurrent use;
// Close releases its session, its server process and its goroutines.
type Connector struct {
	cfg    Config
	store  secrets.Store
	log    *slog.Logger
	ss     *scrubbers
	client *sdk.Client

	closeCtx context.Context // done when Close starts: dials and calls end
	stop     context.CancelFunc
	wg       sync.WaitGroup // dials, session watchers and closers, the notifier
	changed  chan struct{}  // capacity 1: a tool list change to announce

	mu        sync.Mutex
	sess      *session      // the open session, nil when none
	dialing   chan struct{} // closed when the dial in progress ends; nil when none
	retry     *time.Timer   // the next scheduled dial after a failure
	nextDial  time.Time     // no dial on demand before this
	failures  int           // failed dials since the last success
	flaps     int           // sessions in a row that ended before minStable
	lastErr   string        // why the last dial or session failed (clean)
	opened    int           // sessions opened since New
	closed    bool
	listeners []func()
}

// session is one open connection to the server.
type session struct {
	cs       *sdk.ClientSession
	scrub    *scrubber // the secret values of this connection
	cmd      *exec.Cmd // stdio: the server process
	stderr   *tail     // stdio: the end of its stderr
	rt       *roundTripper
	protocol string
	server   string
	openedAt time.Time

	once sync.Once
}

// New validates cfg and returns a connector that opens its session on
// Start or on first use. st provides the secrets that cfg references (it may
// be nil when there are none); log may be nil.
func New(cfg Config, st secrets.Store, log *slog.Logger) (*Connector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ss := &scrubbers{extra: cfg.Scrub}
	log = slog.New(&logHandler{next: log.Handler(), ss: ss}).With("connector", cfg.ID)
	ctx, stop := context.WithCancel(context.Background())
	c := &Connector{
		cfg:      cfg,
		store:    st,
		log:      log,
		ss:       ss,
		closeCtx: ctx,
		stop:     stop,
		changed:  make(chan struct{}, 1),
	}
	c.client = sdk.NewClient(&sdk.Implementation{Name: "toolsvc", Version: clientVersion()}, &sdk.ClientOptions{
		Logger: log.With("component", "mcp-sdk"),
		// Advertise nothing: no roots, no sampling, no elicitation. The SDK
		// answers the server's sampling and elicitation requests with an
		// error when no handler is set.
		Capabilities: &sdk.ClientCapabilities{},
		// With 2026-07-28 a server asks for input by returning input
		// requests instead of sending them; Call refuses those itself.
		MultiRoundTrip: &sdk.MultiRoundTripOptions{Disabled: true},
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) {
			c.announceChange()
		},
	})
	c.wg.Add(1)
	go c.notify()
	return c, nil
}

// clientVersion is toolsvc's module version, as the client's
// implementation info.
func clientVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "dev"
}

// ID returns the connector id.
func (c *Connector) ID() string { return c.cfg.ID }

// Start opens the session now instead of at first use. It returns why it
// could not; the connector keeps trying in the background either way.
func (c *Connector) Start(ctx context.Context) error {
	_, err := c.session(ctx)
	return err
}

// OnListChanged registers fn to run when the server says its tool list
// changed, and after a lost session was reopened (the server may have
// changed while it was away). Callbacks run one at a time on a goroutine of
// the connector; they may call Tools, but not Close.
func (c *Connector) OnListChanged(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listeners = append(c.listeners, fn)
}

func (c *Connector) announceChange() {
	select {
	case c.changed <- struct{}{}:
	default: // one is pending already; it will be seen
	}
}

// notify runs the list-changed callbacks. They must not run on the SDK's
// reading goroutine: a callback that lists tools would wait for an answer
// that goroutine cannot read.
func (c *Connector) notify() {
	defer c.wg.Done()
	for {
		select {
		case <-c.closeCtx.Done():
			return
		case <-c.changed:
		}
		c.mu.Lock()
		fns := slices.Clone(c.listeners)
		c.mu.Unlock()
		for _, fn := range fns {
			fn()
		}
	}
}

// Status is what the connector knows of its server's health.
type Status struct {
	// Connected: a session is open.
	Connected bool
	// ProtocolVersion is the negotiated MCP revision of the open session.
	ProtocolVersion string
	// Server is the server's name and version, as it reported them.
	Server string
	// PID is the stdio server's process id, 0 when none runs.
	PID int
	// Opened counts the sessions opened since the connector was made: more
	// than one means the server went away and came back.
	Opened int
	// Failures counts failed attempts to open a session since the last
	// success; NextAttempt is when the next one is due.
	Failures    int
	NextAttempt time.Time
	// LastError says why the last attempt or the last session failed.
	LastError string
}

// Status reports the connector's state.
func (c *Connector) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{Opened: c.opened, Failures: c.failures, NextAttempt: c.nextDial, LastError: c.lastErr}
	if s := c.sess; s != nil {
		st.Connected, st.ProtocolVersion, st.Server = true, s.protocol, s.server
		if s.cmd != nil && s.cmd.Process != nil {
			st.PID = s.cmd.Process.Pid
		}
	}
	return st
}

// Problem says why no session is open, when the last attempt to open one
// failed (the server does not start, cannot be reached): the reason of that
// failure. It is "" while a session is open, and before the first attempt
// has failed.
func (c *Connector) Problem() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.sess != nil || c.failures == 0 {
		return ""
	}
	return c.lastErr
}

// Close closes the session (stopping a stdio server) and waits for the
// connector's goroutines. Calls in flight end: those whose request was sent
// report an unknown outcome. Close is idempotent.
func (c *Connector) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.wg.Wait()
		return nil
	}
	c.closed = true
	s := c.sess
	c.sess = nil
	if c.retry != nil {
		c.retry.Stop()
	}
	c.mu.Unlock()
	c.stop()
	if s != nil {
		s.close(c.ss)
	}
	c.wg.Wait()
	return nil
}

// session returns the open session, opening one if needed. While a dial is
// in progress callers wait for it (as long as their context allows). After
// a failure, a caller waits for the next attempt when it is due within
// maxDialWait (once: the server may be coming back), and is refused at once
// otherwise, so that a dead server is not hammered by every call.
func (c *Connector) session(ctx context.Context) (*session, error) {
	waited := false
	c.mu.Lock()
	for {
		if c.closed {
			c.mu.Unlock()
			return nil, &Error{Kind: ErrClosed, Msg: "the connector is closed"}
		}
		if s := c.sess; s != nil {
			c.mu.Unlock()
			return s, nil
		}
		if c.dialing == nil {
			if wait := time.Until(c.nextDial); wait > 0 {
				if waited || wait > maxDialWait {
					err := &Error{Kind: ErrUnavailable, Msg: "the server is unavailable (" + c.lastErr +
						"); the next attempt to connect is in " + wait.Round(time.Millisecond).String()}
					c.mu.Unlock()
					return nil, err
				}
				c.mu.Unlock()
				if err := sleep(ctx, wait); err != nil {
					return nil, &Error{Kind: ErrUnavailable, Msg: "no session with the server before the deadline: " + c.lastErrSnapshot()}
				}
				waited = true
				c.mu.Lock()
				continue
			}
			c.dialLocked() //nolint:contextcheck // a session outlives the call that dialled it
		}
		waited = true // the one attempt a caller waits for
		ch := c.dialing
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, &Error{Kind: ErrUnavailable, Msg: "no session with the server before the deadline: " + ctx.Err().Error()}
		}
		c.mu.Lock()
	}
}

func (c *Connector) lastErrSnapshot() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// kick starts a dial unless the connector is closed, connected or dialing.
func (c *Connector) kick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dialLocked()
}

func (c *Connector) dialLocked() {
	if c.closed || c.sess != nil || c.dialing != nil {
		return
	}
	c.dialing = make(chan struct{})
	c.wg.Add(1)
	go c.dial()
}

// dial opens a session, detached from any caller's context (callers only
// wait for it), and schedules the next attempt when it fails.
func (c *Connector) dial() {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.closeCtx, c.cfg.ConnectTimeout)
	s, err := c.open(ctx)
	cancel()

	c.mu.Lock()
	done := c.dialing
	c.dialing = nil
	defer close(done)
	if c.closed {
		c.mu.Unlock()
		if s != nil {
			s.close(c.ss)
		}
		return
	}
	if err != nil {
		c.failures++
		wait := backoff(c.failures)
		c.nextDial = time.Now().Add(wait)
		c.lastErr = err.Error()
		c.retry = time.AfterFunc(wait, c.kick)
		failures := c.failures
		c.mu.Unlock()
		c.log.Warn("cannot open a session with the MCP server", "err", err.Error(),
			"attempt", failures, "retry_in", wait.Round(time.Millisecond).String())
		return
	}
	reopened := c.opened > 0
	s.openedAt = time.Now()
	c.sess = s
	c.opened++
	c.failures, c.nextDial, c.lastErr = 0, time.Time{}, ""
	c.wg.Add(1)
	c.mu.Unlock()

	go func() {
		defer c.wg.Done()
		err := s.cs.Wait()
		c.lost(s, err)
	}()
	attrs := []any{"protocol", s.protocol, "server", s.server}
	if s.cmd != nil {
		attrs = append(attrs, "pid", s.cmd.Process.Pid)
	}
	c.log.Info("MCP session opened", attrs...)
	if reopened {
		c.announceChange()
	}
}

// backoff is the wait before attempt failures+1: doubling from minBackoff
// up to maxBackoff, with jitter so that replicas do not retry in step.
func backoff(failures int) time.Duration {
	d := min(minBackoff<<min(failures-1, 16), maxBackoff)
	return d/2 + rand.N(d/2+1) //nolint:gosec // G404: jitter, not a secret
}

// lost handles the end of a session: it stops being the session calls use,
// and a new one is dialled.
func (c *Connector) lost(s *session, why error) {
	c.detach(s, why)
	s.close(c.ss)
}

// abandon is lost for a session that calls may still be using: it is
// closed on a goroutine of its own, since closing waits for them.
func (c *Connector) abandon(s *session, why error) {
	c.detach(s, why)
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.wg.Add(1)
	}
	c.mu.Unlock()
	if closed {
		s.close(c.ss)
		return
	}
	go func() {
		defer c.wg.Done()
		s.close(c.ss)
	}()
}

// detach makes s no longer the open session and dials a new one: at once,
// unless sessions keep ending soon after they open (then with backoff).
func (c *Connector) detach(s *session, why error) {
	reason := "the session ended"
	if why != nil {
		reason += ": " + c.text(s, why.Error(), maxMessage)
	}
	var wait time.Duration
	c.mu.Lock()
	if c.sess != s || c.closed {
		c.mu.Unlock()
		return
	}
	c.sess, c.lastErr = nil, reason
	if time.Since(s.openedAt) < minStable {
		c.flaps++
	} else {
		c.flaps = 0
	}
	if c.flaps > 1 {
		wait = backoff(c.flaps - 1)
		c.nextDial = time.Now().Add(wait)
		c.retry = time.AfterFunc(wait, c.kick)
	} else {
		c.dialLocked()
	}
	c.mu.Unlock()

	attrs := []any{"reason", reason}
	if wait > 0 {
		attrs = append(attrs, "retry_in", wait.Round(time.Millisecond).String())
	}
	if s.stderr != nil {
		if t := s.stderr.String(); t != "" {
			attrs = append(attrs, "stderr", c.text(s, t, maxLogText))
		}
	}
	c.log.Warn("MCP session lost; reconnecting", attrs...)
}

// close ends the session and frees what it holds: the SDK session, the
// server process group, the HTTP connections and the session's secrets.
func (s *session) close(ss *scrubbers) {
	s.once.Do(func() {
		_ = s.cs.Close()
		if s.cmd != nil {
			killProcessGroup(s.cmd)
			s.cmd.Env = nil // the secrets it was started with
		}
		if s.rt != nil {
			s.rt.close()
		}
		ss.remove(s.scrub)
	})
}

// text makes upstream text safe: scrubbed of s's secrets (s may be nil) and
// of every open connection's, valid UTF-8, at most limit bytes.
func (c *Connector) text(s *session, t string, limit int) string {
	if s != nil {
		t = s.scrub.scrub(t)
	}
	return c.ss.text(t, limit)
}

// open starts a session over the configured transport.
func (c *Connector) open(ctx context.Context) (*session, error) {
	if c.cfg.Transport == TransportStdio {
		return c.openStdio(ctx)
	}
	return c.openHTTP(ctx)
}

func (c *Connector) sessionOptions() *sdk.ClientSessionOptions {
	return &sdk.ClientSessionOptions{ProtocolVersion: c.cfg.ProtocolVersion}
}

// resolve fetches the values of vs now, returning them by name and the
// secret values among them (with and without their prefix) for scrubbing.
func (c *Connector) resolve(ctx context.Context, what string, vs map[string]secrets.Value) (map[string]secrets.Secret, []string, error) {
	out := make(map[string]secrets.Secret, len(vs))
	var hidden []string
	for _, k := range slices.Sorted(maps.Keys(vs)) {
		v := vs[k]
		s, err := v.Resolve(ctx, c.store, c.cfg.ID)
		if err != nil {
			// Store errors name the connector and the key, never a value.
			return nil, nil, &Error{Kind: ErrUnavailable, Msg: what + " " + safetext.Quote(k) + ": " + c.ss.text(err.Error(), maxMessage)}
		}
		out[k] = s
		if v.Secret != nil {
			hidden = append(hidden, s.Reveal(), strings.TrimPrefix(s.Reveal(), v.Secret.Prefix))
		}
	}
	return out, hidden, nil
}

// openStdio starts the server process and opens a session over its stdio.
func (c *Connector) openStdio(ctx context.Context) (*session, error) {
	env, hidden, err := c.resolve(ctx, "env", c.cfg.Env)
	if err != nil {
		return nil, err
	}
	s := &session{scrub: newScrubber(hidden), stderr: &tail{max: stderrTail}}
	c.ss.add(s.scrub)
	fail := func(err error) (*session, error) {
		msg := c.text(s, err.Error(), maxMessage)
		if t := s.stderr.String(); t != "" {
			msg += "; stderr: " + c.text(s, t, maxMessage/2)
		}
		if s.cmd.Process != nil {
			killProcessGroup(s.cmd)
		}
		c.ss.remove(s.scrub)
		return nil, &Error{Kind: ErrUnavailable, Msg: "cannot start the server: " + msg}
	}

	// Not exec.CommandContext: the process lives as long as the session,
	// not as long as the dial.
	program := c.cfg.Command[0]
	if c.cfg.Path != "" {
		program = c.cfg.Path
	}
	// The program is the connector's command, allowed by the trust rules
	// (docs/connectors.md#threat-model); no shell reads it.
	s.cmd = exec.Command(program, c.cfg.Command[1:]...) //nolint:gosec // G204: see above
	s.cmd.Args[0] = c.cfg.Command[0]
	s.cmd.Env = processEnv(env)
	s.cmd.Dir = c.cfg.Dir
	s.cmd.Stderr = s.stderr
	// A grandchild holding stderr open must not hold Wait forever.
	s.cmd.WaitDelay = stopGrace
	ownProcessGroup(s.cmd)
	tt := &tracedTransport{inner: &sdk.CommandTransport{Command: s.cmd, TerminateDuration: stopGrace}}
	cs, err := c.client.Connect(ctx, tt, c.sessionOptions())
	if err != nil {
		if tt.conn != nil {
			_ = tt.conn.Close() // the SDK does not close it on every failure
		}
		return fail(err)
	}
	s.cs = cs
	s.describe(c)
	return s, nil
}

// openHTTP opens a session over streamable HTTP. The session's headers,
// with their secrets, live in its round tripper and go when it closes.
func (c *Connector) openHTTP(ctx context.Context) (*session, error) {
	hs, hidden, err := c.resolve(ctx, "header", c.cfg.Headers)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(c.cfg.URL)
	if err != nil { // validated in New
		return nil, &Error{Kind: ErrUnavailable, Msg: "invalid url"}
	}
	s := &session{scrub: newScrubber(hidden)}
	c.ss.add(s.scrub)
	base := http.DefaultTransport.(*http.Transport).Clone()
	// A request sent on a kept-alive connection that the server closes at
	// that moment gets no answer, and a tools/call without an answer is an
	// unknown outcome. Servers close idle connections after as little as
	// 5s (Node's default); closing them first makes that race rare.
	base.IdleConnTimeout = idleConnTimeout
	// Concurrent calls each hold a connection: keep as many for the next
	// calls as are likely in use, rather than the default two (beyond them
	// every call would dial anew).
	base.MaxIdleConnsPerHost = maxIdleConns
	s.rt = &roundTripper{
		base:   base,
		origin: origin(u),
		// The 2026-07-28 notification stream ending means the server went
		// away or forgot the subscription; either way a new session is
		// needed to hear of tool list changes again.
		onListenEnd: func() { c.abandonAsync(s, errors.New("the server closed the notification stream")) },
	}
	for _, k := range slices.Sorted(maps.Keys(hs)) {
		s.rt.headers = append(s.rt.headers, header{name: k, value: hs[k]})
	}
	transport := &sdk.StreamableClientTransport{
		Endpoint:   c.cfg.URL,
		HTTPClient: &http.Client{Transport: s.rt, CheckRedirect: checkRedirect},
		// Resuming a broken response stream is worth a couple of tries, not
		// the SDK's default five with growing delays: a call waits for them.
		MaxRetries: 2,
	}
	cs, err := c.client.Connect(ctx, transport, c.sessionOptions())
	if err != nil {
		msg := c.text(s, err.Error(), maxMessage)
		s.rt.close()
		c.ss.remove(s.scrub)
		return nil, &Error{Kind: ErrUnavailable, Msg: "cannot open a session: " + msg}
	}
	s.cs = cs
	s.describe(c)
	return s, nil
}

// abandonAsync abandons s from a goroutine that must not block (the SDK's
// reading goroutines).
func (c *Connector) abandonAsync(s *session, why error) {
	c.mu.Lock()
	if c.closed || c.sess != s {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		c.abandon(s, why)
	}()
}

// processEnv is the stdio server's environment: the inherited variables,
// then the configured ones (which win).
func processEnv(env map[string]secrets.Secret) []string {
	out := make([]string, 0, len(InheritedEnv)+len(env))
	for _, k := range InheritedEnv {
		if _, set := env[k]; set {
			continue
		}
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k].Reveal())
	}
	return out
}

// describe records the negotiated protocol and the server's self-description.
func (s *session) describe(c *Connector) {
	res := s.cs.InitializeResult()
	if res == nil {
		return
	}
	s.protocol = res.ProtocolVersion
	if si := res.ServerInfo; si != nil {
		s.server = c.text(s, strings.TrimSpace(si.Name+" "+si.Version), 200)
	}
}
