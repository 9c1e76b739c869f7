package secrets

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// MinScrubLength is the shortest value a Scrubber looks for: a shorter one
// would blank out ordinary words. Secrets are far longer.
const MinScrubLength = 3

// keepPerLabel is how many values of one label (a connector's key) a
// Scrubber remembers: the current one and the one it replaced, which a
// connection opened before a rotation may still echo.
const keepPerLabel = 2

// Scrubber removes secret values from text that came from upstream (error
// bodies, messages, url.Error text that quotes a URL holding a token) before
// it reaches a message, a stored outcome, a log line or the audit trail. It
// finds each value it was given in the forms it travels in:
//
//   - as it is, in any letter case of its ASCII letters (an upstream that
//     upper-cases what it echoes);
//   - behind escapes, decoded up to maxDecodes levels deep, mixed freely:
//     percent-encoding (%2F, %2f), backslash escapes (\u002b, \x2b, \/, \",
//     octal \053), HTML character references (&#43;, &#x2b;, &amp;) — so a
//     text/plain body that JSON-, URL- or HTML-escapes a secret hides
//     nothing;
//   - URL query encoding (space as "+"), and hex in either case;
//   - base64 (standard and URL alphabets, padded or not, and inside longer
//     base64 text at any alignment, as in an HTTP Basic credential),
//     matched exactly: base64 is case-sensitive.
//
// Every occurrence becomes Redacted. What it does not find is listed in
// docs/connectors.md (a secret cut in pieces, transformed otherwise, or
// shorter than MinScrubLength).
//
// Every connector uses one, fed by Recording: whatever the connector fetches
// from the secrets store is scrubbed from whatever it returns. A Scrubber is
// safe for concurrent use; the zero value is not (use NewScrubber).
type Scrubber struct {
	mu     sync.RWMutex
	labels map[string][]string // label -> its values, most recent last
	extra  []string            // values added without a label
	// exact are the forms matched as they are (base64); folded the forms
	// matched in any ASCII letter case, lower-cased; decoded the folded
	// forms looked for in text whose escapes were decoded (the values, and
	// their query encoding, whose "+" is not decoded). Longest first.
	exact, folded, decoded []string
}

// maxDecodes is how many levels of escaping a Scrubber sees through (a
// JSON string inside a URL-encoded parameter is two).
const maxDecodes = 3

// NewScrubber returns an empty Scrubber.
func NewScrubber() *Scrubber { return &Scrubber{labels: map[string][]string{}} }

// Add adds values to look for.
func (s *Scrubber) Add(values ...Secret) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range values {
		if v.value != "" {
			s.extra = append(s.extra, v.value)
		}
	}
	s.rebuild()
}

// Set adds the value of label (such as "connector/key"), forgetting all
// but the last value the label had before: a long-lived Scrubber holds a
// bounded number of values however often a secret is fetched or rotated.
func (s *Scrubber) Set(label string, v Secret) {
	if v.value == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	vals := s.labels[label]
	if n := len(vals); n > 0 && vals[n-1] == v.value {
		return
	}
	vals = append(vals, v.value)
	if len(vals) > keepPerLabel {
		vals = vals[len(vals)-keepPerLabel:]
	}
	s.labels[label] = vals
	s.rebuild()
}

// rebuild recomputes the needles. Called with mu held.
func (s *Scrubber) rebuild() {
	exact, folded, decoded := map[string]bool{}, map[string]bool{}, map[string]bool{}
	add := func(v string) {
		if len(v) < MinScrubLength {
			return
		}
		for _, n := range foldedForms(v) {
			if len(n) >= MinScrubLength {
				folded[asciiLower(n)] = true
			}
		}
		decoded[asciiLower(v)] = true
		decoded[asciiLower(url.QueryEscape(v))] = true
		for _, n := range base64Forms(v) {
			if len(n) >= MinScrubLength {
				exact[n] = true
			}
		}
	}
	for _, vals := range s.labels {
		for _, v := range vals {
			add(v)
		}
	}
	for _, v := range s.extra {
		add(v)
	}
	s.exact, s.folded, s.decoded = longestFirst(exact), longestFirst(folded), longestFirst(decoded)
}

// longestFirst returns the set's members, longest first, ties by value
// (a deterministic order).
func longestFirst(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		if len(out[i]) != len(out[j]) {
			return len(out[i]) > len(out[j])
		}
		return out[i] < out[j]
	})
	return out
}

// foldedForms returns the forms of v matched without regard to letter
// case. Escaped forms are also found by decoding the text; they are listed
// too because some escapes (a "+" for a space) are not decoded.
func foldedForms(v string) []string {
	out := []string{v, url.QueryEscape(v), url.PathEscape(v), hex.EncodeToString([]byte(v))}
	q := strconv.Quote(v)
	out = append(out, q[1:len(q)-1])
	if j, err := json.Marshal(v); err == nil {
		out = append(out, string(j[1:len(j)-1]))
	}
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) == nil {
		j := strings.TrimSuffix(sb.String(), "\n")
		out = append(out, j[1:len(j)-1])
	}
	return out
}

// base64Forms returns the base64 encodings of v that text may carry.
func base64Forms(v string) []string {
	var out []string
	for _, e := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		out = append(out, e.EncodeToString([]byte(v)), e.WithPadding(base64.NoPadding).EncodeToString([]byte(v)))
		out = append(out, base64Cores(e, v)...)
	}
	return out
}

// base64Cores returns, for each of the three alignments v can have inside
// a longer base64 text, the characters that encode v alone: the encoding of
// v after k filler bytes, without the characters the filler or what follows
// v can change.
func base64Cores(e *base64.Encoding, v string) []string {
	var out []string
	raw := e.WithPadding(base64.NoPadding)
	for k := 0; k < 3; k++ {
		b := make([]byte, k+len(v))
		copy(b[k:], v)
		enc := raw.EncodeToString(b)
		// Characters wholly inside v: from ceil(8k/6) to floor(8(k+len)/6).
		start := (8*k + 5) / 6
		end := 8 * (k + len(v)) / 6
		if end-start >= 4 {
			out = append(out, enc[start:end])
		}
	}
	return out
}

// Scrub returns text with every form of every value replaced by Redacted.
func (s *Scrubber) Scrub(text string) string {
	if s == nil || text == "" {
		return text
	}
	s.mu.RLock()
	exact, folded, decoded := s.exact, s.folded, s.decoded
	s.mu.RUnlock()
	if len(exact) == 0 && len(folded) == 0 {
		return text
	}
	v := identityView(text)
	found := v.find(nil, exact, folded)
	for level := 0; level < maxDecodes; level++ {
		next, ok := v.decode()
		if !ok {
			break
		}
		v = next
		found = v.find(found, exact, decoded)
	}
	return redact(text, found)
}

// ScrubValue returns a JSON-like value (what encoding/json decodes into:
// maps, slices, strings, numbers, booleans, nil) with every string and map
// key scrubbed. The value is decoded first so that JSON escapes cannot hide
// a secret; what it does not know it returns unchanged.
func (s *Scrubber) ScrubValue(v any) any {
	switch x := v.(type) {
	case string:
		return s.Scrub(x)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			out[s.Scrub(k)] = s.ScrubValue(val)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, val := range x {
			out[i] = s.ScrubValue(val)
		}
		return out
	}
	return v
}

// Error returns an error whose text is err's, scrubbed. It does not wrap
// err, so that nothing can reach the unscrubbed text through errors.As or
// Unwrap; errors.Is still matches what err matched (context.Canceled,
// context.DeadlineExceeded, ErrNotFound, ...). nil stays nil.
func (s *Scrubber) Error(err error) error {
	if err == nil {
		return nil
	}
	return &scrubbedError{msg: s.Scrub(err.Error()), is: err}
}

type scrubbedError struct {
	msg string
	is  error
}

func (e *scrubbedError) Error() string { return e.msg }

// Is reports whether the original error matched target. Only sentinel
// comparisons pass through; the original is never handed out.
func (e *scrubbedError) Is(target error) bool { return errors.Is(e.is, target) }

// Recording returns a Store that gets secrets from st and sets each value it
// returns in sc (labelled by connector and key), so that whatever the
// caller fetched, sc scrubs.
func Recording(st Store, sc *Scrubber) Store { return &recording{st: st, sc: sc} }

type recording struct {
	st Store
	sc *Scrubber
}

func (r *recording) Get(ctx context.Context, connectorID, key string) (Secret, error) {
	if r.st == nil {
		return Secret{}, Missing(connectorID, key)
	}
	s, err := r.st.Get(ctx, connectorID, key)
	if err != nil {
		return Secret{}, err
	}
	r.sc.Set(connectorID+"/"+key, s)
	return s, nil
}
