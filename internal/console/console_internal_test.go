package console

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                         landing,
		"/approvals/x?y=1":         "/approvals/x?y=1",
		"//evil.example/x":         landing,
		"/\\evil.example":          landing,
		"https://evil.example/":    landing,
		"approvals":                landing,
		"/signin?next=/x":          landing,
		"/approvals\r\nSet-Cookie": landing,
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLinks(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4zero, Port: 8080}
	for _, tc := range []struct {
		public string
		addr   net.Addr
		tls    bool
		want   string
	}{
		{"https://toolsvc.example.com/", addr, true, "https://toolsvc.example.com"},
		{"", addr, false, "http://localhost:8080"},
		{"", &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 9}, true, "https://127.0.0.1:9"},
		{"", &net.TCPAddr{IP: net.IPv6loopback, Port: 9}, false, "http://[::1]:9"},
		{"", nil, false, ""},
	} {
		if got := BaseURL(tc.public, tc.addr, tc.tls); got != tc.want {
			t.Errorf("BaseURL(%q, %v, %v) = %q, want %q", tc.public, tc.addr, tc.tls, got, tc.want)
		}
	}
	if got := ApprovalURL("https://t.example/base/", "a b/c"); got != "https://t.example/base/approvals/a%20b%2Fc" {
		t.Errorf("ApprovalURL = %q", got)
	}
}

// idBefore bounds UUIDv7 ids by their creation time.
func TestIDBefore(t *testing.T) {
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	cut := idBefore(at)
	for _, tc := range []struct {
		made   time.Time
		before bool
	}{{at.Add(-time.Millisecond), true}, {at.Add(-time.Hour), true}, {at, false}, {at.Add(time.Second), false}} {
		id := v7At(t, tc.made)
		if got := id < cut; got != tc.before {
			t.Errorf("id made at %s < idBefore(%s) = %v, want %v", tc.made, at, got, tc.before)
		}
	}
}

func v7At(t *testing.T, at time.Time) string {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	return id.String()
}

func TestShowJSON(t *testing.T) {
	big, _ := json.Marshal(map[string]string{"text": strings.Repeat("é", maxShownJSON)})
	s := showJSON(big)
	if !s.Truncated || len(s.Text) > maxShownJSON || !utf8.ValidString(s.Text) || s.Bytes != len(big) {
		t.Fatalf("cut: truncated %v, %d bytes, valid %v", s.Truncated, len(s.Text), utf8.ValidString(s.Text))
	}
	if s := showJSON(json.RawMessage(`{"a":[1,{"b":null}]}`)); s.Truncated || s.Text != "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ]\n}" {
		t.Fatalf("pretty: %q", s.Text)
	}
}

func TestUntil(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{
		59*time.Minute + 59*time.Second: "in 59m59s", 2*time.Hour + 5*time.Minute: "in 2h05m",
		-90 * time.Second: "1m30s ago", 5 * time.Second: "in 5s",
	} {
		if got := until(now, now.Add(d)); got != want {
			t.Errorf("until(%s) = %q, want %q", d, got, want)
		}
	}
}
