package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
)

func newMigrateCommand(stdout io.Writer, lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Manage the Postgres schema",
		Long: `Apply (up) or list (status) the database migrations embedded in this binary.
Concurrent runs are safe: an advisory lock lets one apply each migration.`,
		Args: noArgs,
		RunE: showHelp,
	}
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDatabase(cmd, lookupEnv, func(ctx context.Context, st *postgres.Store) error {
				applied, err := postgres.Migrate(ctx, st.Pool())
				if err != nil {
					return fmt.Errorf("migrate up: %w", err)
				}
				if len(applied) == 0 {
					fmt.Fprintln(stdout, "The database is up to date; nothing to apply.")
					return nil
				}
				for _, m := range applied {
					fmt.Fprintf(stdout, "applied %04d_%s\n", m.Version, m.Name)
				}
				return nil
			})
		},
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "List migrations, applied and pending",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDatabase(cmd, lookupEnv, func(ctx context.Context, st *postgres.Store) error {
				statuses, err := postgres.Status(ctx, st.Pool())
				if err != nil {
					return fmt.Errorf("migrate status: %w", err)
				}
				return printStatus(stdout, statuses)
			})
		},
	}
	for _, c := range []*cobra.Command{up, status} {
		config.DatabaseURLFlag(c.Flags())
	}
	cmd.AddCommand(up, status)
	return cmd
}

// migrateTimeout bounds a migrate command; migrations run under it too.
const migrateTimeout = 10 * time.Minute

// withDatabase opens the database named by --database-url or
// TOOLSVC_DATABASE_URL and runs fn on it.
func withDatabase(cmd *cobra.Command, lookupEnv env, fn func(context.Context, *postgres.Store) error) error {
	url, err := cmd.Flags().GetString(config.FlagDatabaseURL)
	if err != nil {
		return err
	}
	if url == "" {
		url, _ = lookupEnv(config.EnvPrefix + "_DATABASE_URL")
	}
	if url == "" {
		return usage(errors.New("--database-url (or TOOLSVC_DATABASE_URL) is required"))
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), migrateTimeout)
	defer cancel()
	st, err := postgres.Open(ctx, url)
	if err != nil {
		return err
	}
	defer st.Close()
	return fn(ctx, st)
}

func printStatus(w io.Writer, statuses []postgres.MigrationStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tNAME\tSTATUS\tAPPLIED AT")
	pending := 0
	for _, s := range statuses {
		state, at := "pending", "-"
		switch {
		case s.Unknown:
			state, at = "applied (unknown to this binary)", s.AppliedAt.UTC().Format(time.RFC3339)
		case s.Applied:
			state, at = "applied", s.AppliedAt.UTC().Format(time.RFC3339)
		default:
			pending++
		}
		fmt.Fprintf(tw, "%04d\t%s\t%s\t%s\n", s.Version, s.Name, state, at)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if pending > 0 {
		_, err := fmt.Fprintf(w, "%d migration(s) pending: run `toolsvc migrate up`.\n", pending)
		return err
	}
	_, err := fmt.Fprintln(w, "The database is up to date.")
	return err
}
