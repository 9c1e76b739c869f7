package server

import (
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// diagnose reads whatever bytes a caller sends: it never panics, and the
// field it names is short, valid text.
func FuzzDiagnose(f *testing.F) {
	args, _ := structpb.NewStruct(map[string]any{"a": map[string]any{"b": []any{"x", 1.0, true}}})
	for _, m := range []proto.Message{
		&toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo", Arguments: args,
			Context: &toolsvcv1.CallContext{TraceId: "t", Scopes: []string{"a", "b"}}},
		&toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{Name: "n", Actions: []*toolsvcv1.Action{{Name: "a", InputSchema: args}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff})
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})
	md := (&toolsvcv1.ExecuteToolRequest{}).ProtoReflect().Descriptor()
	f.Fuzz(func(t *testing.T, b []byte) {
		field, why := diagnose(md, b)
		if why == "" || len(field) > maxPath+100 || !utf8.ValidString(field) {
			t.Fatalf("diagnose(%q) = %q, %q", b, field, why)
		}
	})
}
