package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// secretPrefix marks a Standard Webhooks signing secret.
const secretPrefix = "whsec_"

// ErrBadSecret: a signing secret is not whsec_ followed by base64.
var ErrBadSecret = errors.New("the signing secret is not whsec_ followed by base64 (as Standard Webhooks libraries expect)")

// SigningKey decodes a signing secret: "whsec_" and base64, or base64
// alone, as the receivers' Standard Webhooks libraries decode it.
func SigningKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(secret), secretPrefix))
	if err != nil || len(key) == 0 {
		return nil, ErrBadSecret
	}
	return key, nil
}

// Sign returns the webhook-signature header of a message: "v1," and the
// base64 HMAC-SHA256, under key, of "id.timestamp.body" (timestamp in Unix
// seconds).
func Sign(key []byte, id string, timestamp time.Time, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + strconv.FormatInt(timestamp.Unix(), 10) + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Verification failures (Verify).
var (
	ErrMissingHeaders = errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
	ErrBadTimestamp   = errors.New("webhook-timestamp is not a Unix time in seconds")
	ErrReplayWindow   = errors.New("webhook-timestamp is outside the replay window")
	ErrNoSignature    = errors.New("no signature matches")
)

// Verify checks a received message as a receiver should: the headers are
// present, the timestamp is within window of now (older or newer messages
// are refused, which bounds replays), and one of the space-separated v1
// signatures matches. Receivers also remember the webhook-ids they have
// handled, for at least the window, and ignore repeats.
func Verify(key []byte, id, timestamp, signatures string, body []byte, now time.Time, window time.Duration) error {
	if id == "" || timestamp == "" || signatures == "" {
		return ErrMissingHeaders
	}
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return ErrBadTimestamp
	}
	ts := time.Unix(sec, 0)
	if now.Sub(ts) > window || ts.Sub(now) > window {
		return ErrReplayWindow
	}
	want := Sign(key, id, ts, body)
	for _, sig := range strings.Fields(signatures) {
		if strings.HasPrefix(sig, "v1,") && hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return ErrNoSignature
}
