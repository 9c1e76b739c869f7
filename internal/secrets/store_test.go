package secrets

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnvName(t *testing.T) {
	for _, tc := range []struct{ conn, key, want string }{
		{"billing", "api_key", "TOOLSVC_SECRET_BILLING_API_KEY"},
		{"billing-eu", "api.key", "TOOLSVC_SECRET_BILLING_EU_API_KEY"},
		{"gh", "Token-2", "TOOLSVC_SECRET_GH_TOKEN_2"},
	} {
		if got := EnvName(tc.conn, tc.key); got != tc.want {
			t.Errorf("EnvName(%q, %q) = %q, want %q", tc.conn, tc.key, got, tc.want)
		}
	}
}

func TestEnvStore(t *testing.T) {
	env := map[string]string{"TOOLSVC_SECRET_BILLING_EU_API_KEY": "v1", "TOOLSVC_SECRET_BILLING_EU_EMPTY": ""}
	st := NewEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	ctx := context.Background()
	s, err := st.Get(ctx, "billing-eu", "api-key")
	if err != nil || s.Reveal() != "v1" {
		t.Fatalf("Get = %v, %v", s, err)
	}
	env["TOOLSVC_SECRET_BILLING_EU_API_KEY"] = "v2"
	if s, _ := st.Get(ctx, "billing-eu", "api-key"); s.Reveal() != "v2" {
		t.Fatal("a changed variable is not seen")
	}
	for _, key := range []string{"missing", "empty"} {
		_, err := st.Get(ctx, "billing-eu", key)
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get(%s) = %v, want ErrNotFound", key, err)
		}
		for _, want := range []string{`connector "billing-eu"`, `secret "` + key + `"`, "TOOLSVC_SECRET_BILLING_EU_" + strings.ToUpper(key)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %s", err, want)
			}
		}
	}
	if _, err := st.Get(ctx, "billing", "../x"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("a bad key: %v", err)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestDirStore(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "billing", "api_key"), "plain\n")
	write(t, filepath.Join(dir, "billing", "crlf"), "windows\r\n")
	write(t, filepath.Join(dir, "billing", "empty"), "\n")
	st, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for key, want := range map[string]string{"api_key": "plain", "crlf": "windows"} {
		s, err := st.Get(ctx, "billing", key)
		if err != nil || s.Reveal() != want {
			t.Fatalf("Get(%s) = %q, %v; want %q", key, s.Reveal(), err, want)
		}
	}
	for _, tc := range []struct{ conn, key string }{{"billing", "nope"}, {"other", "api_key"}, {"billing", "empty"}} {
		_, err := st.Get(ctx, tc.conn, tc.key)
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get(%s/%s) = %v, want ErrNotFound", tc.conn, tc.key, err)
		}
		if !strings.Contains(err.Error(), filepath.Join(dir, tc.conn, tc.key)) || !strings.Contains(err.Error(), `connector "`+tc.conn+`"`) {
			t.Errorf("error %q does not say where it looked", err)
		}
	}
	// A rewritten file is read afresh.
	write(t, filepath.Join(dir, "billing", "api_key"), "rotated")
	if s, _ := st.Get(ctx, "billing", "api_key"); s.Reveal() != "rotated" {
		t.Fatalf("after a rewrite: %q", s.Reveal())
	}
	if _, err := NewDir(filepath.Join(dir, "billing", "api_key")); err == nil {
		t.Fatal("a file is accepted as the secrets directory")
	}
	if _, err := NewDir(filepath.Join(dir, "absent")); err == nil {
		t.Fatal("a missing secrets directory is accepted")
	}
}

// TestDirStoreKubernetesSwap lays files out the way the kubelet does
// (key -> ..data/key, ..data -> ..<timestamp>) and updates them the way it
// does: a new timestamped directory, then an atomic rename of a new ..data
// symlink over the old one.
func TestDirStoreKubernetesSwap(t *testing.T) {
	dir := t.TempDir()
	conn := filepath.Join(dir, "billing")
	write(t, filepath.Join(conn, "..2025_01_01_00_00_00.1", "api_key"), "first")
	symlink(t, "..2025_01_01_00_00_00.1", filepath.Join(conn, "..data"))
	symlink(t, "..data/api_key", filepath.Join(conn, "api_key"))
	st, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s, err := st.Get(ctx, "billing", "api_key"); err != nil || s.Reveal() != "first" {
		t.Fatalf("before the swap: %q, %v", s.Reveal(), err)
	}
	write(t, filepath.Join(conn, "..2025_01_02_00_00_00.2", "api_key"), "second")
	symlink(t, "..2025_01_02_00_00_00.2", filepath.Join(conn, "..data_tmp"))
	if err := os.Rename(filepath.Join(conn, "..data_tmp"), filepath.Join(conn, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(conn, "..2025_01_01_00_00_00.1")); err != nil {
		t.Fatal(err)
	}
	if s, err := st.Get(ctx, "billing", "api_key"); err != nil || s.Reveal() != "second" {
		t.Fatalf("after the swap: %q, %v", s.Reveal(), err)
	}
	// "..data" itself is never a key.
	if _, err := st.Get(ctx, "billing", "..data"); err == nil {
		t.Fatal("..data is readable as a key")
	}
}

func TestDirStoreRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	write(t, filepath.Join(outside, "stolen"), "outside-value")
	write(t, filepath.Join(outside, "conn", "api_key"), "outside-value")
	dir := t.TempDir()
	write(t, filepath.Join(dir, "good", "api_key"), "inside")
	write(t, filepath.Join(dir, "shared", "token"), "shared-token")
	if err := os.MkdirAll(filepath.Join(dir, "billing"), 0o700); err != nil {
		t.Fatal(err)
	}
	symlink(t, filepath.Join(outside, "stolen"), filepath.Join(dir, "billing", "absolute"))
	symlink(t, "../../"+filepath.Base(outside)+"/stolen", filepath.Join(dir, "billing", "relative"))
	symlink(t, filepath.Join(outside, "conn"), filepath.Join(dir, "linked"))
	// A link that stays inside the directory is fine.
	symlink(t, "../shared/token", filepath.Join(dir, "billing", "inside"))
	if err := os.Mkdir(filepath.Join(dir, "billing", "subdir"), 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct{ conn, key string }{
		{"billing", "absolute"}, {"billing", "relative"}, {"linked", "api_key"}, {"billing", "subdir"},
		{"billing", "../good/api_key"}, {"billing", "/etc/passwd"}, {"..", "x"}, {"billing/..", "x"}, {"", "x"},
	} {
		s, err := st.Get(ctx, tc.conn, tc.key)
		if err == nil {
			t.Errorf("Get(%q, %q) = %q, want a refusal", tc.conn, tc.key, s.Reveal())
			continue
		}
		if strings.Contains(err.Error(), "outside-value") {
			t.Errorf("the error holds the value: %v", err)
		}
	}
	if s, err := st.Get(ctx, "billing", "inside"); err != nil || s.Reveal() != "shared-token" {
		t.Fatalf("a link inside the directory: %q, %v", s.Reveal(), err)
	}
	big := strings.Repeat("x", MaxFileSize+1)
	write(t, filepath.Join(dir, "billing", "big"), big)
	if _, err := st.Get(ctx, "billing", "big"); err == nil {
		t.Fatal("an oversized file is read")
	}
}

func TestChain(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "billing", "api_key"), "from-file")
	d, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	env := NewEnv(func(k string) (string, bool) {
		m := map[string]string{"TOOLSVC_SECRET_BILLING_API_KEY": "from-env", "TOOLSVC_SECRET_BILLING_OTHER": "env-only"}
		v, ok := m[k]
		return v, ok
	})
	st := Chain(d, env)
	ctx := context.Background()
	if s, _ := st.Get(ctx, "billing", "api_key"); s.Reveal() != "from-file" {
		t.Fatalf("the first store does not win: %q", s.Reveal())
	}
	if s, _ := st.Get(ctx, "billing", "other"); s.Reveal() != "env-only" {
		t.Fatalf("no fallback: %q", s.Reveal())
	}
	_, err = st.Get(ctx, "billing", "none")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), filepath.Join(dir, "billing", "none")) ||
		!strings.Contains(err.Error(), "TOOLSVC_SECRET_BILLING_NONE") {
		t.Fatalf("missing everywhere: %v", err)
	}
	// An unreadable secret is not papered over by another store.
	write(t, filepath.Join(dir, "billing", "other"), strings.Repeat("x", MaxFileSize+1))
	if _, err := st.Get(ctx, "billing", "other"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("an unreadable file falls back: %v", err)
	}
}

func TestValueResolve(t *testing.T) {
	st := NewEnv(func(k string) (string, bool) { return "tok", k == "TOOLSVC_SECRET_C_K" })
	ctx := context.Background()
	v := Value{Secret: &Ref{Key: "k", Prefix: "Bearer "}}
	s, err := v.Resolve(ctx, st, "c")
	if err != nil || s.Reveal() != "Bearer tok" {
		t.Fatalf("Resolve = %q, %v", s.Reveal(), err)
	}
	if v.Redacted() != "Bearer "+Redacted || (Value{Literal: "x"}).Redacted() != "x" {
		t.Fatal("Redacted")
	}
	if _, err := (Value{Secret: &Ref{Key: "k"}}).Resolve(ctx, nil, "c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no store: %v", err)
	}
}
