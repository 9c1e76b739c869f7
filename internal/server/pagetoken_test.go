package server

import (
	"encoding/base64"
	"testing"

	"github.com/toolsvc/toolsvc/internal/fault"
)

type testFilters struct {
	State string `json:"state"`
	Tool  string `json:"tool"`
}

func assertPageTokenFault(t *testing.T, err error) {
	t.Helper()
	f, ok := fault.As(err)
	if !ok || f.Kind != fault.InvalidArgument || len(f.Violations) != 1 || f.Violations[0].Field != "page_token" {
		t.Fatalf("want INVALID_ARGUMENT naming page_token, got %#v", err)
	}
}

func TestPageTokenRoundTrip(t *testing.T) {
	for _, after := range []string{"echo", "0190a8f4-7c4e-7a1b-9f00-000000000001", "12345", "ünïcode/with=chars"} {
		f := testFilters{State: "PENDING", Tool: "notes"}
		tok := encodePageToken(after, f)
		got, err := decodePageToken(tok, f)
		if err != nil {
			t.Fatalf("%q: %v", after, err)
		}
		if got != after {
			t.Fatalf("round trip of %q gave %q", after, got)
		}
		if _, err := base64.RawURLEncoding.DecodeString(tok); err != nil {
			t.Fatalf("token is not base64url: %q", tok)
		}
	}
}

func TestPageTokenEmptyIsFirstPage(t *testing.T) {
	got, err := decodePageToken("", testFilters{})
	if err != nil || got != "" {
		t.Fatalf("got %q, %v", got, err)
	}
}

func TestPageTokenFilterMismatch(t *testing.T) {
	tok := encodePageToken("echo", testFilters{State: "PENDING"})
	_, err := decodePageToken(tok, testFilters{State: "APPROVED"})
	assertPageTokenFault(t, err)
	// Another list's token (other filter type) is refused too.
	_, err = decodePageToken(tok, toolListFilters{List: "tools"})
	assertPageTokenFault(t, err)
}

func TestPageTokenTampered(t *testing.T) {
	tok := encodePageToken("echo", testFilters{})
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	for name, bad := range map[string]string{
		"garbage":           "not-a-token!!",
		"not json":          base64.RawURLEncoding.EncodeToString([]byte("hello")),
		"empty cursor":      base64.RawURLEncoding.EncodeToString([]byte(`{}`)),
		"cursor without f":  base64.RawURLEncoding.EncodeToString([]byte(`{"a":"echo"}`)),
		"truncated":         tok[:len(tok)-3],
		"flipped filter":    base64.RawURLEncoding.EncodeToString(append(raw[:len(raw)-3:len(raw)-3], 'x', '"', '}')),
		"standard encoding": base64.StdEncoding.EncodeToString([]byte(`{"a":"x","f":"?"}`)),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := decodePageToken(bad, testFilters{})
			assertPageTokenFault(t, err)
		})
	}
}

func FuzzDecodePageToken(f *testing.F) {
	f.Add(encodePageToken("echo", testFilters{}))
	f.Add("")
	f.Add("%%%")
	f.Fuzz(func(t *testing.T, tok string) {
		after, err := decodePageToken(tok, testFilters{})
		if err != nil {
			assertPageTokenFault(t, err)
			return
		}
		if tok != "" && after == "" {
			t.Fatalf("token %q decoded to an empty position", tok)
		}
	})
}

func TestPageSize(t *testing.T) {
	for in, want := range map[int32]int{0: 50, 1: 1, 50: 50, 500: 500, 501: 500, 1 << 30: 500} {
		got, err := pageSize(in)
		if err != nil || got != want {
			t.Fatalf("pageSize(%d) = %d, %v; want %d", in, got, err, want)
		}
	}
	_, err := pageSize(-1)
	f, ok := fault.As(err)
	if !ok || f.Kind != fault.InvalidArgument || f.Violations[0].Field != "page_size" {
		t.Fatalf("negative size: %v", err)
	}
}
