package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/safetext"
)

// gRPC decodes a request before any interceptor runs and answers its own
// bare statuses when that fails (a message over the size limit, a string
// field that is not UTF-8, messages nested past protobuf's recursion limit),
// outside toolsvc's error contract. So the server's codec never fails a
// decode: it notes what went wrong against the message, and the limiter
// interceptor answers it as a fault, audited like every other refusal.

// decodeFaults holds the decode failures the codec noted, by message, until
// the limiter takes them. It is almost always empty: the count spares
// well-formed requests the map lookup.
type decodeFaults struct {
	n     atomic.Int64
	byMsg sync.Map // message pointer -> *fault.Error
}

func (d *decodeFaults) put(msg any, f *fault.Error) {
	d.byMsg.Store(msg, f)
	d.n.Add(1)
}

// take returns and forgets the failure noted for msg, or nil.
func (d *decodeFaults) take(msg any) *fault.Error {
	if msg == nil || d.n.Load() == 0 {
		return nil
	}
	v, ok := d.byMsg.LoadAndDelete(msg)
	if !ok {
		return nil
	}
	d.n.Add(-1)
	return v.(*fault.Error)
}

// codec is gRPC's protobuf codec, except that a request it cannot accept is
// not refused here (see above): it is left empty and its failure noted.
type codec struct {
	limit  int
	faults *decodeFaults
	// base is gRPC's own protobuf codec, which encodes every answer.
	base encoding.CodecV2
}

var _ encoding.CodecV2 = (*codec)(nil)

func newCodec(limit int, faults *decodeFaults) *codec {
	return &codec{limit: limit, faults: faults, base: encoding.GetCodecV2(grpcproto.Name)}
}

func (c *codec) Name() string { return grpcproto.Name }

// Marshal encodes deterministically (map entries, such as a Struct's keys,
// in a fixed order), so that identical state gives identical bytes: agents
// cache tool lists and schemas and detect changes by comparing them.
func (c *codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return c.base.Marshal(v)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (c *codec) Unmarshal(data mem.BufferSlice, v any) error {
	m := messageOf(v)
	if m == nil {
		return c.base.Unmarshal(data, v)
	}
	if n := data.Len(); n > c.limit {
		c.faults.put(v, fault.MessageTooLarge(n, c.limit))
		return nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if err := proto.Unmarshal(b, m); err != nil {
		proto.Reset(m)
		field, why := diagnose(m.ProtoReflect().Descriptor(), b)
		c.faults.put(v, fault.UndecodableRequest(field, why).WithCause(err))
	}
	return nil
}

func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// maxDepth is protobuf's recursion limit (protowire.DefaultRecursionLimit):
// how deep messages may nest in a request.
const maxDepth = protowire.DefaultRecursionLimit

// maxPath bounds the field paths diagnose reports.
const maxPath = 200

// diagnose walks the wire bytes of a message of md that failed to decode and
// names the first field at fault: a string that is not UTF-8, a message
// nested deeper than maxDepth, or bytes that are not protobuf. Paths use the
// field names, and JSON's notation inside google.protobuf.Struct values
// ("arguments.items[2].name"), as a caller wrote them.
func diagnose(md protoreflect.MessageDescriptor, b []byte) (field, why string) {
	field, why = walk(md, b, "", 0)
	if why == "" {
		return "", "is not a valid protobuf message"
	}
	return field, why
}

func walk(md protoreflect.MessageDescriptor, b []byte, path string, depth int) (string, string) {
	var seen map[protowire.Number]int // elements of each repeated field so far
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return path, "is not valid protobuf"
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return path, "is not valid protobuf"
		}
		value := b[:n]
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			continue
		}
		v, _ := protowire.ConsumeBytes(value)
		i := 0
		if fd.IsList() {
			if seen == nil {
				seen = map[protowire.Number]int{}
			}
			i = seen[num]
			seen[num]++
		}
		name := childPath(md, fd, path, i, v)
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name, "is not valid UTF-8"
			}
		case protoreflect.MessageKind:
			if depth+1 > maxDepth {
				return topField(path, fd), fmt.Sprintf("nests messages deeper than %d levels", maxDepth)
			}
			if f, why := walk(fd.Message(), v, name, depth+1); why != "" {
				return f, why
			}
		}
	}
	return "", ""
}

// childPath is the path of field fd of a message of md at path. Inside
// google.protobuf.Struct, Value and ListValue it follows JSON: an object's
// members by key, a list's elements by index, and a value adds nothing.
// i is the element's index in a repeated field.
func childPath(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, path string, i int, v []byte) string {
	if len(path) >= maxPath {
		return path // long enough to find the place; the rest is noise
	}
	switch md.FullName() {
	case "google.protobuf.Value":
		return path
	case "google.protobuf.ListValue":
		return path + "[" + strconv.Itoa(i) + "]"
	case "google.protobuf.Struct":
		// A map entry: its key is field 1. The member's path is the
		// entry's; walking the entry then adds nothing for the key and
		// value fields (see below).
		return joinPath(path, mapKey(v))
	}
	if md.IsMapEntry() {
		if md.Parent() != nil && md.Parent().FullName() == "google.protobuf.Struct" {
			return path
		}
		if fd.Number() == 1 {
			return path + ".key"
		}
		return path
	}
	if fd.IsMap() {
		return joinPath(path, fd.TextName()) + "[" + safetext.Quote(mapKey(v)) + "]"
	}
	if fd.IsList() {
		return joinPath(path, fd.TextName()) + "[" + strconv.Itoa(i) + "]"
	}
	return joinPath(path, fd.TextName())
}

// mapKey is the string key (field 1) of an encoded map entry, if it has one.
func mapKey(entry []byte) string {
	for len(entry) > 0 {
		num, typ, n := protowire.ConsumeTag(entry)
		if n < 0 {
			return ""
		}
		entry = entry[n:]
		if num == 1 && typ == protowire.BytesType {
			k, _ := protowire.ConsumeBytes(entry)
			return safetext.Bound(string(k), 64)
		}
		if n = protowire.ConsumeFieldValue(num, typ, entry); n < 0 {
			return ""
		}
		entry = entry[n:]
	}
	return ""
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// topField is the first element of path (or fd's name at the top): for
// nesting past the limit, where the full path would be thousands of
// elements long.
func topField(path string, fd protoreflect.FieldDescriptor) string {
	if path == "" {
		return fd.TextName()
	}
	top, _, _ := strings.Cut(path, ".")
	top, _, _ = strings.Cut(top, "[")
	return top
}

// limiter answers, inside the error contract, what gRPC would answer
// outside it: requests the codec could not accept, and responses larger
// than the configured limit (which gRPC would fail to send).
type limiter struct {
	faults  *decodeFaults
	maxSend int
	authz   *authorizer
}

func (l *limiter) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if f := l.faults.take(req); f != nil {
			l.authz.refuse(ctx, info.FullMethod, req, f)
			return nil, f
		}
		resp, err := handler(ctx, req)
		if err != nil {
			return nil, err
		}
		if err := l.checkSend(resp); err != nil {
			return nil, err
		}
		return resp, nil
	}
}

func (l *limiter) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &limitedStream{ServerStream: ss, l: l, method: info.FullMethod})
	}
}

// checkSend refuses a response larger than the send limit.
func (l *limiter) checkSend(resp any) error {
	m := messageOf(resp)
	if m == nil {
		return nil
	}
	if n := proto.Size(m); n > l.maxSend {
		return fault.ResponseTooLarge(n, l.maxSend)
	}
	return nil
}

// limitedStream applies the limiter to each message of a stream.
type limitedStream struct {
	grpc.ServerStream
	l      *limiter
	method string
}

func (s *limitedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if f := s.l.faults.take(m); f != nil {
		s.l.authz.refuse(s.Context(), s.method, m, f)
		return f
	}
	return nil
}

func (s *limitedStream) SendMsg(m any) error {
	if err := s.l.checkSend(m); err != nil {
		return err
	}
	return s.ServerStream.SendMsg(m)
}
