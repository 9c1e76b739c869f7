package audit

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// wantObject fails unless b is a JSON object in valid UTF-8 of at most max
// bytes nested at most MaxDetailDepth deep, and returns it decoded.
func wantObject(t *testing.T, b []byte, maxLen int) map[string]any {
	t.Helper()
	if len(b) > maxLen {
		t.Fatalf("detail of %d bytes, limit %d: %.200s", len(b), maxLen, b)
	}
	if !utf8.Valid(b) {
		t.Fatalf("detail is not valid UTF-8: %q", b)
	}
	if d := depth(b); d > MaxDetailDepth {
		t.Fatalf("detail nests %d deep, limit %d", d, MaxDetailDepth)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		t.Fatalf("detail is not a JSON object (%v): %.200s", err, b)
	}
	return m
}

func TestEncodeDetailKeepsWhatFits(t *testing.T) {
	got := EncodeDetail(map[string]any{
		"message":   "a\x00b <tag> & é 😀",
		"arguments": json.RawMessage(`{"x":"\u0000","n":12345678901234567890}`),
		"count":     3,
	}, DefaultDetailMaxBytes)
	want := `{"arguments":{"x":"\u0000","n":12345678901234567890},"count":3,"message":"a\u0000b \u003ctag\u003e \u0026 é 😀"}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if EncodeDetail(nil, 100) != nil || EncodeDetail(map[string]any{}, 100) != nil {
		t.Fatal("an empty detail must encode as nothing")
	}
}

func TestEncodeDetailCleansRawJSON(t *testing.T) {
	// A json.RawMessage carries invalid UTF-8 through Go's encoder; the
	// stores (and protobuf) would refuse it.
	got := EncodeDetail(map[string]any{"value": json.RawMessage("{\"s\":\"a\xffb\"}")}, DefaultDetailMaxBytes)
	m := wantObject(t, got, DefaultDetailMaxBytes)
	if v := m["value"].(map[string]any)["s"]; v != "a\uFFFDb" {
		t.Fatalf("value.s = %q", v)
	}
}

func TestEncodeDetailTruncates(t *testing.T) {
	big := strings.Repeat("日本語", 20000) // 180 KB of 3-byte characters
	detail := map[string]any{
		"arguments": map[string]any{"blob": big},
		"attempt":   1,
		"message":   "failed: " + big,
		"reason":    "ARGUMENTS_INVALID",
	}
	full, _ := json.Marshal(detail)
	for _, limit := range []int{MinDetailMaxBytes, 4000, DefaultDetailMaxBytes} {
		got := EncodeDetail(detail, limit)
		m := wantObject(t, got, limit)
		if m["truncated"] != true || m["bytes"] != float64(len(full)) {
			t.Fatalf("limit %d: marker missing or wrong: %.200s", limit, got)
		}
		if m["attempt"] != float64(1) || m["reason"] != "ARGUMENTS_INVALID" {
			t.Fatalf("limit %d: small fields lost: %.300s", limit, got)
		}
		if om, _ := m["omitted"].([]any); len(om) != 1 || om[0] != "arguments" {
			t.Fatalf("limit %d: omitted = %v", limit, m["omitted"])
		}
		msg, _ := m["message"].(string)
		if !strings.HasPrefix(msg, "failed: 日本語") || !strings.HasSuffix(msg, safetext.Marker) {
			t.Fatalf("limit %d: message not cut on a character with the marker: %.80q", limit, msg)
		}
	}
	// A limit below the minimum is raised to it.
	wantObject(t, EncodeDetail(detail, 10), MinDetailMaxBytes)
}

func TestEncodeDetailEscapesCount(t *testing.T) {
	// NUL takes 6 bytes escaped: the cut string must still fit.
	detail := map[string]any{"message": strings.Repeat("\x00", 10000), "value": strings.Repeat("\"\\", 5000)}
	m := wantObject(t, EncodeDetail(detail, MinDetailMaxBytes), MinDetailMaxBytes)
	if s, _ := m["message"].(string); !strings.HasPrefix(s, "\x00\x00") {
		t.Fatalf("message lost: %q", s)
	}
}

func TestEncodeDetailBoundsDepth(t *testing.T) {
	var deep any = "bottom"
	for range 200 {
		deep = []any{deep}
	}
	got := EncodeDetail(map[string]any{"arguments": map[string]any{"x": deep}, "message": "m"}, DefaultDetailMaxBytes)
	m := wantObject(t, got, DefaultDetailMaxBytes)
	if m["truncated"] != true || m["message"] != "m" || m["arguments"] != nil {
		t.Fatalf("deep detail: %.300s", got)
	}
	// Just within the limit is kept whole.
	var ok any = "bottom"
	for range MaxDetailDepth - 2 {
		ok = []any{ok}
	}
	got = EncodeDetail(map[string]any{"arguments": map[string]any{"x": ok}}, DefaultDetailMaxBytes)
	if m := wantObject(t, got, DefaultDetailMaxBytes); m["truncated"] != nil {
		t.Fatalf("a detail within the depth limit was cut: %.200s", got)
	}
}

func TestEncodeDetailMarkerKeysCollide(t *testing.T) {
	detail := map[string]any{"truncated": "mine", "bytes": "mine", "message": strings.Repeat("x", 5000)}
	m := wantObject(t, EncodeDetail(detail, MinDetailMaxBytes), MinDetailMaxBytes)
	if m["truncated"] != true {
		t.Fatalf("marker lost to a field of the same name: %v", m)
	}
}

func TestEncodeDetailError(t *testing.T) {
	got := EncodeDetail(map[string]any{"x": math.NaN()}, DefaultDetailMaxBytes)
	m := wantObject(t, got, DefaultDetailMaxBytes)
	if _, ok := m["detail_error"].(string); !ok {
		t.Fatalf("unencodable detail: %s", got)
	}
}

func TestNewMakesTextSafe(t *testing.T) {
	ev := New(ToolCallRejected, store.AuditEvent{
		Tool:      "bad\x00tool",
		Action:    strings.Repeat("é", 200), // 400 bytes
		TraceID:   "a\xffb",
		TaskID:    "日本語"[:4], // a split character
		Principal: "agent-1",
	})
	for name, f := range map[string]string{"tool": ev.Tool, "action": ev.Action, "trace": ev.TraceID, "task": ev.TaskID} {
		if !safetext.Valid(f) || len(f) > MaxField {
			t.Errorf("%s = %q: not safe text within %d bytes", name, f, MaxField)
		}
	}
	if ev.Principal != "agent-1" || ev.ID == "" || ev.Type != ToolCallRejected || ev.Detail != nil {
		t.Fatalf("event: %+v", ev)
	}
	kept := NewDetail(HealthChanged, store.AuditEvent{Tool: "t"}, map[string]any{"k": "v"})
	if again := New(HealthChanged, kept); !bytes.Equal(again.Detail, kept.Detail) || again.ID != kept.ID {
		t.Fatalf("New changed an encoded event: %+v", again)
	}
}

// FuzzEncodeDetail: whatever a detail holds and whatever the limit, the
// result is a JSON object in valid UTF-8 within the limit and the depth
// bound, and a detail that fits is kept as Go's encoder would write it.
func FuzzEncodeDetail(f *testing.F) {
	f.Add("message", "plain", 3, 0, 2000)
	f.Add("message", strings.Repeat("日本\x00", 3000), 2, 1, 1024)
	f.Add("a\xff", "\xe6\x97", 0, 150, 1500)
	f.Add("truncated", strings.Repeat("\"", 4000), 5, 70, 1024)
	f.Fuzz(func(t *testing.T, key, text string, copies, nest, limit int) {
		copies = min(max(copies, 0), 20)
		nest = min(max(nest, 0), 300)
		var v any = text
		for range nest {
			v = map[string]any{key: v}
		}
		detail := map[string]any{key: v, "raw": json.RawMessage(`{"k":"` + strings.ReplaceAll(text, `"`, ``) + `"}`)}
		for i := range copies {
			detail[key+strings.Repeat("+", i+1)] = text
		}
		if !json.Valid(detail["raw"].(json.RawMessage)) {
			delete(detail, "raw")
		}
		got := EncodeDetail(detail, limit)
		wantObject(t, got, max(limit, MinDetailMaxBytes))
	})
}

// DetailParts opens an encoded detail at keys it does not hold; the parts
// joined with the keys' values are the detail EncodeDetail writes with them.
func TestDetailPartsCompleteLikeEncodeDetail(t *testing.T) {
	details := []map[string]any{
		nil,
		{"parent_call_id": "p-1"},
		{"a": 1, "b<&>": "x\u0000\"y\"", "s": []any{"é", 2.5}, "zz": map[string]any{"attempt": 9}},
		{"stat": true, "statf": nil, "attemp": "", "attempts": "ü"},
	}
	for _, d := range details {
		for _, attempt := range []int{0, 1, 12345} {
			for _, state := range []string{"SUCCEEDED", "UNKNOWN"} {
				parts, err := DetailParts(EncodeDetail(d, 0), "attempt", "state")
				if err != nil {
					t.Fatalf("DetailParts(%v): %v", d, err)
				}
				if len(parts) != 3 {
					t.Fatalf("DetailParts(%v) = %d parts, want 3", d, len(parts))
				}
				got := parts[0] + strconv.Itoa(attempt) + parts[1] + strconv.Quote(state) + parts[2]
				whole := map[string]any{"attempt": attempt, "state": state}
				for k, v := range d {
					whole[k] = v
				}
				if want := string(EncodeDetail(whole, 0)); got != want {
					t.Fatalf("completed detail\n got %s\nwant %s", got, want)
				}
			}
		}
	}
	if _, err := DetailParts(EncodeDetail(map[string]any{"state": "x"}, 0), "attempt", "state"); err == nil {
		t.Fatal("DetailParts opened a key the detail holds")
	}
	if _, err := DetailParts(nil, "state", "attempt"); err == nil {
		t.Fatal("DetailParts took unsorted keys")
	}
}
