// Package idempotency owns the primitives behind "one key executes at most
// once" (docs/pipeline.md#idempotency): idempotency keys, canonical JSON and argument
// fingerprints, the lease an executing call keeps alive, and the reaper that
// turns abandoned leases into UNKNOWN outcomes, expires approvals and
// previews, and deletes records past retention.
//
// Claiming keys is the store's job (one atomic statement); this package
// supplies what goes into a claim and what keeps it honest afterwards.
package idempotency

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// MaxKeyLength is the longest idempotency key accepted.
const MaxKeyLength = 255

// ErrInvalidKey is returned by ValidateKey.
var ErrInvalidKey = errors.New("invalid idempotency key")

// ValidateKey checks a caller-supplied key: 1-255 printable ASCII characters
// (0x20-0x7E). Keys are compared byte for byte, so anything that could be
// normalised differently by two clients (Unicode, control characters) is
// refused.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLength:
		return fmt.Errorf("%w: %d characters, at most %d allowed", ErrInvalidKey, len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7E {
			return fmt.Errorf("%w: byte 0x%02X at position %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// AutoKeyPrefix starts every server-generated key.
const AutoKeyPrefix = "auto-"

// NewKey returns a server-generated key ("auto-" + UUIDv7) for a call that
// came without one: it can be looked up, but the caller cannot deduplicate
// with it because it learns the key only from the answer.
func NewKey() string {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 fails only when the random source does; a v4 key is as unique.
		return AutoKeyPrefix + uuid.NewString()
	}
	return AutoKeyPrefix + id.String()
}

// Config configures leases and the reaper.
type Config struct {
	// Lease is how long an IN_PROGRESS call stays claimed without renewal.
	// The executing replica renews it every Lease/3.
	Lease time.Duration `mapstructure:"lease"`
	// Retention is how long finished records (and their approvals and
	// previews) are kept for replay and lookup.
	Retention time.Duration `mapstructure:"retention"`
	// ReaperInterval is the pause between reaper rounds.
	ReaperInterval time.Duration `mapstructure:"reaper_interval"`
	// ReaperBatch bounds the records each reaper step handles per round.
	ReaperBatch int `mapstructure:"reaper_batch"`
}

// DefaultConfig returns the defaults: 30 s lease, 24 h retention, a reaper
// round every 5 s handling up to 100 records per step.
func DefaultConfig() Config {
	return Config{
		Lease:          30 * time.Second,
		Retention:      24 * time.Hour,
		ReaperInterval: 5 * time.Second,
		ReaperBatch:    100,
	}
}

// minLease keeps the renewal interval (Lease/3) a meaningful duration.
const minLease = 3 * time.Millisecond

// Validate reports every problem at once, each naming its setting.
func (c Config) Validate() error {
	var errs []error
	if c.Lease < minLease {
		errs = append(errs, fmt.Errorf("idempotency.lease: must be at least %s, got %s", minLease, c.Lease))
	}
	if c.Retention <= 0 {
		errs = append(errs, fmt.Errorf("idempotency.retention: must be positive, got %s", c.Retention))
	} else if c.Retention < c.Lease {
		// A record deleted while a slow replica may still finish it would
		// let the key run again.
		errs = append(errs, fmt.Errorf("idempotency.retention: must be at least the lease (%s), got %s", c.Lease, c.Retention))
	}
	if c.ReaperInterval <= 0 {
		errs = append(errs, fmt.Errorf("idempotency.reaper_interval: must be positive, got %s", c.ReaperInterval))
	}
	if c.ReaperBatch <= 0 {
		errs = append(errs, fmt.Errorf("idempotency.reaper_batch: must be positive, got %d", c.ReaperBatch))
	}
	return errors.Join(errs...)
}
