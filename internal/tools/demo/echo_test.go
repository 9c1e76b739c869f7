package demo

import (
	"strings"
	"testing"
)

func TestEcho(t *testing.T) {
	e := NewEcho()
	r := succeed(t, e, "echo", `{"message":"hello world"}`)
	if got := valueAs[EchoResult](t, r.Value); got.Message != "hello world" {
		t.Fatalf("value = %+v", got)
	}
	if r.Message != "echo: hello world" {
		t.Fatalf("message = %q", r.Message)
	}

	r = succeed(t, e, "echo", `{"message":"héllo","uppercase":true}`)
	if got := valueAs[EchoResult](t, r.Value); got.Message != "HÉLLO" || r.Message != "echo: HÉLLO" {
		t.Fatalf("uppercase: value %+v, message %q", got, r.Message)
	}
	r = succeed(t, e, "echo", `{"message":"Mixed","uppercase":false}`)
	if got := valueAs[EchoResult](t, r.Value); got.Message != "Mixed" {
		t.Fatalf("uppercase false changed the message: %+v", got)
	}

	// 1000 characters are allowed even when they are multi-byte.
	long := strings.Repeat("ü", 1000)
	r = succeed(t, e, "echo", `{"message":"`+long+`"}`)
	if got := valueAs[EchoResult](t, r.Value); got.Message != long {
		t.Fatal("1000-character message not echoed whole")
	}

	fail(t, e, "echo", `{"message":""}`, "1 to 1000 characters")
	fail(t, e, "echo", `{"message":"`+strings.Repeat("x", 1001)+`"}`, "1 to 1000 characters")
	fail(t, e, "echo", ``, "1 to 1000 characters")
	fail(t, e, "echo", `{"message":42}`, "invalid arguments")
}
