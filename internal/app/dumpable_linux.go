package app

import "golang.org/x/sys/unix"

// NotDumpable makes the process non-dumpable (prctl PR_SET_DUMPABLE 0):
// /proc/<pid>/environ, mem and the other files that hold its secrets
// become root's, and processes of the same user cannot ptrace it. A stdio
// MCP server toolsvc starts runs as toolsvc's user; without this it could
// read every TOOLSVC_SECRET_* variable from /proc/$PPID/environ
// (docs/connectors.md#threat-model). Call it at start, before any secret
// is read. It also turns off core dumps, which would hold them too.
func NotDumpable() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}

// Dumpable reports whether the process is dumpable (for the start log and
// tests).
func Dumpable() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	return v != 0, err
}
