package server

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/safetext"
)

// Page tokens are opaque to callers: base64url of a small JSON cursor that
// carries where the next page starts and a hash of the request's filters, so
// that a token cannot be replayed with other filters (which would silently
// skip or repeat records). They are not signed: a caller forging one only
// reaches records its filters already allow.

// pageCursor is the decoded form of a page token.
type pageCursor struct {
	// After is the position after which the next page starts (a tool name,
	// an approval id, an audit sequence number in decimal...).
	After string `json:"a"`
	// Filter is the hash of the filters of the request that produced it.
	Filter string `json:"f"`
}

// Page sizes. Every List RPC documents these: 0 means defaultPageSize, and
// larger values are capped at maxPageSize.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// pageSize returns the page size a request asks for, or an INVALID_ARGUMENT
// fault naming page_size if it is negative.
func pageSize(requested int32) (int, error) {
	switch {
	case requested < 0:
		var v fault.Violations
		v.Add("page_size", "must not be negative (0 means %d, at most %d)", defaultPageSize, maxPageSize)
		return 0, v.Err("invalid page size")
	case requested == 0:
		return defaultPageSize, nil
	case requested > maxPageSize:
		return maxPageSize, nil
	}
	return int(requested), nil
}

// encodePageToken returns the token for the page after position after, for
// a request with the given filters (any JSON-encodable value; nil for none).
func encodePageToken(after string, filters any) string {
	b, err := json.Marshal(pageCursor{After: after, Filter: filterHash(filters)})
	if err != nil {
		// A pageCursor of two strings always marshals.
		panic(fmt.Sprintf("encode page token: %v", err))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodePageToken returns the position a token continues after. The empty
// token is the first page (""). A token that does not decode, or was issued
// for other filters, is an INVALID_ARGUMENT fault naming page_token.
func decodePageToken(token string, filters any) (string, error) {
	if token == "" {
		return "", nil
	}
	bad := func(why string) error {
		var v fault.Violations
		v.Add("page_token", "%s", why)
		return v.Err("invalid page token")
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return "", bad("not a page token issued by this service")
	}
	var c pageCursor
	// Tokens are not signed, so a forged one may carry any position: one
	// with text no issued token holds (NUL, or bytes JSON decoding
	// replaced) is refused here rather than by a store's query.
	if err := json.Unmarshal(raw, &c); err != nil || c.After == "" || !safetext.Valid(c.After) ||
		!utf8.Valid(raw) {
		return "", bad("not a page token issued by this service")
	}
	if c.Filter != filterHash(filters) {
		return "", bad("the token was issued for a request with other filters; repeat the request's filters or start over without a token")
	}
	return c.After, nil
}

// filterHash hashes a request's filters. Field order is fixed by the Go type,
// so equal filters hash equally.
func filterHash(filters any) string {
	b, err := json.Marshal(filters)
	if err != nil {
		panic(fmt.Sprintf("page token filters must be JSON-encodable: %v", err))
	}
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}
