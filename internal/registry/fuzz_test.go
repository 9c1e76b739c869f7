package registry

import (
	"errors"
	"testing"
)

// FuzzValidateArguments: any bytes give nil or an *ArgumentError with a
// message, never a panic or another error.
func FuzzValidateArguments(f *testing.F) {
	for _, s := range []string{``, `{}`, `[]`, `null`, `{"text":"ab","count":2}`, `{"nested":{"x":-1,"y":[1]}}`, `{"rows":[{"id":"x"}]}`, `{"a":` + "\xff" + `}`} {
		f.Add([]byte(s))
	}
	e := entryWith(f, argsSchema)
	f.Fuzz(func(t *testing.T, args []byte) {
		err := e.ValidateArguments("say", args)
		if err == nil {
			return
		}
		var ae *ArgumentError
		if !errors.As(err, &ae) || ae.Message == "" {
			t.Fatalf("ValidateArguments(%q) = %#v", args, err)
		}
	})
}

// FuzzParseFile: any file is either refused with a *FileError or yields
// definitions that validate (as far as a file can without providers).
func FuzzParseFile(f *testing.F) {
	f.Add(goodFile)
	f.Add("tools:\n  - name: x\n    actions: [{name: a, input_schema: {type: object, properties: {p: &a {type: string}, q: *a}}}]\n")
	f.Add("tools: [{name: x, actions: [{name: a, input_schema: {properties: {0x1F: .inf}}}]}]\n")
	f.Fuzz(func(t *testing.T, data string) {
		defs, err := parseFile("tools.yaml", []byte(data))
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) || len(fe.Problems) == 0 {
				t.Fatalf("parseFile error is not a FileError with problems: %#v", err)
			}
			return
		}
		for _, d := range defs {
			if _, v := (checker{}).prepare(d); len(v) > 0 {
				t.Fatalf("accepted a definition with violations: %+v", v)
			}
		}
	})
}
