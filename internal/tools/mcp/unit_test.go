package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/secrets"
)

func TestMapActions(t *testing.T) {
	t.Parallel()
	h8 := func(s string) string { return hash(s)[:8] }
	long := strings.Repeat("A", 70)
	cases := []struct {
		names []string
		want  map[string]string
	}{
		{[]string{"read", "write-file", "x_1"}, map[string]string{"read": "read", "write-file": "write-file", "x_1": "x_1"}},
		{[]string{"Get Weather", "files.read", "ünïcode"}, map[string]string{
			"Get Weather": "get_weather", "files.read": "files_read", "ünïcode": "_n_code"}},
		// Collisions among mapped names: every one gets a hash.
		{[]string{"Send Mail", "send mail", "send.mail"}, map[string]string{
			"Send Mail": "send_mail-" + h8("Send Mail"), "send mail": "send_mail-" + h8("send mail"), "send.mail": "send_mail-" + h8("send.mail")}},
		// A valid name keeps itself; the mapped one that would take it moves.
		{[]string{"send_mail", "Send Mail"}, map[string]string{"send_mail": "send_mail", "Send Mail": "send_mail-" + h8("Send Mail")}},
		// Cut to 64; the hash fits in 64 too.
		{[]string{long}, map[string]string{long: strings.Repeat("a", 64)}},
		{[]string{long, long + "B"}, map[string]string{
			long: strings.Repeat("a", 55) + "-" + h8(long), long + "B": strings.Repeat("a", 55) + "-" + h8(long+"B")}},
		{[]string{"日本"}, map[string]string{"日本": "__"}},
		{[]string{"..."}, map[string]string{"...": "___"}},
	}
	for _, tc := range cases {
		got := mapActions(tc.names)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("mapActions(%q) = %v, want %v", tc.names, got, tc.want)
		}
	}
}

// The mapping depends on the set of names, not on their order, and always
// gives distinct valid action names.
func TestMapActionsProperties(t *testing.T) {
	t.Parallel()
	names := []string{"a", "A", "a.", "a_", "a-", "A B", "a b", "a_b", "x", "X", "über", "ÜBER", "", strings.Repeat("z", 80), strings.Repeat("Z", 80)}
	want := mapActions(names)
	checkActions(t, names, want)
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		shuffled := append([]string(nil), names...)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := mapActions(shuffled); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("order %q maps to %v, not %v", shuffled, got, want)
		}
	}
}

func FuzzMapActions(f *testing.F) {
	f.Add("Get Weather", "get_weather", "get weather")
	f.Add("a", "A", "")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		names := dedupe([]string{a, b, c})
		checkActions(t, names, mapActions(names))
	})
}

func checkActions(t *testing.T, serverNames []string, got map[string]string) {
	t.Helper()
	seen := map[string]string{}
	for _, n := range serverNames {
		a, ok := got[n]
		if !ok || !names.Valid(a) {
			t.Fatalf("%q maps to invalid %q", n, a)
		}
		if names.Valid(n) && a != n {
			t.Fatalf("valid name %q maps to %q", n, a)
		}
		if other, dup := seen[a]; dup {
			t.Fatalf("%q and %q both map to %q", other, n, a)
		}
		seen[a] = n
	}
}

func dedupe(ss []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func TestCheckSchema(t *testing.T) {
	t.Parallel()
	cases := []struct {
		schema string
		err    error
	}{
		{`{"type":"object","properties":{"a":{"$ref":"#/$defs/a"}},"$defs":{"a":{"type":"string"}}}`, nil},
		{`{"type":"object","properties":{"a":{"$ref":"https://example.com/a.json"}}}`, errRemoteRef},
		{`{"type":"object","properties":{"a":{"$ref":"a.json#/x"}}}`, errRemoteRef},
		{`{"type":"object","allOf":[{"$dynamicRef":"http://x/y"}]}`, errRemoteRef},
		{`{"type":"object","items":{"items":{"$ref":"//evil/x"}}}`, errRemoteRef},
		// A property named like a keyword is a name: its schema is checked.
		{`{"type":"object","properties":{"default":{"$ref":"http://x"},"const":{"type":"string"}}}`, errRemoteRef},
		{`{"type":"object","properties":{"$ref":{"type":"string"}}}`, nil},
		// Data is data.
		{`{"type":"object","default":{"$ref":"http://x"},"enum":[{"$ref":"http://y"}],"examples":[{"$ref":"z"}]}`, nil},
		{`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}`, nil},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}`, nil},
		{`{"$schema":"https://evil.example/meta","type":"object"}`, errMetaSchema},
		{`{"$schema":7,"type":"object"}`, errMetaSchema},
		{`["type"]`, errSchemaShape},
		{`"object"`, errSchemaShape},
		{`{"type":"object","description":"` + strings.Repeat("d", 200) + `"}`, errSchemaTooLarge},
	}
	for _, tc := range cases {
		var v any
		if err := json.Unmarshal([]byte(tc.schema), &v); err != nil {
			t.Fatal(err)
		}
		raw, err := checkSchema(v, 200)
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: err %v, want %v", tc.schema, err, tc.err)
		}
		if tc.err == nil && len(raw) == 0 {
			t.Errorf("%s: no schema returned", tc.schema)
		}
	}
	if raw, err := checkSchema(nil, 10); raw != nil || err != nil {
		t.Errorf("nil schema: %s %v", raw, err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	secret := secrets.Value{Secret: &secrets.Ref{Key: "k"}}
	ok := []Config{
		{ID: "a", Transport: TransportStdio, Command: []string{"server"}, Env: map[string]secrets.Value{"TOKEN": secret}},
		{ID: "a", Transport: TransportHTTP, URL: "https://mcp.example.com/mcp", Headers: map[string]secrets.Value{"Authorization": secret}},
		{ID: "a", Transport: TransportHTTP, URL: "http://127.0.0.1:9000/mcp", ProtocolVersion: "2025-06-18"},
	}
	for _, cfg := range ok {
		if err := cfg.validate(); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	bad := []struct {
		cfg  Config
		want []string
	}{
		{Config{}, []string{"id is required", "transport must be"}},
		{Config{ID: "a", Transport: TransportStdio}, []string{"command is required"}},
		{Config{ID: "a", Transport: TransportStdio, Command: []string{"x"}, URL: "http://x", Env: map[string]secrets.Value{
			"A=B": lit("v"), "C": {Literal: "v", Secret: &secrets.Ref{Key: "k"}}, "D": {Secret: &secrets.Ref{}}, "E": lit("a\nb"),
		}}, []string{"for transport http", `env name "A=B"`, "not both", "no key", "line break"}},
		{Config{ID: "a", Transport: TransportHTTP, URL: "https://user:pw@x/mcp"}, []string{"user info"}},
		{Config{ID: "a", Transport: TransportHTTP, URL: "ftp://x/mcp"}, []string{"http or https"}},
		{Config{ID: "a", Transport: TransportHTTP, URL: "/mcp"}, []string{"http or https"}},
		{Config{ID: "a", Transport: TransportHTTP, URL: "https://x/mcp", Command: []string{"x"}, Headers: map[string]secrets.Value{
			"Mcp-Session-Id": lit("s"), "Bad Header": lit("v"),
		}}, []string{"for transport stdio", "set by the transport", "not a valid HTTP header name"}},
		{Config{ID: "a", Transport: TransportHTTP, URL: "https://x/mcp", ProtocolVersion: "2099-01-01", CallTimeout: -1}, []string{"protocol version", "negative"}},
	}
	for _, tc := range bad {
		err := tc.cfg.validate()
		if err == nil {
			t.Errorf("%+v: accepted", tc.cfg)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %v lacks %q", tc.cfg, err, w)
			}
		}
		if _, err := New(tc.cfg, nil, nil); err == nil {
			t.Errorf("New accepted %+v", tc.cfg)
		}
	}
	// Messages name keys, never values.
	err := Config{ID: "a", Transport: TransportStdio, Command: []string{"x"}, Env: map[string]secrets.Value{"K": lit("hunter2\n")}}.validate()
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("message: %v", err)
	}
}

func TestScrubber(t *testing.T) {
	t.Parallel()
	const v = "s3cr3t/+?&="
	sc := newScrubber([]string{v, "", "s3cr3t"})
	for _, form := range []string{
		v, base64.StdEncoding.EncodeToString([]byte(v)), base64.RawURLEncoding.EncodeToString([]byte(v)),
		url.QueryEscape(v), url.PathEscape(v), "s3cr3t",
	} {
		got := sc.scrub("token=" + form + ";")
		if got != "token="+secrets.Redacted+";" {
			t.Errorf("%q scrubs to %q", form, got)
		}
	}
	if got := (&scrubber{}).scrub("x"); got != "x" {
		t.Error(got)
	}

	// Connector text: scrubbed before it is cut, so no prefix of a secret
	// survives a cut.
	ss := &scrubbers{extra: func(s string) string { return strings.ReplaceAll(s, "extra", "[X]") }}
	ss.add(newScrubber([]string{"abcdefgh"}))
	if got := ss.text("xx\x00abcdefgh extra", 100); got != "xx\uFFFD"+secrets.Redacted+" [X]" {
		t.Errorf("text: %q", got)
	}
	if got := ss.text(strings.Repeat("y", 8)+"abcdefgh", 12); strings.Contains(got, "abc") {
		t.Errorf("cut text keeps a prefix of the secret: %q", got)
	}
	v2 := ss.value(map[string]any{"k abcdefgh": []any{"abcdefgh", 1.5, map[string]any{"n": "\x00"}}})
	if got := fmt.Sprint(v2); strings.Contains(got, "abcdefgh") || strings.Contains(got, "\x00") {
		t.Errorf("value: %v", got)
	}
}

// The SDK's log records go through the scrubbing handler: every string
// attribute, the message and groups.
func TestLogHandler(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	ss := &scrubbers{}
	ss.add(newScrubber([]string{"topsecret"}))
	log := slog.New(&logHandler{next: slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), ss: ss})
	log.With("pre", "topsecret").Debug("msg topsecret", "err", errors.New("bad topsecret"),
		slog.Group("g", "s", "topsecret"), "n", 3, "long", strings.Repeat("z", 5000))
	out := buf.String()
	if strings.Contains(out, "topsecret") || strings.Count(out, secrets.Redacted) != 4 || strings.Contains(out, strings.Repeat("z", 1100)) {
		t.Errorf("log: %s", out)
	}
}

// A write to a server's stdin that provably went nowhere does not count as
// sent; any other failure does.
func TestTracedConnWrite(t *testing.T) {
	t.Parallel()
	req, err := jsonrpc.MakeID(float64(1))
	if err != nil {
		t.Fatal(err)
	}
	call := &jsonrpc.Request{ID: req, Method: methodCallTool}
	list := &jsonrpc.Request{ID: req, Method: "tools/list"}
	for _, tc := range []struct {
		err   error
		msg   jsonrpc.Message
		wrote bool
	}{
		{nil, call, true},
		{nil, list, false},
		{&os.PathError{Op: "write", Path: "|1", Err: syscall.EPIPE}, call, false},
		{os.ErrClosed, call, false},
		{io.ErrClosedPipe, call, false},
		{context.DeadlineExceeded, call, false},
		{errors.New("short write"), call, true},
	} {
		tr := &callTrace{}
		c := &tracedConn{Connection: failingConn{err: tc.err}}
		_ = c.Write(withTrace(context.Background(), tr), tc.msg)
		if tr.wrote.Load() != tc.wrote {
			t.Errorf("%v on %v: wrote %v, want %v", tc.err, tc.msg, tr.wrote.Load(), tc.wrote)
		}
	}
}

type failingConn struct{ err error }

func (failingConn) Read(context.Context) (jsonrpc.Message, error)  { return nil, io.EOF }
func (f failingConn) Write(context.Context, jsonrpc.Message) error { return f.err }
func (failingConn) Close() error                                   { return nil }
func (failingConn) SessionID() string                              { return "" }

func TestTail(t *testing.T) {
	t.Parallel()
	tl := &tail{max: 16}
	fmt.Fprint(tl, "line one\n")
	if tl.String() != "line one" {
		t.Errorf("%q", tl.String())
	}
	fmt.Fprint(tl, "secret-abc\nlast\n")
	// The front was dropped: the partial first line goes with it.
	if got := tl.String(); got != "last" {
		t.Errorf("%q", got)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	for f, want := range map[int]time.Duration{1: minBackoff, 3: 4 * minBackoff, 40: maxBackoff} {
		for range 20 {
			if d := backoff(f); d < want/2 || d > want {
				t.Errorf("backoff(%d) = %s, want within [%s, %s]", f, d, want/2, want)
			}
		}
	}
}

// A server that dies soon after each start is restarted once at once, then
// with backoff; a session that lasted resets that.
func TestFlapsBackOff(t *testing.T) {
	t.Parallel()
	c, err := New(Config{ID: "flappy", Transport: TransportStdio, Command: []string{"/nonexistent/server"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// lose ends a session of the given age; it reports the flap count,
	// whether a dial started at once, and when the next is due otherwise.
	lose := func(age time.Duration) (flaps int, dialed bool, next time.Time) {
		s := &session{openedAt: time.Now().Add(-age), scrub: &scrubber{}}
		c.mu.Lock()
		for c.dialing != nil { // let a dial in progress finish
			ch := c.dialing
			c.mu.Unlock()
			<-ch
			c.mu.Lock()
		}
		c.sess, c.nextDial = s, time.Time{}
		if c.retry != nil {
			c.retry.Stop()
		}
		before := c.failures
		c.mu.Unlock()
		c.detach(s, errors.New("gone"))
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.flaps, c.dialing != nil || c.failures > before, c.nextDial
	}
	if f, dialed, _ := lose(time.Second); f != 1 || !dialed {
		t.Errorf("first quick loss: flaps %d, dialed %v; want an immediate dial", f, dialed)
	}
	if f, dialed, next := lose(time.Second); f != 2 || dialed || time.Until(next) < minBackoff/4 {
		t.Errorf("second quick loss: flaps %d, dialed %v, next dial in %s; want a backoff", f, dialed, time.Until(next))
	}
	if f, dialed, _ := lose(time.Minute); f != 0 || !dialed {
		t.Errorf("a long session: flaps %d, dialed %v", f, dialed)
	}
}

func TestCappedBody(t *testing.T) {
	t.Parallel()
	read := func(body string, limit int64) (string, error) {
		b, err := io.ReadAll(&capped{ReadCloser: io.NopCloser(strings.NewReader(body)), left: limit})
		return string(b), err
	}
	if b, err := read("12345", 5); b != "12345" || err != nil {
		t.Errorf("at the bound: %q %v", b, err)
	}
	if b, err := read("123456", 5); !errors.Is(err, errTooLarge) || b != "12345" {
		t.Errorf("past the bound: %q %v", b, err)
	}
}
