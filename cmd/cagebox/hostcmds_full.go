//go:build !lite

package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/daemon"
	"github.com/cagebox/cagebox/isolation"
)

// hostCommands are the top-level host-side commands (hostcmds.go).
func hostCommands(g *globals) []*cobra.Command {
	return []*cobra.Command{daemonCmd(g), nodeCmd(g), controllerCmd(g), mcpCmd(g)}
}

// localRuntimes describes this host's runtimes when no daemon answers.
func localRuntimes(home string) []api.Runtime {
	daemon.RegisterRuntimes(home)
	def, _ := isolation.Pick("auto", isolation.Namespaces)
	return daemon.RuntimeList(isolation.Namespaces, def)
}

func rotateMasterKey(ctx context.Context, home, keyFile string) (string, int, error) {
	return daemon.RotateMasterKey(ctx, home, keyFile)
}

// daemonExecutable is what ensureDaemon starts as `daemon`: this binary.
func daemonExecutable() (string, error) { return os.Executable() }
