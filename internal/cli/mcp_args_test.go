package cli

import (
	"strings"
	"testing"
)

// `mcp call` refuses arguments the server would refuse before it connects,
// saying what is wrong without echoing the whole argument back.
func TestMCPCallRefusesBadArguments(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)
	for _, c := range []struct{ args, want string }{
		{`{"message": "a", "message": "b"}`, "not valid JSON"},
		{`{"message": "\ud800"}`, "not valid JSON"},
		{"{\"message\": \"a\xffb\"}", "not valid JSON"},
		{deep, "not valid JSON"},
		{`[1, 2]`, "must be a JSON object"},
		{`7`, "not a number"},
		{`"text"`, "not a string"},
	} {
		code, _, stderr := runCmd(t, nil, "mcp", "call", "echo", "--url", "http://127.0.0.1:1/mcp", "--args", c.args)
		if code != exitUsage || !strings.Contains(stderr, c.want) || len(stderr) > 1000 {
			t.Errorf("--args %.40q: exit %d, stderr %.300q; want exit %d saying %q, briefly", c.args, code, stderr, exitUsage, c.want)
		}
	}
}
