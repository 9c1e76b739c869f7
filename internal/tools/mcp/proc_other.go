//go:build !unix

package mcp

import "os/exec"

// ownProcessGroup is a no-op where process groups do not exist.
func ownProcessGroup(*exec.Cmd) {}

// killProcessGroup stops the server process itself.
func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}
