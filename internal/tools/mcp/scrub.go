package mcp

import (
	"context"
	"log/slog"
	"sync"

	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/secrets"
)

// Bounds for upstream text.
const (
	// maxMessage bounds a result or error message.
	maxMessage = 4096
	// maxLogText bounds one string in a log record.
	maxLogText = 1024
	// maxDescription bounds a tool description (the registry's own rule is
	// stricter; the connector's glue fits it).
	maxDescription = 2048
)

// scrubber replaces the secret values of one connection, in every form
// secrets.Scrubber finds them (any letter case, escaped, encoded), with
// secrets.Redacted. It lives as long as the connection.
type scrubber struct {
	sc *secrets.Scrubber // nil when there is nothing to replace
}

// newScrubber scrubs the given values (empty ones are ignored).
func newScrubber(values []string) *scrubber {
	var vs []secrets.Secret
	for _, v := range values {
		if v != "" {
			vs = append(vs, secrets.New(v))
		}
	}
	if len(vs) == 0 {
		return &scrubber{}
	}
	sc := secrets.NewScrubber()
	sc.Add(vs...)
	return &scrubber{sc: sc}
}

// scrub returns s without the connection's secret values.
func (s *scrubber) scrub(text string) string {
	if s == nil || s.sc == nil {
		return text
	}
	return s.sc.Scrub(text)
}

// scrubbers is the set of scrubbers of the connections that are open or
// being opened, plus the configured scrubber: text is scrubbed of every
// secret any of them holds.
type scrubbers struct {
	extra func(string) string

	mu  sync.Mutex
	set map[*scrubber]bool
}

func (ss *scrubbers) add(s *scrubber) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.set == nil {
		ss.set = map[*scrubber]bool{}
	}
	ss.set[s] = true
}

func (ss *scrubbers) remove(s *scrubber) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.set, s)
}

// text makes upstream text safe to return, store or log: valid UTF-8
// without NUL, without secret values, at most limit bytes. It scrubs before
// it cuts, so that a cut can never leave the start of a secret behind.
func (ss *scrubbers) text(s string, limit int) string {
	return safetext.Bound(ss.scrub(safetext.Clean(s)), limit)
}

// scrub removes secret values from s.
func (ss *scrubbers) scrub(s string) string {
	ss.mu.Lock()
	for sc := range ss.set {
		s = sc.scrub(s)
	}
	ss.mu.Unlock()
	if ss.extra != nil {
		s = ss.extra(s)
	}
	return s
}

// value returns v (decoded JSON) with every string, keys included, made
// valid UTF-8 without NUL and scrubbed. Strings are not bounded: result size
// is the executor's to cap.
func (ss *scrubbers) value(v any) any {
	switch v := v.(type) {
	case string:
		return ss.scrub(safetext.Clean(v))
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = ss.value(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[ss.scrub(safetext.Clean(k))] = ss.value(e)
		}
		return out
	default:
		return v
	}
}

// logHandler scrubs and bounds every string of a record: the SDK logs
// upstream text (tool names, error bodies) that toolsvc does not control.
type logHandler struct {
	next slog.Handler
	ss   *scrubbers
}

func (h *logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.ss.text(r.Message, maxLogText), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = h.attr(a)
	}
	return &logHandler{next: h.next.WithAttrs(clean), ss: h.ss}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	return &logHandler{next: h.next.WithGroup(name), ss: h.ss}
}

// attr rewrites one attribute: strings, errors and anything else printed
// as text are scrubbed and bounded; groups are walked.
func (h *logHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, ga := range g {
			out[i] = h.attr(ga)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	case slog.KindString, slog.KindAny:
		return slog.String(a.Key, h.ss.text(v.String(), maxLogText))
	default:
		return slog.Attr{Key: a.Key, Value: v}
	}
}
