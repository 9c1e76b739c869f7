package auth

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
)

// TokenPrefix starts every token NewToken makes, so that secret scanners
// and people can tell a toolsvc token when they see one.
const TokenPrefix = "tsvc_"

// tokenBytes is a token's randomness: 256 bits.
const tokenBytes = 32

// TokenHash is the SHA-256 of a bearer token: what configuration holds
// instead of the token (principals[].token_sha256, in hex).
type TokenHash [sha256.Size]byte

// String returns the hash in lowercase hex.
func (h TokenHash) String() string { return hex.EncodeToString(h[:]) }

// HashToken returns the hash of token.
func HashToken(token string) TokenHash { return sha256.Sum256([]byte(token)) }

// ParseTokenHash parses a hex SHA-256 (64 hex digits, either case).
func ParseTokenHash(s string) (TokenHash, error) {
	var h TokenHash
	s = strings.TrimSpace(s)
	if len(s) != hex.EncodedLen(len(h)) {
		return h, fmt.Errorf("want the SHA-256 of the token in hex (64 hex digits, as printed by `toolsvc token new`), got %d characters", len(s))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return h, fmt.Errorf("want the SHA-256 of the token in hex (64 hex digits, as printed by `toolsvc token new`): not hex")
	}
	return h, nil
}

// NewToken returns a fresh bearer token read from random (crypto/rand's
// Reader) and its hash.
func NewToken(random io.Reader) (string, TokenHash, error) {
	b := make([]byte, tokenBytes)
	if _, err := io.ReadFull(random, b); err != nil {
		return "", TokenHash{}, fmt.Errorf("read random bytes: %w", err)
	}
	token := TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	return token, HashToken(token), nil
}
