// Package connhost is the connector host (tools.ConnectorHost): it runs the
// tools declared as connectors, whose definitions package connector owns:
// an HTTP API through the HTTP connector (httpconn), an MCP server through
// one long-lived MCP session per connector, shared by its calls. It is the
// glue between the registry and the protocol clients, and it owns what is
// policy rather than protocol: which server tool an action calls, previews
// mapped to side-effect-free actions, re-discovery when a server says its
// tool list changed (and retries when a discovery failed), and scrubbing
// every secret a connector fetched from what it returns.
//
// The MCP client (package internal/tools/mcp) is reached through MCPClient
// and MCPDialer, so that this package is tested with a fake and the client
// can change without touching it.
package connhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/httpconn"
	"github.com/toolsvc/toolsvc/toolkit"
)

// MCPConfig is how to reach one MCP server: internal/tools/mcp's Config.
type MCPConfig struct {
	ID        string
	Transport string // "stdio" or "http"
	Command   []string
	// Path is the program a stdio server runs, resolved by the trust rules
	// for a connector not declared in the tools file; empty: Command[0],
	// looked up in PATH when the server starts.
	Path           string
	Env            map[string]secrets.Value
	URL            string
	Headers        map[string]secrets.Value
	CallTimeout    time.Duration
	ConnectTimeout time.Duration
	// Scrub removes the secrets the session fetched from text: the
	// session's scrubber, for the client to apply to what it logs.
	Scrub func(string) string `json:"-"`
}

// MCPClient is one session with an MCP server, shared by concurrent calls.
type MCPClient interface {
	// Tools lists the server's tools (tools/list, every page), each with
	// its action name mapped from the server's name. A tool the client
	// left out may be listed with its Problem set.
	Tools(ctx context.Context) ([]connector.ServerTool, error)
	// Call calls a tool by the server's name. A result with isError is a
	// Result with Success false; errors are toolkit.Retryable (failed
	// before the request was written), toolkit.OutcomeUnknown (after) or
	// plain.
	Call(ctx context.Context, serverTool string, args json.RawMessage) (*toolkit.Result, error)
	// OnListChanged registers fn, called on notifications/tools/list_changed.
	OnListChanged(fn func())
	// Problem says why no session is open now, when the last attempt to
	// open one failed (the server does not start, cannot be reached); ""
	// when a session is open, is being opened or was never tried.
	Problem() string
	// Close ends the session (and a stdio server's process).
	Close() error
}

// MCPDialer opens a session for cfg. st fetches the secrets its
// environment and headers reference; the dialer should not block on the
// network (the session connects on first use).
type MCPDialer func(cfg MCPConfig, st secrets.Store, log *slog.Logger) (MCPClient, error)

// ErrNoMCP: this build or configuration serves no MCP connectors.
var ErrNoMCP = errors.New("no MCP client is configured in this server")

// Timeouts of discovery and re-discovery.
const (
	discoverTimeout = 30 * time.Second
	resyncTimeout   = time.Minute
	// Retries of a failed discovery back off from minRetry to maxRetry.
	minRetry = 2 * time.Second
	maxRetry = 2 * time.Minute
)

// Options configure a Host.
type Options struct {
	// Secrets is the secrets store connectors fetch credentials from.
	Secrets secrets.Store
	// HTTPTransport sends the HTTP connectors' requests; nil means
	// http.DefaultTransport.
	HTTPTransport http.RoundTripper
	// MCP opens MCP sessions; nil serves no MCP connector (ErrNoMCP).
	MCP MCPDialer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
	// Trust decides what a connector not declared in the tools file may
	// run and where its secrets may go; nil trusts nothing but the tools
	// file (docs/connectors.md#threat-model).
	Trust *connector.Trust
	// OnProblem, if set, is told when a registered connector becomes
	// unable to serve (a discovery that failed: problem says why) and when
	// it can again (problem ""). It runs on the goroutine that found out
	// and must not block on the Host.
	OnProblem func(id, problem string)
}

// ResyncFunc re-discovers the connector named id and stores what changed
// (registry.Rediscover).
type ResyncFunc func(ctx context.Context, id string) error

// Host serves connector tools. It is safe for concurrent use.
type Host struct {
	o   Options
	log *slog.Logger

	ctx    context.Context // ends with Close: background work
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// retryBase is the first retry delay after a failed discovery.
	retryBase time.Duration

	mu       sync.Mutex
	closed   bool
	sessions map[string]*session // by connector id
	resync   ResyncFunc
	syncs    map[string]*syncState // by connector id
	// problems holds, by connector id, why the last discovery of a
	// registered connector failed (cleared by one that succeeds).
	problems map[string]string
}

// session is an MCP session for one configuration of a connector.
type session struct {
	key    string // the configuration it was opened for
	client MCPClient
	scrub  *secrets.Scrubber
}

// syncState coalesces re-discoveries of one connector and paces retries.
type syncState struct {
	running, again bool
	failures       int // consecutive failed discoveries
	// stray counts consecutive re-discoveries that failed before asking
	// the server (the tool not stored yet, the store down): retried a few
	// times only, as the tool may be gone for good.
	stray int
	timer *time.Timer
}

// maxStrayRetries bounds the retries of re-discoveries that failed without
// asking the server.
const maxStrayRetries = 5

var _ tools.ConnectorHost = (*Host)(nil)

// New returns a Host. Call Close when done.
func New(o Options) *Host {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Host{
		o: o, log: o.Logger, ctx: ctx, cancel: cancel, retryBase: minRetry,
		sessions: map[string]*session{}, syncs: map[string]*syncState{}, problems: map[string]string{},
	}
}

// SetResync sets how a connector is re-discovered when its server says its
// tools changed, or after a failed discovery. Until it is set, nothing is
// re-discovered on the Host's own initiative.
func (m *Host) SetResync(fn ResyncFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.resync = fn
}

// Bind implements tools.ConnectorHost. A definition that did not come from
// the tools file and breaks the trust rules is refused (its *fault.Error).
func (m *Host) Bind(def *store.Tool) (toolkit.Tool, error) {
	if def == nil || def.Connector == nil {
		return nil, errors.New("not a connector")
	}
	spec := connector.Normalize(def.Connector)
	switch spec.Type {
	case connector.TypeHTTP:
		if def.Source != store.SourceFile {
			// Held to the trust rules whatever the registry let through.
			if err := m.o.Trust.CheckAPI(def.Name, spec); err != nil {
				return nil, err
			}
		}
		return httpconn.New(def, httpconn.Options{Secrets: m.o.Secrets, Transport: m.o.HTTPTransport, Now: m.o.Now})
	case connector.TypeMCP:
		if m.o.MCP == nil {
			return nil, ErrNoMCP
		}
		return newMCPTool(m, def, spec)
	}
	return nil, fmt.Errorf("unknown connector type %q", spec.Type)
}

// Discover implements tools.ConnectorHost: it asks the connector's session
// (opened for this definition if need be) for the server's tools. A
// failure schedules a retry, so that a server down at start is discovered
// once it answers.
func (m *Host) Discover(ctx context.Context, def *store.Tool) ([]connector.ServerTool, error) {
	if def == nil || def.Connector == nil {
		return nil, errors.New("not a connector")
	}
	spec := connector.Normalize(def.Connector)
	if spec.Type != connector.TypeMCP {
		return nil, fmt.Errorf("a connector of type %q has nothing to discover", spec.Type)
	}
	cfg, err := m.mcpConfig(def, spec)
	if err != nil {
		// Refused by the trust rules: nothing is started, nor retried.
		m.problem(def.Name, err.Error())
		return nil, err
	}
	s, err := m.session(cfg) //nolint:contextcheck // a session and its re-discovery outlive the request that opened them
	if err != nil {
		if !errors.Is(err, ErrNoMCP) {
			m.problem(def.Name, err.Error())
			m.failed(def.Name) // a secret may be set, a program installed, meanwhile
		}
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout+discoverTimeout)
	defer cancel()
	list, err := s.client.Tools(ctx)
	if err != nil {
		err = tools.ScrubError(s.scrub, err)
		// The session's own account of why it cannot open is stable from
		// one attempt to the next (the error says when the next one is).
		why := s.client.Problem()
		if why == "" {
			why = err.Error()
		}
		m.problem(def.Name, s.scrub.Scrub(why))
		m.failed(def.Name)
		return nil, err
	}
	m.succeeded(def.Name)
	m.problem(def.Name, "")
	for i := range list {
		list[i].Description = s.scrub.Scrub(list[i].Description)
	}
	return list, nil
}

// Probe implements tools.ConnectorHost: Discover for a definition that is not
// registered yet (RegisterTool), through a session of its own, so that a
// refused registration leaves nothing behind: when the server cannot be
// reached its session is closed at once (a stdio server's process with it)
// and nothing is retried. done(keep) ends the probe once the caller knows
// whether the definition was stored: kept, the session becomes the
// connector's (replacing one opened for another definition); otherwise it
// is closed. done is never nil.
func (m *Host) Probe(ctx context.Context, def *store.Tool) ([]connector.ServerTool, func(keep bool), error) {
	nothing := func(bool) {}
	if def == nil || def.Connector == nil {
		return nil, nothing, errors.New("not a connector")
	}
	spec := connector.Normalize(def.Connector)
	if spec.Type != connector.TypeMCP {
		return nil, nothing, fmt.Errorf("a connector of type %q has nothing to discover", spec.Type)
	}
	cfg, err := m.mcpConfig(def, spec)
	if err != nil {
		return nil, nothing, err
	}
	key := cfg.key()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, nothing, errors.New("the server is shutting down")
	}
	cur := m.sessions[cfg.ID]
	m.mu.Unlock()
	s := cur
	if cur == nil || cur.key != key {
		if s, err = m.open(cfg, key); err != nil {
			return nil, nothing, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout+discoverTimeout)
	defer cancel()
	list, err := s.client.Tools(ctx)
	if err != nil {
		if why := s.client.Problem(); why != "" && s != cur {
			// Why no session opened, without the next attempt the
			// session would make: the probe makes none.
			err = errors.New(why)
		}
		err = tools.ScrubError(s.scrub, err)
		if s != cur {
			m.closeSession(s)
		}
		return nil, nothing, err
	}
	for i := range list {
		list[i].Description = s.scrub.Scrub(list[i].Description)
	}
	if s == cur {
		// The registered connector's own session: it stays either way.
		return list, nothing, nil
	}
	var once sync.Once
	return list, func(keep bool) { //nolint:contextcheck // a session and its re-discovery outlive the request that opened them
		once.Do(func() {
			if !keep || !m.install(cfg.ID, s) {
				m.closeSession(s)
			}
		})
	}, nil
}

// Problem says why the connector named id cannot serve calls now, or "":
// its session cannot be opened (the last attempt failed), or it has none
// and its last discovery failed (until a discovery succeeds or a session
// opens).
func (m *Host) Problem(id string) string {
	m.mu.Lock()
	s := m.sessions[id]
	why := m.problems[id]
	m.mu.Unlock()
	if s != nil {
		return s.scrub.Scrub(s.client.Problem())
	}
	return why
}

// problem records (why "": clears) the problem of connector id, telling
// OnProblem when it changes.
func (m *Host) problem(id, why string) {
	m.mu.Lock()
	old := m.problems[id]
	if why == "" {
		delete(m.problems, id)
	} else {
		m.problems[id] = why
	}
	m.mu.Unlock()
	if old != why && m.o.OnProblem != nil {
		m.o.OnProblem(id, why)
	}
}

// mcpConfig is the session configuration of a definition. A definition
// that does not come from the tools file is held to the trust rules again
// here, whatever the registry let through (a definition stored before the
// rules, or by a replica configured otherwise, runs nothing they refuse),
// and its program is the allowed path its command resolves to now.
func (m *Host) mcpConfig(def *store.Tool, spec *connector.Spec) (MCPConfig, error) {
	ct := spec.ConnectTimeout
	if ct <= 0 {
		ct = connector.DefaultConnectTimeout
	}
	cfg := MCPConfig{
		ID: def.Name, Transport: spec.Transport, Command: spec.Command, Env: spec.Env,
		URL: spec.URL, Headers: spec.Headers, CallTimeout: def.Timeout, ConnectTimeout: ct,
	}
	if def.Source == store.SourceFile {
		return cfg, nil
	}
	if err := m.o.Trust.CheckAPI(def.Name, spec); err != nil {
		return cfg, err
	}
	if spec.Transport == connector.TransportStdio && !m.o.Trust.Anchored(def.Name, spec) {
		cfg.Path, _ = m.o.Trust.Program(spec.Command)
	}
	return cfg, nil
}

// key identifies a configuration: a session opened for another one is
// replaced. It holds references to secrets, never values.
func (c MCPConfig) key() string {
	b, _ := json.Marshal(c)
	return string(b)
}

// session returns the connector's session for cfg, opening it (and closing
// one opened for another configuration) if need be.
func (m *Host) session(cfg MCPConfig) (*session, error) {
	key := cfg.key()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errors.New("the server is shutting down")
	}
	if s := m.sessions[cfg.ID]; s != nil && s.key == key {
		m.mu.Unlock()
		return s, nil
	}
	m.mu.Unlock()
	s, err := m.open(cfg, key)
	if err != nil {
		return nil, err
	}
	if !m.install(cfg.ID, s) {
		// Closed meanwhile, or another caller opened the same session first.
		m.closeSession(s)
		m.mu.Lock()
		defer m.mu.Unlock()
		if cur := m.sessions[cfg.ID]; !m.closed && cur != nil && cur.key == key {
			return cur, nil
		}
		return nil, errors.New("the server is shutting down")
	}
	return s, nil
}

// open opens a session for cfg that is not (yet) the connector's.
func (m *Host) open(cfg MCPConfig, key string) (*session, error) {
	if m.o.MCP == nil {
		return nil, ErrNoMCP
	}
	sc := secrets.NewScrubber()
	cfg.Scrub = sc.Scrub
	client, err := m.o.MCP(cfg, secrets.Recording(m.o.Secrets, sc), m.log)
	if err != nil {
		return nil, toolkit.Retryable(sc.Error(fmt.Errorf("open the MCP session: %w", err)))
	}
	return &session{key: key, client: client, scrub: sc}, nil
}

// install makes s the session of connector id, closing the one it
// replaces. It returns false, installing nothing, when the Host is
// closed or already holds a session for the same configuration.
func (m *Host) install(id string, s *session) bool {
	m.mu.Lock()
	old := m.sessions[id]
	if m.closed || (old != nil && old.key == s.key) {
		m.mu.Unlock()
		return false
	}
	m.sessions[id] = s
	m.mu.Unlock()
	s.client.OnListChanged(func() { m.listChanged(id, s.key) })
	if old != nil {
		m.closeSession(old)
	}
	return true
}

func (m *Host) closeSession(s *session) {
	if err := s.client.Close(); err != nil {
		m.log.Warn("closing an MCP session failed", "error", s.scrub.Scrub(err.Error()))
	}
}

// listChanged re-discovers a connector whose current session (opened for
// key) said its tool list changed.
func (m *Host) listChanged(id, key string) {
	m.mu.Lock()
	s := m.sessions[id]
	m.mu.Unlock()
	if s == nil || s.key != key {
		return // a replaced session
	}
	m.log.Info("MCP server says its tools changed; discovering them again", "connector", id)
	m.trigger(id)
}

// Resync re-discovers the connector named id in the background (through
// the function SetResync set), as a list_changed notification does.
func (m *Host) Resync(id string) { m.trigger(id) }

// trigger runs a re-discovery of id in the background; a trigger while one
// runs makes it run once more after.
func (m *Host) trigger(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.resync == nil {
		return
	}
	st := m.state(id)
	if st.running {
		st.again = true
		return
	}
	st.running = true
	m.wg.Add(1)
	go m.runResync(id)
}

func (m *Host) state(id string) *syncState {
	st := m.syncs[id]
	if st == nil {
		st = &syncState{}
		m.syncs[id] = st
	}
	return st
}

func (m *Host) runResync(id string) {
	defer m.wg.Done()
	for {
		m.mu.Lock()
		fn := m.resync
		m.mu.Unlock()
		ctx, cancel := context.WithTimeout(m.ctx, resyncTimeout)
		err := fn(ctx, id)
		cancel()
		if err != nil && m.ctx.Err() == nil {
			m.logResyncFailure(id, err)
		}
		m.mu.Lock()
		st := m.state(id)
		switch {
		case err == nil:
			st.stray = 0
		case st.timer == nil && st.stray < maxStrayRetries && !m.closed:
			// It failed before asking the server (which schedules its
			// own retry): the tool may not be stored yet.
			st.stray++
			m.scheduleLocked(id, st)
		}
		if !st.again || m.closed {
			st.running = false
			m.mu.Unlock()
			return
		}
		st.again = false
		m.mu.Unlock()
	}
}

// logResyncFailure logs a failed re-discovery once: not when the tool is
// not stored yet (a list_changed that came before the registration it
// belongs to: retried, and nothing is wrong), nor when the connector's
// session could not open (the session logs each of its attempts, with why
// and when it tries again).
func (m *Host) logResyncFailure(id string, err error) {
	if f, ok := fault.As(err); ok && f.Reason == fault.ReasonToolNotFound {
		m.log.Debug("MCP re-discovery found no stored tool yet; retrying", "connector", id)
		return
	}
	m.mu.Lock()
	s := m.sessions[id]
	m.mu.Unlock()
	if s != nil && s.client.Problem() != "" {
		m.log.Debug("MCP re-discovery failed: no session with the server (logged by the session)", "connector", id)
		return
	}
	m.log.Warn("MCP re-discovery failed", "connector", id, "error", err.Error())
}

// failed schedules a retry of a failed discovery, backing off.
func (m *Host) failed(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.resync == nil {
		return
	}
	m.scheduleLocked(id, m.state(id))
}

// scheduleLocked arms the retry timer of id, backing off with each failure.
// Called with mu held.
func (m *Host) scheduleLocked(id string, st *syncState) {
	if st.timer != nil || m.resync == nil {
		return
	}
	delay := m.retryBase << min(st.failures, 10)
	delay = min(delay, maxRetry)
	st.failures++
	st.timer = time.AfterFunc(delay, func() {
		m.mu.Lock()
		st.timer = nil
		m.mu.Unlock()
		m.trigger(id)
	})
}

// succeeded ends the retries of id.
func (m *Host) succeeded(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.syncs[id]; st != nil {
		st.failures = 0
		if st.timer != nil {
			st.timer.Stop()
			st.timer = nil
		}
	}
}

// Forget closes the session of a connector that is no longer registered
// (a stdio server's process ends with it) and stops retrying its
// discovery.
func (m *Host) Forget(id string) {
	m.mu.Lock()
	s := m.sessions[id]
	delete(m.sessions, id)
	if st := m.syncs[id]; st != nil && st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
	m.mu.Unlock()
	if s != nil {
		m.closeSession(s)
	}
}

// Close ends background work and every MCP session.
func (m *Host) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	for _, st := range m.syncs {
		if st.timer != nil {
			st.timer.Stop()
			st.timer = nil
		}
	}
	sessions := m.sessions
	m.sessions = map[string]*session{}
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	for _, s := range sessions {
		m.closeSession(s)
	}
	return nil
}
