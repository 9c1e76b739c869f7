package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// signingKeySQL stores the key unless one is stored under the name, and
// returns the one stored: of concurrent callers, the first to commit
// decides (the others' inserts wait for it, then do nothing, and their
// second branch reads its row).
const signingKeySQL = `WITH ins AS (
		INSERT INTO signing_keys (name, key) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING key
	)
	SELECT key FROM ins UNION ALL SELECT key FROM signing_keys WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM ins)`

// SigningKey implements store.KeyStore.
func (s *Store) SigningKey(ctx context.Context, name string, key []byte) ([]byte, error) {
	if name == "" || len(key) < store.MinSigningKeyBytes {
		return nil, fmt.Errorf("%w: signing key %q: a name and at least %d bytes are required", store.ErrInvalid, name, store.MinSigningKeyBytes)
	}
	var out []byte
	// The statement's snapshot may predate a concurrent insert that then
	// wins the conflict: it sees neither row, and asks again.
	for range 3 {
		err := s.pool.QueryRow(ctx, signingKeySQL, name, key).Scan(&out)
		if err == nil {
			return out, nil
		}
		if err = interpretError(err); !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("signing key %q: %w", name, err)
		}
	}
	return nil, fmt.Errorf("signing key %q: %w: stored concurrently and not yet visible", name, store.ErrConflict)
}

// UseToken implements store.KeyStore.
func (s *Store) UseToken(ctx context.Context, id string, expiresAt time.Time) (bool, error) {
	if id == "" {
		return false, fmt.Errorf("%w: use token: an id is required", store.ErrInvalid)
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO used_tokens (id, expires_at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, id, expiresAt)
	if err != nil {
		return false, fmt.Errorf("use token: %w", interpretError(err))
	}
	return tag.RowsAffected() == 1, nil
}

// DeleteUsedTokens implements store.KeyStore.
func (s *Store) DeleteUsedTokens(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: delete used tokens: negative limit %d", store.ErrInvalid, limit)
	}
	var lim any
	if limit > 0 {
		lim = limit
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM used_tokens WHERE id IN (
		SELECT id FROM used_tokens WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)`, now, lim)
	if err != nil {
		return 0, fmt.Errorf("delete used tokens: %w", interpretError(err))
	}
	return int(tag.RowsAffected()), nil
}
