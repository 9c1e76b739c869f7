package idempotency

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestValidateKey(t *testing.T) {
	cases := []struct {
		name string
		key  string
		ok   bool
	}{
		{"simple", "order-42", true},
		{"one char", "x", true},
		{"space and symbols", " !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", true},
		{"255 chars", strings.Repeat("k", 255), true},
		{"empty", "", false},
		{"256 chars", strings.Repeat("k", 256), false},
		{"tab", "a\tb", false},
		{"newline", "a\n", false},
		{"NUL", "a\x00", false},
		{"DEL", "a\x7f", false},
		{"non-ASCII", "clé", false},
		{"invalid UTF-8", "a\xff", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := ValidateKey(c.key)
			if c.ok && err != nil {
				t.Errorf("ValidateKey(%q) = %v, want nil", c.key, err)
			}
			if !c.ok && !errors.Is(err, ErrInvalidKey) {
				t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", c.key, err)
			}
		})
	}
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		if err := ValidateKey(k); err != nil {
			t.Fatalf("NewKey() = %q: %v", k, err)
		}
		rest, ok := strings.CutPrefix(k, AutoKeyPrefix)
		if !ok {
			t.Fatalf("NewKey() = %q lacks %q", k, AutoKeyPrefix)
		}
		id, err := uuid.Parse(rest)
		if err != nil || id.Version() != 7 {
			t.Fatalf("NewKey() = %q: not a UUIDv7 (%v)", k, err)
		}
		if seen[k] {
			t.Fatalf("NewKey() repeated %q", k)
		}
		seen[k] = true
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	d := DefaultConfig()
	if d.Lease != 30*time.Second || d.Retention != 24*time.Hour || d.ReaperInterval != 5*time.Second || d.ReaperBatch != 100 {
		t.Errorf("defaults %+v", d)
	}
	err := Config{Lease: 0, Retention: -time.Second, ReaperInterval: 0, ReaperBatch: -1}.Validate()
	for _, want := range []string{"idempotency.lease", "idempotency.retention", "idempotency.reaper_interval", "idempotency.reaper_batch"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	err = Config{Lease: time.Hour, Retention: time.Minute, ReaperInterval: time.Second, ReaperBatch: 1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "at least the lease") {
		t.Errorf("retention below lease: %v", err)
	}
}
