//go:build unix

package mcp

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup starts the server as the leader of a new process group,
// so that whatever it spawns (npx starts node, uvx starts python) can be
// stopped with it, and a signal to toolsvc's terminal does not reach it
// before toolsvc has closed it.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killProcessGroup stops what is left of the server's process group.
func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
