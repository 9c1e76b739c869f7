package cli

import (
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/config"
)

func newServeCommand(stderr io.Writer, lookupEnv env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gRPC server (and the MCP front door with --mcp-listen)",
		Long: `Run the gRPC server until SIGINT or SIGTERM, then drain in-flight calls
(bounded by shutdown_timeout) and stop.

Without configuration it uses the in-memory store, listens on 127.0.0.1:50051
and registers the demo tools. With --database-url it uses Postgres; the schema
must be up to date (toolsvc migrate up, or --migrate).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			file, err := cmd.Flags().GetString(config.FlagConfig)
			if err != nil {
				return err
			}
			cfg, err := config.Load(config.Sources{File: file, Env: lookupEnv, Flags: cmd.Flags()})
			if err != nil {
				return err
			}
			log, err := app.NewLogger(cfg.Log, stderr)
			if err != nil {
				return usage(err)
			}
			// Before anything reads a secret or starts a stdio server:
			// children of the same user may not read this process's
			// environment or memory.
			if err := app.NotDumpable(); err != nil {
				log.Warn("could not make the process non-dumpable; stdio MCP servers running as this user can read its environment", "error", err.Error())
			}
			// Before any stdio MCP server is started: an address another
			// process holds fails now, not after the children ran.
			if err := app.CheckAddresses(cfg); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()

			a, err := app.New(ctx, cfg, app.Options{
				Logger: log, Version: buildVersion(), ExtraProviders: buildOf(cmd.Context()).Providers,
			})
			if err != nil {
				return err
			}
			lis, err := a.Listen()
			if err != nil {
				a.Close()
				return err
			}
			if err := a.Serve(ctx, lis); err != nil {
				return fmt.Errorf("serve: %w", err)
			}
			return nil
		},
	}
	config.RegisterFlags(cmd.Flags())
	return cmd
}
