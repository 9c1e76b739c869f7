package cli

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time:
// go build -ldflags "-X github.com/toolsvc/toolsvc/internal/cli.version=v1.2.3".
// Without it the module version or VCS revision from the build info is used.
var version = ""

func newVersionCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this build",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(stdout, "toolsvc %s\n", buildVersion())
			return err
		},
	}
}

// buildVersion is the ldflags version, else what the Go toolchain recorded.
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, modified, goVersion string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "-dirty"
			}
		}
	}
	goVersion = info.GoVersion
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v += " (" + rev + modified + ")"
	}
	return v + " " + goVersion
}
