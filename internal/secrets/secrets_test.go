package secrets

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestSecretNeverPrints(t *testing.T) {
	const canary = "canary-7f3a9c"
	s := New(canary)
	var forms []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10s"} {
		forms = append(forms, fmt.Sprintf(verb, s), fmt.Sprintf(verb, struct{ S Secret }{s}), fmt.Sprintf(verb, &s))
	}
	forms = append(forms, s.String(), s.GoString(), fmt.Sprint(s), fmt.Sprintln(s))
	j, _ := json.Marshal(map[string]any{"s": s, "p": &s})
	forms = append(forms, string(j))
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "s", s, "group", slog.Any("p", s))
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "s", s)
	forms = append(forms, buf.String())
	for _, f := range forms {
		if strings.Contains(f, canary) {
			t.Fatalf("a printed form holds the value: %s", f)
		}
	}
	if s.Reveal() != canary {
		t.Fatal("Reveal lost the value")
	}
}
