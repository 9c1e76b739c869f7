package server

import (
	"strconv"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/safetext"
)

// checkText refuses a request any of whose text fields — names, ids, keys,
// comments, reasons, filters, page tokens, at any depth — holds NUL or
// invalid UTF-8: INVALID_ARGUMENT with a field violation per field
// (fault.Violations.CheckText), the same answer on every store. Without it
// Postgres refuses such text deep in a query (INTERNAL) while the memory
// store takes it.
//
// Protobuf already refuses invalid UTF-8 in string fields when a request is
// decoded, but NUL is valid UTF-8, and requests also arrive by other paths
// (in-process callers, the CLI). JSON documents (google.protobuf.Struct and
// Value: arguments, schemas, examples) are not checked: their strings are
// values that may hold anything JSON can, NUL included, and are stored as
// JSON.
//
// Every handler calls it first. ExecuteTool's envelope is checked by the
// executor instead, which audits the refusal (tool_call.rejected).
func checkText(req proto.Message, summary string) error {
	var v fault.Violations
	walkText(&v, req.ProtoReflect(), "")
	return v.Err(summary)
}

// CheckRequestText is the check every handler makes first, for clients
// that would rather refuse a request than send it (the CLI): a
// *fault.Error naming each text field with NUL or invalid UTF-8, or nil.
func CheckRequestText(req proto.Message) error { return checkText(req, "invalid request") }

// walkText checks the set text fields of m, naming each by its path from
// the request ("tool.actions[2].name", "types[0]").
func walkText(v *fault.Violations, m protoreflect.Message, prefix string) {
	if isJSONDocument(m.Descriptor()) {
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		path := prefix + string(fd.Name())
		switch {
		case fd.IsList():
			l := val.List()
			for i := range l.Len() {
				checkValue(v, fd, l.Get(i), path+"["+strconv.Itoa(i)+"]")
			}
		case fd.IsMap():
			val.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				at := path + "[" + safetext.Quote(k.String()) + "]"
				v.CheckText(at, k.String())
				checkValue(v, fd.MapValue(), mv, at)
				return true
			})
		default:
			checkValue(v, fd, val, path)
		}
		return true
	})
}

func checkValue(v *fault.Violations, fd protoreflect.FieldDescriptor, val protoreflect.Value, path string) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		v.CheckText(path, val.String())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		walkText(v, val.Message(), path+".")
	}
}

// isJSONDocument reports whether d is one of the well-known types that carry
// a JSON document.
func isJSONDocument(d protoreflect.MessageDescriptor) bool {
	switch d.FullName() {
	case "google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue":
		return true
	}
	return false
}
