package export

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// benchSnapshot is the demo tools and n tools of three actions each, with
// guidance and schemas of the demo tools' size.
func benchSnapshot(n int) Snapshot {
	s := demoSnapshot()
	for i := range n {
		t := &store.Tool{Name: fmt.Sprintf("tool-%03d", i), Description: "A tool.", DefaultRisk: toolkit.RiskMedium,
			Incarnation: fmt.Sprint("inc-", i), Version: 1,
			Guidance: "Use it when the user asks; never twice in a row."}
		for _, a := range []string{"get", "put", "find"} {
			t.Actions = append(t.Actions, store.Action{Name: a, Description: "Do " + a + ".",
				InputSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string","minLength":1,"description":"The id."},"limit":{"type":"integer","minimum":1,"maximum":100},"tags":{"type":"array","items":{"type":"string"},"maxItems":5}},"required":["id"]}`),
				Examples:    []store.Example{{Description: "One", Input: json.RawMessage(`{"id":"a1"}`)}}})
		}
		s.Tools = append(s.Tools, t)
	}
	return s
}

// BenchmarkBuild measures an export of 310 actions per request, as the
// MCP front door's tools/list makes one, against the baseline of encoding
// the same tools as JSON (what reading them costs at least).
func BenchmarkBuild(b *testing.B) {
	s := benchSnapshot(100)
	b.Run("baseline-json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(s.Tools); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, o := range []Options{{Format: FormatMCP}, {Format: FormatOpenAIChat}, {Format: FormatAnthropic, Strict: true}} {
		name := string(o.Format)
		if o.Strict {
			name += "-strict"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Build(s, everyone, o); err != nil {
					b.Fatal(err)
				}
			}
		})
		// The same, as ExportTools and the MCP front door make it: from an
		// Exporter that keeps definitions per tool version.
		x := NewExporter()
		b.Run(name+"-cached", func(b *testing.B) {
			for b.Loop() {
				if _, err := x.Build(s, everyone, o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
