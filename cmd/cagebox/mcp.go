//go:build !lite

package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/internal/mcpserver"
)

func mcpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   docMCP.use,
		Short: docMCP.short,
		Long: `cagebox mcp speaks MCP on stdin/stdout for a client that starts it (an agent's
MCP configuration: command "cagebox", args ["mcp"]). It reaches the daemon like every
other command (the unix socket as the admin, or --host/CAGEBOX_HOST with an API key) and
offers each registered tool (cagebox tool add) as an MCP tool, plus sandbox_create,
sandbox_exec, sandbox_read_file, sandbox_write_file, sandbox_list_files, sandbox_list,
sandbox_remove and request_access. Logs go to stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			b := mcpserver.ClientBackend{C: g.client()}
			if _, err := b.C.Health(cmd.Context()); err != nil {
				return fmt.Errorf("no daemon answers: %w (start one: cagebox daemon)", err)
			}
			srv, err := mcpserver.New(cmd.Context(), b, log)
			if err != nil {
				return err
			}
			return srv.Run(cmd.Context(), &mcp.StdioTransport{})
		},
	}
}
