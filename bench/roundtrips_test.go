package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// groupCallers is how many callers of each kind TestPostgresStoreRoundTrips
// queues at once.
const groupCallers = 8

// roundTripCalls is how many calls each measured phase of
// TestPostgresRoundTripsPerCall makes.
const roundTripCalls = 50

// TestPostgresRoundTripsPerCall counts the round trips between toolsvc and
// Postgres per executed call and per replay, on a real server over gRPC.
// The server's database URL points at a proxy that reads the frontend side
// of the wire protocol: a client waits for the server once per Sync (the
// extended protocol: a statement, a prepare, or a whole pipelined batch) and
// once per simple Query, so those are the round trips. It sorts them into
//
//   - executions: a Query, or a Sync after at least one Execute — the cost
//     of the call;
//   - prepares: a Sync after Parse/Describe only — pgx prepares each
//     statement once per connection (the statement cache), a per-connection
//     cost that the warm-up pays;
//   - pings: pgxpool's liveness "-- ping" of a connection that sat idle for
//     more than a second, a cost of idleness, not of the call.
//
// It also logs the statements of one executed call and one replay, one line
// per round trip.
func TestPostgresRoundTripsPerCall(t *testing.T) {
	cfg := apptest.Config(t, apptest.Postgres)
	cfg.Idempotency.ReaperInterval = time.Hour
	opts := app.Options{HealthInterval: time.Hour}
	proxy := startWireProxy(t, cfg.DatabaseURL)
	cfg.DatabaseURL = proxy.url
	s := serve(t, cfg, opts)
	// Let the first reaper round, which starts with the server, finish.
	time.Sleep(300 * time.Millisecond)

	// Warm up: the first calls create the tool's health record and prepare
	// the statements on the connections they use.
	for i := range 10 {
		key := fmt.Sprintf("rt-warm-%d", i)
		s.mustExecute(t, key, false)
		s.mustExecute(t, key, true)
	}

	proxy.record()
	s.mustExecute(t, "rt-logged", false)
	execLog := proxy.record()
	s.mustExecute(t, "rt-logged", true)
	replayLog := proxy.record()
	proxy.stop()
	t.Logf("one executed call, one line per round trip:\n\t%s", strings.Join(execLog, "\n\t"))
	t.Logf("one replay, one line per round trip:\n\t%s", strings.Join(replayLog, "\n\t"))

	keys := make([]string, roundTripCalls)
	before := proxy.counts()
	for i := range keys {
		keys[i] = fmt.Sprintf("rt-%d", i)
		s.mustExecute(t, keys[i], false)
	}
	afterExec := proxy.counts()
	for _, k := range keys {
		s.mustExecute(t, k, true)
	}
	afterReplay := proxy.counts()

	exec, replay := afterExec.minus(before), afterReplay.minus(afterExec)
	perExec := float64(exec.executions) / roundTripCalls
	perReplay := float64(replay.executions) / roundTripCalls
	t.Logf("executed call: %.2f round trips (and, over %d calls, %d prepares, %d pings)",
		perExec, roundTripCalls, exec.prepares, exec.pings)
	t.Logf("replay:        %.2f round trips (and, over %d calls, %d prepares, %d pings)",
		perReplay, roundTripCalls, replay.prepares, replay.pings)
	if perExec < 1 || perReplay < 1 {
		t.Fatalf("implausible measurement: %.2f round trips per executed call, %.2f per replay", perExec, perReplay)
	}
	// The budget: one statement to reserve (the claim reads the key: no
	// lookup before it), one to record; a replay's claim finds the key held
	// and answers with the holder in the same statement, which stores the
	// replay's event. Nothing else runs on the connections meanwhile (reaper and
	// health ping are an hour away), so the counts are exact; the allowance
	// is for a stray statement.
	const allowance = 2.0 / roundTripCalls
	if perExec > 2+allowance {
		t.Errorf("an executed call costs %.2f round trips, want at most 2 (reserve, record)", perExec)
	}
	if perReplay > 1+allowance {
		t.Errorf("a replay costs %.2f round trips, want at most 1 (the claim that finds the holder, with its audit event)", perReplay)
	}
}

// TestPostgresStoreRoundTrips counts, through the same proxy, the round
// trips of each store method on the hot path, and of starting a parked call,
// on a store with one connection. Each is measured on its second use: the
// first prepares its statements on the connection. Concurrent writes share
// round trips (group commit): statements queued while the connection is
// busy go together in one.
func TestPostgresStoreRoundTrips(t *testing.T) {
	proxy := startWireProxy(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(proxy.url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	st := postgres.New(pool)
	defer st.Close()

	now := time.Now().UTC().Truncate(time.Microsecond)
	if _, err := st.CreateTool(ctx, store.CreateToolParams{Tool: &store.Tool{Name: "files", Incarnation: "inc-files"}, Now: now}); err != nil {
		t.Fatal(err)
	}
	seq := 0
	newCall := func(state store.CallState) *store.Call {
		seq++
		c := &store.Call{
			ID: audit.NewID(), PrincipalID: principal, IdempotencyKey: fmt.Sprintf("store-rt-%d", seq),
			Fingerprint: "fp", Tool: "files", Action: "write", State: state,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
		}
		if state == store.CallInProgress {
			c.AttemptCount, c.LeaseExpiresAt = 1, now.Add(time.Minute)
		} else {
			c.ApprovalID = audit.NewID()
		}
		return c
	}
	event := func(callID string) []store.AuditEvent {
		return []store.AuditEvent{audit.NewDetail(audit.ToolCallAttempted, store.AuditEvent{
			Time: now, CallID: callID, Principal: principal, Tool: "files", Action: "write",
		}, map[string]any{"attempt": 1})}
	}
	claim := func(c *store.Call) {
		p := store.ClaimCallParams{Call: c, Lease: time.Minute, Events: event(c.ID)}
		if c.State == store.CallAwaitingApproval {
			p.Approval = &store.Approval{
				ID: c.ApprovalID, CallID: c.ID, Requester: principal, Tool: "files", Action: "write",
				Fingerprint: c.Fingerprint, IdempotencyKey: c.IdempotencyKey, State: store.ApprovalPending,
				CreatedAt: now, ExpiresAt: now.Add(time.Hour),
			}
		}
		if _, ok, err := st.ClaimCall(ctx, p); err != nil || !ok {
			t.Fatalf("ClaimCall: %v %v", ok, err)
		}
	}
	finish := func(c *store.Call, health bool) {
		p := store.FinishCallParams{
			CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: &store.Result{Success: true},
			Now: now, ExpiresAt: now.Add(time.Hour), Events: event(c.ID),
			History: &store.TaskHistoryEntry{PrincipalID: principal, TaskID: "task", CallID: c.ID, Tool: "files", Action: "write", At: now},
		}
		if health {
			p.Health = &store.HealthChange{Tool: "files", Fn: func(cur store.ToolHealth) *store.HealthUpdate {
				cur.LastSuccessAt = now
				return &store.HealthUpdate{Health: cur}
			}}
		}
		if _, err := st.FinishCall(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	parked := func() *store.Call {
		c := newCall(store.CallAwaitingApproval)
		claim(c)
		if _, err := st.ResolveApproval(ctx, store.ResolveApprovalParams{
			ID: c.ApprovalID, State: store.ApprovalApproved, Resolver: "approver", Now: now,
		}); err != nil {
			t.Fatal(err)
		}
		return c
	}

	ops := []struct {
		name  string
		setup func() *store.Call
		op    func(c *store.Call)
		max   int64
	}{
		{"AppendAuditEvents (1 event)", nil, func(*store.Call) {
			if err := st.AppendAuditEvents(ctx, event("")); err != nil {
				t.Fatal(err)
			}
		}, 1},
		{"ClaimCall IN_PROGRESS (1 event)", nil, func(*store.Call) { claim(newCall(store.CallInProgress)) }, 1},
		{"ClaimCall AWAITING_APPROVAL (approval, 1 event, notify)", nil, func(*store.Call) {
			claim(newCall(store.CallAwaitingApproval))
		}, 1},
		{"ClaimCall of a held key (lost)", func() *store.Call {
			c := newCall(store.CallInProgress)
			claim(c)
			return c
		}, func(held *store.Call) {
			c := newCall(store.CallInProgress)
			c.IdempotencyKey = held.IdempotencyKey
			if _, ok, err := st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute, Events: event(c.ID)}); err != nil || ok {
				t.Fatalf("ClaimCall of a held key: %v %v", ok, err)
			}
		}, 1},
		{"FinishCall (1 event, task history)", func() *store.Call {
			c := newCall(store.CallInProgress)
			claim(c)
			return c
		}, func(c *store.Call) { finish(c, false) }, 1},
		{"FinishCall with a health change", func() *store.Call {
			c := newCall(store.CallInProgress)
			claim(c)
			return c
		}, func(c *store.Call) { finish(c, true) }, 0},
		{fmt.Sprintf("%d concurrent ClaimCall + %d AppendAuditEvents, queued", groupCallers, groupCallers), nil, func(*store.Call) {
			// Hold the store's one connection while the callers queue up,
			// then let them go: their statements share one round trip (a
			// caller that came late may need a second).
			held, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			calls := make([]*store.Call, groupCallers)
			for i := range calls {
				calls[i] = newCall(store.CallInProgress)
			}
			for _, c := range calls {
				wg.Go(func() {
					if _, ok, err := st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute, Events: event(c.ID)}); err != nil || !ok {
						t.Errorf("ClaimCall: %v %v", ok, err)
					}
				})
				wg.Go(func() {
					if err := st.AppendAuditEvents(ctx, event("")); err != nil {
						t.Error(err)
					}
				})
			}
			time.Sleep(200 * time.Millisecond)
			held.Release()
			wg.Wait()
		}, 2},
		{"StartParkedCall (approval, 1 event, notify)", parked, func(c *store.Call) {
			if _, err := st.StartParkedCall(ctx, store.StartParkedCallParams{
				CallID: c.ID, ApprovalID: c.ApprovalID, Now: now, Lease: time.Minute,
				Events: event(c.ID),
			}); err != nil {
				t.Fatal(err)
			}
		}, 2},
	}
	var lines []string
	for _, o := range ops {
		var n wireCounts
		for range 2 { // the first use prepares
			var c *store.Call
			if o.setup != nil {
				c = o.setup()
			}
			before := proxy.counts()
			o.op(c)
			n = proxy.counts().minus(before)
		}
		lines = append(lines, fmt.Sprintf("%-60s %d", o.name, n.executions))
		if o.max > 0 && n.executions > o.max {
			t.Errorf("%s: %d round trips, want at most %d", o.name, n.executions, o.max)
		}
	}
	t.Logf("round trips per store method:\n\t%s", strings.Join(lines, "\n\t"))
}

// wireCounts are the round trips a wireProxy has seen, by kind.
type wireCounts struct{ executions, prepares, pings int64 }

func (c wireCounts) minus(o wireCounts) wireCounts {
	return wireCounts{c.executions - o.executions, c.prepares - o.prepares, c.pings - o.pings}
}

// wireProxy forwards TCP connections to a Postgres server and reads the
// messages the clients send (never the server's answers, which it passes
// through untouched). It needs sslmode=disable, which the test URLs have; it
// answers an SSL or GSS encryption request with "no" itself.
type wireProxy struct {
	url string
	ln  net.Listener

	mu        sync.Mutex
	n         wireCounts
	recording bool
	log       []string
	stmts     map[string]string // prepared statement name -> SQL (pgx names them by their SQL)
	conns     []net.Conn
	wg        sync.WaitGroup
}

// startWireProxy serves a proxy to dbURL's server until t ends; its url is
// dbURL with the proxy's address.
func startWireProxy(t *testing.T, dbURL string) *wireProxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if u.Query().Get("sslmode") != "disable" {
		t.Fatalf("the wire proxy needs sslmode=disable in %s", u.Redacted())
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Host = ln.Addr().String()
	p := &wireProxy{url: u.String(), ln: ln, stmts: map[string]string{}}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Go(func() { p.serveConn(c, target) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *wireProxy) counts() wireCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// record starts recording round trips and returns what was recorded since
// the previous call.
func (p *wireProxy) record() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.log
	p.log, p.recording = nil, true
	return out
}

func (p *wireProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log, p.recording = nil, false
}

// wireConn is what a proxied connection has sent since its last Sync.
type wireConn struct {
	unnamed  string   // the SQL of the unnamed prepared statement
	parsed   []string // statements parsed
	bound    []string // statements bound (executed)
	executed bool
}

// Frontend protocol codes (the first int32 of an untyped startup message).
const (
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
)

func (p *wireProxy) serveConn(client net.Conn, target string) {
	defer client.Close()
	server, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer server.Close()
	p.mu.Lock()
	p.conns = append(p.conns, server)
	p.mu.Unlock()
	go func() {
		_, _ = io.Copy(client, server)
		client.Close()
	}()
	r := bufio.NewReader(client)

	// Startup: untyped messages, an encryption request answered here.
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[:]))
		if n < 8 {
			return
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		code := binary.BigEndian.Uint32(body[:4])
		if code == sslRequestCode || code == gssEncRequestCode {
			if _, err := client.Write([]byte{'N'}); err != nil {
				return
			}
			continue
		}
		if _, err := server.Write(append(hdr[:], body...)); err != nil {
			return
		}
		break
	}

	// Typed messages.
	var st wireConn
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[1:]))
		if n < 4 {
			return
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		p.observe(&st, hdr[0], body)
		if _, err := server.Write(append(hdr[:], body...)); err != nil {
			return
		}
	}
}

// observe accounts for one frontend message.
func (p *wireProxy) observe(st *wireConn, typ byte, body []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch typ {
	case 'Q': // simple query: a round trip of its own
		q := cstrings(body, 1)[0]
		if q == "-- ping" {
			p.n.pings++
			return
		}
		p.n.executions++
		p.trace("query: " + short(q))
	case 'P': // Parse: name, query
		s := cstrings(body, 2)
		if s[0] == "" {
			st.unnamed = s[1]
		} else {
			p.stmts[s[0]] = s[1]
		}
		st.parsed = append(st.parsed, short(s[1]))
	case 'B': // Bind: portal, statement
		s := cstrings(body, 2)
		sql := st.unnamed
		if s[1] != "" {
			sql = p.stmts[s[1]]
		}
		st.bound = append(st.bound, short(sql))
	case 'E':
		st.executed = true
	case 'S': // Sync: the client now waits for ReadyForQuery
		if st.executed {
			p.n.executions++
			p.trace(strings.Join(st.bound, " | "))
		} else {
			p.n.prepares++
			p.trace("prepare: " + strings.Join(st.parsed, " | "))
		}
		*st = wireConn{unnamed: st.unnamed}
	}
}

func (p *wireProxy) trace(line string) {
	if p.recording {
		p.log = append(p.log, line)
	}
}

// cstrings returns the first n NUL-terminated strings of b.
func cstrings(b []byte, n int) []string {
	out := make([]string, n)
	for i := range n {
		j := bytes.IndexByte(b, 0)
		if j < 0 {
			out[i] = string(b)
			b = nil
			continue
		}
		out[i], b = string(b[:j]), b[j+1:]
	}
	return out
}

// short is a statement on one line, cut to a readable length.
func short(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	const maxLen = 90
	if len(s) > maxLen {
		s = s[:maxLen] + "…"
	}
	return s
}
