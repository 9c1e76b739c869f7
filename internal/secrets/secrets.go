// Package secrets is toolsvc's secrets boundary (docs/connectors.md#secrets): connectors get
// a Store at construction and fetch each credential right before use, and
// the value travels as a Secret, whose every printed, logged or marshalled
// form is redacted. Only references (a connector id and a key) live in
// tools, configuration and the database.
package secrets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// ErrNotFound: the store has no value for the connector and key.
var ErrNotFound = errors.New("secret not found")

// Redacted is what every printed form of a Secret shows.
const Redacted = "[REDACTED]"

// Store fetches secret values. Implementations must be safe for concurrent
// use and must not log values.
type Store interface {
	// Get returns the value of key for connector, or an error wrapping
	// ErrNotFound that names the connector and the key (never a value).
	Get(ctx context.Context, connectorID, key string) (Secret, error)
}

// Secret is a secret value. Its String, GoString, Format, JSON, text and
// slog forms are all Redacted; only Reveal gives the value, to be used at
// the moment it is needed and not kept longer than the call.
type Secret struct {
	value string
}

// New wraps a value.
func New(value string) Secret { return Secret{value: value} }

// Reveal returns the value.
func (s Secret) Reveal() string { return s.value }

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.value == "" }

// String implements fmt.Stringer.
func (Secret) String() string { return Redacted }

// GoString implements fmt.GoStringer (%#v).
func (Secret) GoString() string { return Redacted }

// Format implements fmt.Formatter: every verb and flag prints Redacted.
func (Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(Redacted)) }

// MarshalJSON implements json.Marshaler.
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + Redacted + `"`), nil }

// MarshalText implements encoding.TextMarshaler.
func (Secret) MarshalText() ([]byte, error) { return []byte(Redacted), nil }

// LogValue implements slog.LogValuer.
func (Secret) LogValue() slog.Value { return slog.StringValue(Redacted) }

// NotSetError is a missing secret: a clear failure naming the connector
// and the key, and where the stores looked (Looked: "environment variable
// TOOLSVC_SECRET_BILLING_API_KEY", "file /run/secrets/billing/api_key").
// It matches ErrNotFound.
type NotSetError struct {
	Connector string
	Key       string
	Looked    []string
}

func (e *NotSetError) Error() string {
	msg := fmt.Sprintf("connector %q: secret %q is not set", e.Connector, e.Key)
	if len(e.Looked) > 0 {
		msg += " (looked for " + strings.Join(e.Looked, " and ") + ")"
	}
	return msg
}

// Is makes a NotSetError match ErrNotFound.
func (e *NotSetError) Is(target error) bool { return target == ErrNotFound }

// Missing returns the failure for a secret that is not set; looked says
// where (it may be empty).
func Missing(connectorID, key string, looked ...string) error {
	return &NotSetError{Connector: connectorID, Key: key, Looked: looked}
}

// MissingError is Missing without saying where the stores looked.
func MissingError(connectorID, key string) error { return Missing(connectorID, key) }

// Ref points at a secret: the key in the connector's secrets, and an
// optional prefix put before the value when it is used ("Bearer ").
type Ref struct {
	Key    string `json:"secret" yaml:"secret"`
	Prefix string `json:"prefix,omitempty" yaml:"prefix,omitempty"`
}

// Value is a configuration value that is either a literal (not secret: a
// content type, a region) or a reference to a secret. Exactly one is set.
type Value struct {
	Literal string `json:"value,omitempty"`
	Secret  *Ref   `json:"secret_ref,omitempty"`
}

// Resolve returns the value to use now: the literal, or the prefix and the
// secret fetched from st for connectorID. Call it right before use and keep
// the result no longer than the call (or the connection it opens).
func (v Value) Resolve(ctx context.Context, st Store, connectorID string) (Secret, error) {
	if v.Secret == nil {
		return New(v.Literal), nil
	}
	if st == nil {
		return Secret{}, Missing(connectorID, v.Secret.Key)
	}
	s, err := st.Get(ctx, connectorID, v.Secret.Key)
	if err != nil {
		return Secret{}, err
	}
	return New(v.Secret.Prefix + s.Reveal()), nil
}

// Redacted returns the value as it may be shown (a preview, a log line): a
// literal as it is, a reference as its prefix followed by Redacted.
func (v Value) Redacted() string {
	if v.Secret == nil {
		return v.Literal
	}
	return v.Secret.Prefix + Redacted
}

// IsSecret reports whether the value is a reference to a secret.
func (v Value) IsSecret() bool { return v.Secret != nil }

// MaxKeyLength bounds a secret key.
const MaxKeyLength = 128

// CheckKey says why key cannot name a secret, or returns nil. A key is 1-128
// characters of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or a
// digit: it is a file name in a directory store (so never "..", a hidden
// file such as Kubernetes' "..data", or a path) and part of an environment
// variable name in the environment store.
func CheckKey(key string) error {
	if key == "" {
		return errors.New("a secret key is required")
	}
	if len(key) > MaxKeyLength {
		return fmt.Errorf("a secret key is at most %d characters", MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("secret key %q must start with a letter or a digit", key)
		}
		if !alnum && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("secret key %q may only hold letters, digits, '.', '_' and '-'", key)
		}
	}
	return nil
}
