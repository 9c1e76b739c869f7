package secrets

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// canary has characters that every encoding changes.
const canary = "c4n4ry/s3cr+t?&=x y<z>"

// Encodings returns the forms a leak test looks for (the same list the
// tests of the connectors use).
func encodings(v string) []string {
	return []string{
		v,
		base64.StdEncoding.EncodeToString([]byte(v)),
		base64.RawStdEncoding.EncodeToString([]byte(v)),
		base64.URLEncoding.EncodeToString([]byte(v)),
		base64.RawURLEncoding.EncodeToString([]byte(v)),
		url.QueryEscape(v),
		url.PathEscape(v),
	}
}

func TestScrubberForms(t *testing.T) {
	sc := NewScrubber()
	sc.Add(New(canary))
	basic := base64.StdEncoding.EncodeToString([]byte("user:" + canary))
	q := strconv.Quote(canary)
	j, _ := json.Marshal(canary)
	texts := []string{
		"plain " + canary + " end",
		"query ?token=" + url.QueryEscape(canary) + "&x=1",
		"path /a/" + url.PathEscape(canary) + "/b",
		"lower " + strings.ToLower(url.QueryEscape(canary)),
		"go " + q,
		"json " + string(j),
		"hex " + hex.EncodeToString([]byte(canary)),
		"b64 " + base64.StdEncoding.EncodeToString([]byte(canary)),
		"b64url " + base64.RawURLEncoding.EncodeToString([]byte(canary)),
		"basic Authorization: Basic " + basic,
		"shifted " + base64.StdEncoding.EncodeToString([]byte("xx"+canary+"yy")),
	}
	for _, text := range texts {
		got := sc.Scrub(text)
		if !strings.Contains(got, Redacted) {
			t.Errorf("nothing redacted in %q", text)
		}
		for _, enc := range append(encodings(canary), hex.EncodeToString([]byte(canary)), q, string(j)) {
			if strings.Contains(got, enc) {
				t.Errorf("Scrub(%q) = %q still holds %q", text, got, enc)
			}
		}
		if strings.Contains(text, "basic") && strings.Contains(got, basic) {
			t.Errorf("the Basic credential survives: %q", got)
		}
	}
	if got := sc.Scrub("nothing to see"); got != "nothing to see" {
		t.Fatalf("clean text changed: %q", got)
	}
}

// TestScrubURLError: the text of a failed request quotes the URL, token and
// all.
func TestScrubURLError(t *testing.T) {
	sc := NewScrubber()
	sc.Add(New(canary))
	u := "http://127.0.0.1:1/v1?api_key=" + url.QueryEscape(canary)
	resp, err := http.Get(u)
	if err == nil {
		resp.Body.Close()
		t.Fatal("expected a connection error")
	}
	if !strings.Contains(err.Error(), url.QueryEscape(canary)) {
		t.Fatalf("the test's premise: %v", err)
	}
	scrubbed := sc.Error(err)
	for _, enc := range encodings(canary) {
		if strings.Contains(scrubbed.Error(), enc) {
			t.Fatalf("scrubbed error %q holds %q", scrubbed, enc)
		}
	}
	var ue *url.Error
	if errors.As(scrubbed, &ue) {
		t.Fatal("the original error is reachable")
	}
}

func TestScrubErrorKeepsSentinels(t *testing.T) {
	sc := NewScrubber()
	sc.Add(New(canary))
	err := sc.Error(fmt.Errorf("calling with %s: %w", canary, context.DeadlineExceeded))
	if !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), canary) {
		t.Fatalf("scrubbed: %v", err)
	}
	if sc.Error(nil) != nil {
		t.Fatal("nil is not nil")
	}
}

func TestScrubValue(t *testing.T) {
	sc := NewScrubber()
	sc.Add(New(canary))
	in := map[string]any{"echo": "Bearer " + canary, canary: 1.0, "list": []any{canary, true, nil}}
	out := sc.ScrubValue(in)
	b, _ := json.Marshal(out)
	if strings.Contains(string(b), "c4n4ry") || !strings.Contains(string(b), Redacted) {
		t.Fatalf("ScrubValue = %s", b)
	}
}

func TestScrubberSetKeepsTwo(t *testing.T) {
	sc := NewScrubber()
	for i := range 5 {
		sc.Set("c/k", New(fmt.Sprintf("value-%d-xyz", i)))
	}
	got := sc.Scrub("value-0-xyz value-3-xyz value-4-xyz")
	if got != "value-0-xyz "+Redacted+" "+Redacted {
		t.Fatalf("Scrub = %q", got)
	}
	sc.Set("c/k", New("ab")) // too short to look for, but remembered
	if sc.Scrub("ab") != "ab" {
		t.Fatal("a two-character value is scrubbed")
	}
}

func TestRecording(t *testing.T) {
	sc := NewScrubber()
	st := Recording(NewEnv(func(k string) (string, bool) { return canary, true }), sc)
	if _, err := st.Get(context.Background(), "c", "k"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sc.Scrub("x "+canary), canary) {
		t.Fatal("a fetched value is not scrubbed")
	}
}

func FuzzScrub(f *testing.F) {
	f.Add("s3cr3t-value", "prefix ", " suffix")
	f.Add("a+b/c=d", "Basic ", "")
	f.Fuzz(func(t *testing.T, secret, before, after string) {
		if len(secret) < 8 {
			return
		}
		sc := NewScrubber()
		sc.Add(New(secret))
		for _, enc := range encodings(secret) {
			got := sc.Scrub(before + enc + after)
			if strings.Contains(got, secret) && !strings.Contains(before+after, secret) {
				t.Fatalf("Scrub(%q) = %q holds the secret", before+enc+after, got)
			}
		}
	})
}

// TestScrubberCaseAndEscapes: an upstream that upper-cases the secret, or
// escapes it (JSON, Go, C, URL, HTML, and those nested) in a text body,
// gets nothing past the scrubber; the text around it is kept.
func TestScrubberCaseAndEscapes(t *testing.T) {
	sc := NewScrubber()
	sc.Add(New(canary))
	jsonEsc := func(s string) string {
		var b strings.Builder
		for _, r := range s {
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		return b.String()
	}
	hexEsc := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, `\x%02X`, s[i])
		}
		return b.String()
	}
	octEsc := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, `\%03o`, s[i])
		}
		return b.String()
	}
	htmlEsc := func(s string) string {
		var b strings.Builder
		for i, r := range s {
			if i%2 == 0 {
				fmt.Fprintf(&b, "&#%d;", r)
			} else {
				fmt.Fprintf(&b, "&#X%x;", r)
			}
		}
		return b.String()
	}
	pctAll := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, "%%%02x", s[i])
		}
		return b.String()
	}
	texts := map[string]string{
		"upper":              strings.ToUpper(canary),
		"lower":              strings.ToLower(canary),
		"mixed case":         "C4N4ry/S3cR+T?&=X y<Z>",
		"json unicode":       jsonEsc(canary),
		"json upper hex":     strings.ToUpper(jsonEsc(canary)),
		"json solidus":       strings.ReplaceAll(canary, "/", `\/`),
		"c hex":              hexEsc(canary),
		"octal":              octEsc(canary),
		"html":               htmlEsc(canary),
		"html named":         strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(canary),
		"percent everything": pctAll(canary),
		"percent upper text": strings.ToUpper(url.PathEscape(canary)),
		"json of percent":    jsonEsc(url.PathEscape(canary)),
		"percent of json":    pctAll(jsonEsc(canary)),
		"escaped and upper":  jsonEsc(strings.ToUpper(canary)),
		"half escaped":       canary[:5] + jsonEsc(canary[5:12]) + canary[12:],
		"hex upper":          strings.ToUpper(hex.EncodeToString([]byte(canary))),
	}
	for name, echo := range texts {
		text := "before «" + echo + "» after"
		got := sc.Scrub(text)
		if got != "before «"+Redacted+"» after" {
			t.Errorf("%s: Scrub(%q) = %q", name, text, got)
		}
	}
	// Twice in one text, one escaped and one not, and a lookalike left alone.
	text := canary + " and " + jsonEsc(canary) + " but not c4n4ry/s3cr"
	if got := sc.Scrub(text); got != Redacted+" and "+Redacted+" but not c4n4ry/s3cr" {
		t.Errorf("Scrub(%q) = %q", text, got)
	}
	// Escapes that are not escapes, and a broken one, leave text as it was.
	for _, clean := range []string{`100% sure \q &nbsp; &#xZZ; \u12 %G0 \`, "plain text", `C:\path\to\file`} {
		if got := sc.Scrub(clean); got != clean {
			t.Errorf("clean text %q changed: %q", clean, got)
		}
	}
}

// TestScrubberBase64IsExact: base64 is case-sensitive; its forms are
// matched exactly, and a text that merely resembles one in another case
// is not taken for it.
func TestScrubberBase64IsExact(t *testing.T) {
	sc := NewScrubber()
	sc.Add(New(canary))
	b64 := base64.StdEncoding.EncodeToString([]byte(canary))
	if got := sc.Scrub("x " + b64 + " y"); got != "x "+Redacted+" y" {
		t.Fatalf("base64: %q", got)
	}
}

func FuzzScrubCase(f *testing.F) {
	f.Add("s3cr3t-Value/+=", "a ", " b", uint8(1))
	f.Fuzz(func(t *testing.T, secret, before, after string, mode uint8) {
		if len(secret) < 8 || !utf8.ValidString(secret) {
			return
		}
		sc := NewScrubber()
		sc.Add(New(secret))
		var echo string
		switch mode % 4 {
		case 0:
			echo = strings.ToUpper(secret)
		case 1:
			echo = strings.ToLower(secret)
		case 2:
			b, _ := json.Marshal(secret)
			echo = string(b)
		default:
			echo = url.PathEscape(secret)
		}
		got := sc.Scrub(before + echo + after)
		if strings.Contains(asciiLower(got), asciiLower(secret)) && !strings.Contains(asciiLower(before+after), asciiLower(secret)) {
			t.Fatalf("Scrub(%q) = %q holds the secret", before+echo+after, got)
		}
	})
}

func BenchmarkScrub(b *testing.B) {
	sc := NewScrubber()
	sc.Set("c/token", New(canary))
	sc.Set("c/other", New("another-secret-value-123"))
	plain := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40)
	escaped := strings.Repeat(`{"msg":"a \u0041 b \/ c%20d"} `, 60)
	for _, bc := range []struct{ name, text string }{{"plain", plain}, {"escaped", escaped}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.text)))
			for b.Loop() {
				_ = sc.Scrub(bc.text)
			}
		})
	}
}
