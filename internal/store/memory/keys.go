package memory

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// SigningKey implements store.KeyStore.
func (s *Store) SigningKey(ctx context.Context, name string, key []byte) ([]byte, error) {
	if name == "" || len(key) < store.MinSigningKeyBytes {
		return nil, fmt.Errorf("%w: signing key %q: a name and at least %d bytes are required", store.ErrInvalid, name, store.MinSigningKeyBytes)
	}
	var out []byte
	err := s.write(ctx, func(t *tx) error {
		k, ok := t.st.signingKeys[name]
		if !ok {
			k = bytes.Clone(key)
			t.st.signingKeys[name] = k
		}
		out = bytes.Clone(k)
		return nil
	})
	return out, err
}

// UseToken implements store.KeyStore.
func (s *Store) UseToken(ctx context.Context, id string, expiresAt time.Time) (bool, error) {
	if id == "" {
		return false, fmt.Errorf("%w: use token: an id is required", store.ErrInvalid)
	}
	first := false
	err := s.write(ctx, func(t *tx) error {
		if _, used := t.st.usedTokens[id]; used {
			return nil
		}
		first = true
		at := micros(expiresAt)
		t.st.usedTokens[id] = at
		t.st.tokensDue.push(at, id)
		return nil
	})
	return first, err
}

// DeleteUsedTokens implements store.KeyStore.
func (s *Store) DeleteUsedTokens(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: delete used tokens: negative limit %d", store.ErrInvalid, limit)
	}
	n := 0
	err := s.write(ctx, func(t *tx) error {
		st := t.st
		due := st.tokensDue.due(micros(now), limit, func(e timed[string]) bool {
			at, ok := st.usedTokens[e.key]
			return ok && at == e.at
		})
		for _, e := range due {
			delete(st.usedTokens, e.key)
		}
		n = len(due)
		if len(st.usedTokens) == 0 {
			// Go maps keep their size when emptied.
			st.usedTokens = make(map[string]int64)
		}
		return nil
	})
	return n, err
}
