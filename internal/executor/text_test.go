package executor

import (
	"encoding/json"
	"testing"
)

// TestDoubleNumbers: doubleNumbers refuses exactly the valid JSON that
// decoding into an any refuses.
func TestDoubleNumbers(t *testing.T) {
	for _, doc := range []string{
		`1`, `-0`, `1.5e308`, `1e309`, `-1e309`, `1e-400`, `123456789012345678901234567890`,
		`{"a":[1,2,{"b":-3.25E+2}],"c":"1e999","d\"1e999":true}`, `{"a":"\\","b":1e999}`,
		`[true,false,null,"x",0.1]`, `{"e":2E400}`, `"\"1e999"`, `[1e308,1.8e308]`,
	} {
		var x any
		want := json.Unmarshal([]byte(doc), &x)
		got := doubleNumbers([]byte(doc))
		if (got == nil) != (want == nil) {
			t.Errorf("%s: got %v, json.Unmarshal: %v", doc, got, want)
		}
	}
}
