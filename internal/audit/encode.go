package audit

import (
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"time"
)

// encodeDetail appends detail to buf exactly as json.Marshal encodes it:
// keys sorted, compact, HTML-escaped. The values the pipeline's details
// hold (strings, integers, booleans, nil, nested details, lists of
// strings) are written directly; any other value, and any string that
// needs escaping, is encoded by json.Marshal on its own, which gives the
// bytes it would have inside the whole. A detail is built on every call,
// and encoding a map by reflection allocates for every key and value.
func encodeDetail(buf []byte, detail map[string]any) ([]byte, error) {
	ks := keysPool.Get().(*[]string)
	keys := (*ks)[:0]
	for k := range detail {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	buf = append(buf, '{')
	var err error
	for i, k := range keys {
		if i > 0 {
			buf = append(buf, ',')
		}
		if buf, err = appendString(buf, k); err != nil {
			break
		}
		buf = append(buf, ':')
		if buf, err = appendValue(buf, detail[k]); err != nil {
			break
		}
	}
	clear(keys)
	*ks = keys[:0]
	keysPool.Put(ks)
	if err != nil {
		return nil, err
	}
	return append(buf, '}'), nil
}

var keysPool = sync.Pool{New: func() any { s := make([]string, 0, 16); return &s }}

func appendValue(buf []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(buf, "null"...), nil
	case string:
		return appendString(buf, v)
	case bool:
		return strconv.AppendBool(buf, v), nil
	case int:
		return strconv.AppendInt(buf, int64(v), 10), nil
	case int32:
		return strconv.AppendInt(buf, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(buf, v, 10), nil
	case uint32:
		return strconv.AppendUint(buf, uint64(v), 10), nil
	case uint64:
		return strconv.AppendUint(buf, v, 10), nil
	case time.Time:
		// json.Marshal's form (RFC 3339, as MarshalJSON writes it); a time
		// MarshalJSON refuses is left to it, for its error.
		if b, err := v.AppendText(append(buf, '"')); err == nil {
			return append(b, '"'), nil
		}
	case json.RawMessage:
		// A call's arguments or result, already compact JSON as a rule:
		// then json.Marshal would write it as it is.
		if v != nil && compactJSON(v) {
			return append(buf, v...), nil
		}
	case map[string]any:
		if v == nil {
			return append(buf, "null"...), nil
		}
		return encodeDetail(buf, v)
	case []string:
		if v == nil {
			return append(buf, "null"...), nil
		}
		buf = append(buf, '[')
		var err error
		for i, s := range v {
			if i > 0 {
				buf = append(buf, ',')
			}
			if buf, err = appendString(buf, s); err != nil {
				return nil, err
			}
		}
		return append(buf, ']'), nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(buf, b...), nil
}

// appendString appends s as a JSON string: directly if every byte is
// printable ASCII that json.Marshal leaves as it is, else by json.Marshal.
func appendString(buf []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, err := json.Marshal(s)
			if err != nil {
				return nil, err
			}
			return append(buf, b...), nil
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"'), nil
}

// compactJSON reports whether b is valid JSON that json.Marshal would write
// unchanged: no whitespace between tokens, nothing it escapes for HTML (<, >,
// &, U+2028, U+2029).
func compactJSON(b []byte) bool {
	if !json.Valid(b) {
		return false
	}
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '<' || c == '>' || c == '&' || c == 0xE2: // 0xE2 leads U+2028 and U+2029
			return false
		case inString && c == '\\':
			i++ // the escaped character
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}
