package audit

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/toolsvc/toolsvc/internal/safetext"
)

// Bounds of an event's detail.
const (
	// DefaultDetailMaxBytes bounds an encoded detail unless configured
	// otherwise: room for a call's arguments and result in the common case,
	// while one event can never weigh megabytes.
	DefaultDetailMaxBytes = 16 << 10
	// MinDetailMaxBytes and MaxDetailMaxBytes bound the setting
	// (audit.detail_max_bytes).
	MinDetailMaxBytes = 1 << 10
	MaxDetailMaxBytes = 1 << 20
	// MaxDetailDepth bounds how deeply a detail nests (objects and arrays).
	// Each JSON level costs protobuf several message levels when the detail
	// is returned as a Struct, and clients refuse messages nested beyond
	// 10000: a deeply nested argument must not make the page that holds its
	// event unreadable.
	MaxDetailDepth = 64
)

// Keys of the marker that replaces a detail too large or too deep.
const (
	keyTruncated = "truncated"
	keyBytes     = "bytes"
	keyOmitted   = "omitted"
	keyError     = "detail_error"
)

// EncodeDetail encodes detail as the JSON object an event carries: compact,
// valid UTF-8, keys sorted (encoding/json's form). Strings keep what they hold,
// NUL included (escaped as \u0000), so that arguments are audited as they
// were sent.
//
// The result is always a JSON object of at most maxBytes bytes (at least
// MinDetailMaxBytes) nested at most MaxDetailDepth deep. A detail that does
// not fit is replaced by a marker object,
//
//	{"truncated":true,"bytes":N,"message":"first part…","omitted":["arguments"],"reason":"..."}
//
// where N is the size of the full encoding, with the detail's fields in key
// order: each whole if it fits (the smallest are chosen first), strings
// that do not fit whole cut on a character boundary (ending in "…") to share
// the room left, the rest named in "omitted". A detail that cannot be
// encoded at all (a NaN, a channel) is {"detail_error":"..."}. An empty
// detail is nil.
func EncodeDetail(detail map[string]any, maxBytes int) json.RawMessage {
	if len(detail) == 0 {
		return nil
	}
	maxBytes = max(maxBytes, MinDetailMaxBytes)
	b, err := marshal(detail)
	if err != nil {
		return encodeError(err)
	}
	if len(b) <= maxBytes && depth(b) <= MaxDetailDepth {
		return b
	}
	// Too large or too deep (rare): each field is encoded on its own, the
	// way it is inside the whole, to choose what fits.
	fields := make([]*field, 0, len(detail))
	for k, v := range detail {
		fb, err := marshal(v)
		if err != nil {
			return encodeError(err)
		}
		f := &field{key: k, prefix: "," + quote(k) + ":", value: fb}
		if s, ok := v.(string); ok {
			f.text, f.isText = s, true
		}
		fields = append(fields, f)
	}
	return truncated(fields, len(b), maxBytes)
}

// marshal is encoding/json's encoding (pooled, and the one results are
// stored with), made valid UTF-8 where a json.RawMessage passed invalid
// bytes through.
func marshal(v any) ([]byte, error) {
	var b []byte
	var err error
	if m, ok := v.(map[string]any); ok && m != nil {
		b, err = encodeDetail(make([]byte, 0, 256), m)
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		return nil, err
	}
	return safetext.JSON(b)
}

// field is one field of a detail: its key, the key encoded with a leading
// comma and colon, and its value encoded (nil: left out).
type field struct {
	key, prefix string
	value       []byte
	text        string // the value, if it is a string
	isText      bool
}

func byKey(a, b *field) int { return strings.Compare(a.key, b.key) }

// encodeError is the detail of a detail that cannot be encoded.
func encodeError(err error) json.RawMessage {
	b, _ := marshal(map[string]string{keyError: safetext.Bound(err.Error(), 200)})
	return b
}

// truncated builds the marker object for a detail of size bytes (see
// EncodeDetail) from its encoded fields. Fields are chosen smallest first,
// so that one large field does not crowd out the many small ones that say
// what happened; strings that do not fit whole share what room is left.
func truncated(fields []*field, size, maxBytes int) json.RawMessage {
	// Room is kept for the list of omitted keys as if every key were
	// omitted; keys are the code's own names, so this is small. Should it
	// not be, the list is left out rather than the fields.
	header := `{"` + keyTruncated + `":true,"` + keyBytes + `":` + strconv.Itoa(size)
	list := true
	reserve := len(`,"omitted":[]}`)
	for _, f := range fields {
		reserve += len(f.prefix) - 1
	}
	if reserve > maxBytes/4 {
		list, reserve = false, len(`}`)
	}
	room := maxBytes - len(header) - reserve

	slices.SortFunc(fields, func(a, b *field) int {
		return cmp.Or(cmp.Compare(len(a.prefix)+len(a.value), len(b.prefix)+len(b.value)), byKey(a, b))
	})
	var cuts []*field
	for _, f := range fields {
		switch {
		case f.key == keyTruncated || f.key == keyBytes || f.key == keyOmitted:
			f.value = nil // the marker owns these names
		case len(f.prefix)+len(f.value) <= room && depth(f.value) < MaxDetailDepth:
			room -= len(f.prefix) + len(f.value)
		case f.isText:
			f.value = nil
			cuts = append(cuts, f)
		default:
			f.value = nil
		}
	}
	// Strings that did not fit whole share the rest, each its part.
	for i, f := range cuts {
		share := room/(len(cuts)-i) - len(f.prefix)
		if share < minStringRoom {
			continue
		}
		f.value = fitString(f.text, share)
		room -= len(f.prefix) + len(f.value)
	}

	slices.SortFunc(fields, byKey)
	buf := bytes.NewBufferString(header)
	var omitted []string
	for _, f := range fields {
		if f.value == nil {
			omitted = append(omitted, f.prefix[1:len(f.prefix)-1])
			continue
		}
		buf.WriteString(f.prefix)
		buf.Write(f.value)
	}
	if list && len(omitted) > 0 {
		buf.WriteString(`,"` + keyOmitted + `":[` + strings.Join(omitted, ",") + `]`)
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

// minStringRoom is the least room worth a cut string: quotes, a few
// characters and the marker.
const minStringRoom = 16

// fitString encodes s as a JSON string of at most room bytes, cut on a
// character boundary with safetext.Marker when it does not fit.
func fitString(s string, room int) []byte {
	// No more than room bytes can be kept: cut before cleaning, so that a
	// megabyte string costs no more than a short one.
	s = strings.ToValidUTF8(safetext.Truncate(s, room), safetext.Replacement)
	n := room - 2
	for {
		b := quoteBytes(safetext.Truncate(s, n))
		if len(b) <= room || n <= 0 {
			return b
		}
		// Escapes made it longer than its bytes: scale the cut by how
		// much longer.
		n = min(n*room/len(b), n-1)
	}
}

func quote(s string) string { return string(quoteBytes(s)) }

func quoteBytes(s string) []byte {
	b, err := marshal(s)
	if err != nil { // a string always encodes
		return []byte(`""`)
	}
	return b
}

// depth returns how deeply the JSON text b nests objects and arrays.
func depth(b []byte) int { return safetext.Depth(b) }

// DetailParts returns detail (as EncodeDetail encodes it; nil for none)
// opened at keys, which it must not hold: len(keys)+1 texts between which
// the encodings of the keys' values, in the order of keys (sorted), give
// the detail with those keys set, byte for byte as EncodeDetail encodes it
// within its bounds. It lets a store complete an event's detail with values
// only it knows (ClaimCallParams.Replayed).
func DetailParts(detail json.RawMessage, keys ...string) ([]string, error) {
	if !slices.IsSorted(keys) {
		return nil, fmt.Errorf("audit: detail keys %q are not sorted", keys)
	}
	fields := map[string]json.RawMessage{}
	if len(detail) > 0 {
		if err := json.Unmarshal(detail, &fields); err != nil {
			return nil, fmt.Errorf("audit: the detail is not a JSON object: %w", err)
		}
	}
	all := make([]string, 0, len(fields)+len(keys))
	for k := range fields {
		all = append(all, k)
	}
	for _, k := range keys {
		if _, ok := fields[k]; ok {
			return nil, fmt.Errorf("audit: the detail already holds %q", k)
		}
		all = append(all, k)
	}
	slices.Sort(all)
	parts := make([]string, 0, len(keys)+1)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range all {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(quoteBytes(k))
		b.WriteByte(':')
		if v, ok := fields[k]; ok {
			b.Write(v)
			continue
		}
		parts = append(parts, b.String())
		b.Reset()
	}
	b.WriteByte('}')
	return append(parts, b.String()), nil
}
