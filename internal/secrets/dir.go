package secrets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// MaxFileSize bounds a secret file: a credential, a key or a certificate,
// never a data set.
const MaxFileSize = 64 << 10

// Dir reads secrets from a directory of files: DIR/<connector>/<key>, one
// file per key, the way Kubernetes mounts a Secret as a volume (mount each
// connector's Secret at DIR/<connector>). Every Get reads the file afresh,
// so a rotated secret is used from the next call on, including Kubernetes'
// atomic update, which swaps the "..data" symlink to a new directory of
// files. One trailing newline ("\n" or "\r\n") is dropped, as `echo` leaves
// one.
//
// Files are opened through os.Root: a path, a ".." or a symlink (the secret
// file, or its connector's directory) that leads outside DIR is refused, and
// so is anything that is not a regular file of at most MaxFileSize bytes.
type Dir struct {
	root string
}

// NewDir returns a directory store rooted at dir, which must exist.
func NewDir(dir string) (*Dir, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("secrets directory %q: %w", dir, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("secrets directory: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("secrets directory %s is not a directory", abs)
	}
	return &Dir{root: abs}, nil
}

// Path is where the store looks for key of connectorID.
func (d *Dir) Path(connectorID, key string) string {
	return filepath.Join(d.root, connectorID, key)
}

// Get implements Store.
func (d *Dir) Get(ctx context.Context, connectorID, key string) (Secret, error) {
	if err := CheckKey(key); err != nil {
		return Secret{}, err
	}
	if err := checkDirName(connectorID); err != nil {
		return Secret{}, err
	}
	where := "file " + d.Path(connectorID, key)
	// The root is opened per Get: if DIR itself is replaced (a new mount),
	// the next Get sees the new one.
	root, err := os.OpenRoot(d.root)
	if err != nil {
		return Secret{}, fmt.Errorf("connector %q: secret %q: secrets directory: %w", connectorID, key, err)
	}
	defer root.Close()
	f, err := root.Open(connectorID + "/" + key)
	if errors.Is(err, fs.ErrNotExist) {
		return Secret{}, Missing(connectorID, key, where)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("connector %q: secret %q: cannot open %s: %s", connectorID, key, where, why(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Secret{}, fmt.Errorf("connector %q: secret %q: %s: %w", connectorID, key, where, err)
	}
	if !st.Mode().IsRegular() {
		return Secret{}, fmt.Errorf("connector %q: secret %q: %s is not a regular file", connectorID, key, where)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return Secret{}, fmt.Errorf("connector %q: secret %q: read %s: %w", connectorID, key, where, err)
	}
	if len(b) > MaxFileSize {
		return Secret{}, fmt.Errorf("connector %q: secret %q: %s is larger than %d bytes", connectorID, key, where, MaxFileSize)
	}
	v := string(b)
	v = strings.TrimSuffix(v, "\n")
	v = strings.TrimSuffix(v, "\r")
	if v == "" {
		return Secret{}, Missing(connectorID, key, where+" (empty)")
	}
	return New(v), nil
}

// why words an open error without the path (the caller names it).
func why(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		if pe.Err.Error() == "path escapes from parent" {
			return "it leads outside the secrets directory"
		}
		return pe.Err.Error()
	}
	return err.Error()
}

// checkDirName refuses a connector id that is not a plain directory name.
// Connector ids are tool names (^[a-z0-9_-]{1,64}$); the check only keeps
// the store safe on its own.
func checkDirName(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("connector id %q cannot name a secrets directory", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("connector id %q cannot name a secrets directory", id)
		}
	}
	return nil
}

// Chain looks a secret up in each store in turn and returns the first value
// found. A store's failure other than a missing secret ends the lookup: an
// unreadable file is not a reason to fall back to another value. When no
// store has the secret, the error lists everywhere they looked.
func Chain(stores ...Store) Store { return chain(stores) }

type chain []Store

func (c chain) Get(ctx context.Context, connectorID, key string) (Secret, error) {
	var looked []string
	for _, st := range c {
		s, err := st.Get(ctx, connectorID, key)
		if err == nil {
			return s, nil
		}
		var me *NotSetError
		if !errors.As(err, &me) {
			return Secret{}, err
		}
		looked = append(looked, me.Looked...)
	}
	return Secret{}, Missing(connectorID, key, looked...)
}
