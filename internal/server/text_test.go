package server

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/fault"
)

// violations returns the field violations of checkText's answer (nil when
// it accepts), failing unless the answer is INVALID_ARGUMENT.
func violations(t *testing.T, req proto.Message) map[string]string {
	t.Helper()
	err := checkText(req, "invalid request")
	if err == nil {
		return nil
	}
	f, ok := fault.As(err)
	if !ok || f.Kind != fault.InvalidArgument || f.Reason != fault.ReasonInvalidRequest {
		t.Fatalf("want INVALID_ARGUMENT, got %#v", err)
	}
	out := map[string]string{}
	for _, v := range f.Violations {
		out[v.Field] = v.Description
	}
	return out
}

// TestCheckTextNamesEveryField: NUL and invalid UTF-8 are refused in every
// text field of every request, at any depth, each named by its path.
func TestCheckTextNamesEveryField(t *testing.T) {
	const nul, bad = "x\x00", "x\xe6\x97"
	cases := []struct {
		req  proto.Message
		want map[string]string
	}{
		{&toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_CallId{CallId: nul}}, map[string]string{"call_id": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: bad}}, map[string]string{"idempotency_key": "must be valid UTF-8"}},
		{&toolsvcv1.ResolveCallRequest{CallId: "c", Comment: nul}, map[string]string{"comment": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.ResolveApprovalRequest{ApprovalId: bad, Comment: nul}, map[string]string{
			"approval_id": "must be valid UTF-8", "comment": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.ListApprovalsRequest{Tool: nul, PageToken: bad}, map[string]string{
			"tool": "must not contain NUL (U+0000)", "page_token": "must be valid UTF-8"}},
		{&toolsvcv1.GetApprovalRequest{ApprovalId: nul}, map[string]string{"approval_id": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.WatchApprovalsRequest{Tool: nul}, map[string]string{"tool": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.ListAuditEventsRequest{Types: []string{"ok", nul}, CallId: nul, TraceId: bad, TaskId: nul, Principal: nul, Tool: bad},
			map[string]string{"types[1]": "must not contain NUL (U+0000)", "call_id": "must not contain NUL (U+0000)",
				"trace_id": "must be valid UTF-8", "task_id": "must not contain NUL (U+0000)",
				"principal": "must not contain NUL (U+0000)", "tool": "must be valid UTF-8"}},
		{&toolsvcv1.GetToolHealthRequest{Tool: nul}, map[string]string{"tool": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.ListToolHealthRequest{PageToken: nul}, map[string]string{"page_token": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.WatchToolHealthRequest{Tools: []string{"a", "b", bad}}, map[string]string{"tools[2]": "must be valid UTF-8"}},
		{&toolsvcv1.SetToolHealthRequest{Tool: "t", Reason: nul}, map[string]string{"reason": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.GetToolRequest{Name: nul}, map[string]string{"name": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.ListToolsRequest{PageToken: nul}, map[string]string{"page_token": "must not contain NUL (U+0000)"}},
		{&toolsvcv1.DeregisterToolRequest{Name: bad}, map[string]string{"name": "must be valid UTF-8"}},
		{&toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{
			Name: "t", Description: nul, RequiredScopes: []string{"a", bad}, ConfigRef: nul,
			Actions: []*toolsvcv1.Action{{Name: "a"}, {Name: nul, ResourceArgument: bad,
				Examples: []*toolsvcv1.ActionExample{{Description: nul}}}},
			Policies: []*toolsvcv1.Policy{{Kind: &toolsvcv1.Policy_SequentialDependency{
				SequentialDependency: &toolsvcv1.SequentialDependency{Action: "a", Requires: []string{nul}}}}},
		}}, map[string]string{
			"tool.description": "must not contain NUL (U+0000)", "tool.required_scopes[1]": "must be valid UTF-8",
			"tool.config_ref": "must not contain NUL (U+0000)", "tool.actions[1].name": "must not contain NUL (U+0000)",
			"tool.actions[1].resource_argument":                  "must be valid UTF-8",
			"tool.actions[1].examples[0].description":            "must not contain NUL (U+0000)",
			"tool.policies[0].sequential_dependency.requires[0]": "must not contain NUL (U+0000)",
		}},
	}
	for _, c := range cases {
		name := string(proto.MessageName(c.req).Name())
		got := violations(t, c.req)
		if len(got) != len(c.want) {
			t.Errorf("%s: violations %v, want %v", name, got, c.want)
			continue
		}
		for field, desc := range c.want {
			if got[field] != desc {
				t.Errorf("%s: %s = %q, want %q (all: %v)", name, field, got[field], desc, got)
			}
		}
	}
}

// TestCheckTextLeavesJSONAlone: arguments, schemas and examples are JSON
// documents; a string inside one may hold NUL (it is stored as \u0000).
func TestCheckTextLeavesJSONAlone(t *testing.T) {
	s, err := structpb.NewStruct(map[string]any{"text": "a\x00b", "nested": map[string]any{"list": []any{"\x00"}}})
	if err != nil {
		t.Fatal(err)
	}
	req := &toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{Name: "t", Actions: []*toolsvcv1.Action{{
		Name: "a", InputSchema: s, Examples: []*toolsvcv1.ActionExample{{Input: s, Output: structpb.NewStringValue("\x00")}},
	}}}}
	if got := violations(t, req); got != nil {
		t.Fatalf("JSON documents checked: %v", got)
	}
	if got := violations(t, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_CallId{CallId: "日本語 😀"}}); got != nil {
		t.Fatalf("valid text refused: %v", got)
	}
}

// TestPageTokenRefusesUnsafePosition: a forged token (they are not signed)
// may carry any position; one with NUL must not reach a store's query.
func TestPageTokenRefusesUnsafePosition(t *testing.T) {
	f := testFilters{State: "PENDING"}
	for _, after := range []string{"a\x00b", "\x00"} {
		_, err := decodePageToken(encodePageToken(after, f), f)
		assertPageTokenFault(t, err)
	}
	raw, _ := json.Marshal(pageCursor{After: "x", Filter: filterHash(f)})
	raw = append(raw[:len(raw)-1], []byte(",\"z\":\"\xff\"}")...)
	_, err := decodePageToken(base64.RawURLEncoding.EncodeToString(raw), f)
	assertPageTokenFault(t, err)
}

// TestStatusCarriesOnlyValidText: a refusal whose violations quote invalid
// text still reaches the caller with its details (protobuf would refuse to
// marshal them), bounded.
func TestStatusCarriesOnlyValidText(t *testing.T) {
	var v fault.Violations
	v.Add("a\xffb", "quotes %s", "x\xe6\x97"+strings.Repeat("é", 5000))
	err := ToStatus(v.Err("bad \xff request"))
	st := status.Convert(err)
	if !utf8.ValidString(st.Message()) {
		t.Fatalf("message %q", st.Message())
	}
	var br *errdetails.BadRequest
	for _, d := range st.Details() {
		if b, ok := d.(*errdetails.BadRequest); ok {
			br = b
		}
	}
	if br == nil || len(br.FieldViolations) != 1 {
		t.Fatalf("details lost: %v", st.Details())
	}
	fv := br.FieldViolations[0]
	if fv.Field != "a\uFFFDb" || !strings.HasPrefix(fv.Description, "quotes x\uFFFDéé") || len(fv.Description) > maxViolationText {
		t.Fatalf("violation %q: %.40q (%d bytes)", fv.Field, fv.Description, len(fv.Description))
	}
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("code %s", st.Code())
	}
}
