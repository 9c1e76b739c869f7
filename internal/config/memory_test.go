package config_test

import (
	"testing"

	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store/memory"
)

// TestMemoryBounds: the memory store's bounds default to the store's own,
// are set from the file and the environment, and may not be negative.
func TestMemoryBounds(t *testing.T) {
	d := config.Default()
	if d.Memory.MaxCalls != memory.DefaultMaxCalls || d.Memory.MaxAuditEvents != memory.DefaultMaxAuditEvents {
		t.Fatalf("default memory bounds %+v", d.Memory)
	}
	env := map[string]string{"TOOLSVC_MEMORY_MAX_CALLS": "500", "TOOLSVC_MEMORY_MAX_AUDIT_EVENTS": "0"}
	cfg, err := config.Load(config.Sources{Env: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Memory.MaxCalls != 500 || cfg.Memory.MaxAuditEvents != 0 {
		t.Fatalf("environment not applied: %+v", cfg.Memory)
	}

	file := writeFile(t, "c.yaml", `
memory:
  max_calls: -1
  max_audit_events: -2
`)
	_, err = config.Load(config.Sources{File: file})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "memory.max_calls", "negative")
	requireProblem(t, ps, "memory.max_audit_events", "negative")
}
