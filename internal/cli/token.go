package cli

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/toolsvc/toolsvc/internal/auth"
)

// newTokenCommand makes bearer tokens and their hashes. It talks to no
// server: the configuration holds the hash, the principal keeps the token.
func newTokenCommand(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Make bearer tokens and the hashes the configuration holds",
		Long: `A principal authenticates with a bearer token; the server's configuration
holds only its SHA-256 (principals[].token_sha256), so the configuration
never holds a secret. "token new" prints a fresh token and its hash; give
the token to the principal (it is not stored anywhere) and put the hash in
the configuration. To revoke a token, remove its hash and restart.`,
		Args: noArgs,
		RunE: showHelp,
	}
	var output string
	newCmd := &cobra.Command{
		Use:   "new",
		Short: "Print a fresh random token and its SHA-256",
		Example: `  toolsvc token new
  toolsvc token new -o json | jq -r .token > agent-1.token`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			if output != outputTable && output != outputJSON {
				return usage(fmt.Errorf("--output must be table or json, not %q", output))
			}
			tok, h, err := auth.NewToken(rand.Reader)
			if err != nil {
				return err
			}
			if output == outputJSON {
				b, _ := json.Marshal(map[string]string{"token": tok, "token_sha256": h.String()})
				_, err := fmt.Fprintf(stdout, "%s\n", b)
				return err
			}
			fmt.Fprintf(stdout, "token:         %s\ntoken_sha256:  %s\n", tok, h)
			fmt.Fprintf(stderr, "\nGive the token to the principal (it is shown only now); put the hash in the\nconfiguration, quoted:\n  principals:\n    - id: ...\n      token_sha256: %q\n", h.String())
			return nil
		},
	}
	newCmd.Flags().StringVarP(&output, flagOutput, "o", outputTable, "output format: table or json")

	hash := &cobra.Command{
		Use:     "hash",
		Short:   "Print the SHA-256 of a token read from standard input",
		Example: `  toolsvc token hash < agent-1.token`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			line, err := bufio.NewReader(io.LimitReader(cmd.InOrStdin(), 4096)).ReadString('\n')
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			tok := strings.TrimSpace(line)
			if tok == "" || strings.ContainsAny(tok, " \t") {
				return usage(errors.New("want one token on the first line of standard input"))
			}
			_, err = fmt.Fprintln(stdout, auth.HashToken(tok))
			return err
		},
	}
	cmd.AddCommand(newCmd, hash)
	return cmd
}
