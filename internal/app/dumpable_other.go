//go:build !linux

package app

import "errors"

// NotDumpable is a no-op where prctl does not exist: run toolsvc and its
// stdio servers as different users there (docs/connectors.md#threat-model).
func NotDumpable() error {
	return errors.New("not supported on this system: run stdio MCP servers as another user")
}

// Dumpable reports true: nothing made the process non-dumpable.
func Dumpable() (bool, error) { return true, nil }
