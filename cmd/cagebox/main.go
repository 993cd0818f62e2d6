// Command cagebox is the CLI and the daemon (`cagebox daemon`).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/client"
)

// exitError carries a process exit code out of a command.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(os.Stderr, "cagebox:", ee.msg)
		}
		os.Exit(ee.code)
	}
	fmt.Fprintln(os.Stderr, "cagebox:", err)
	os.Exit(1)
}

type globals struct {
	home   string
	host   string
	caCert string
	apiKey string
	// tcp is the client of --host, made before any command runs.
	tcp *client.Client
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "cagebox",
		Short:         "Run untrusted code in sandboxes whose credentials never enter the guest",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	home := os.Getenv("CAGEBOX_HOME")
	if home == "" {
		home = "/var/lib/cagebox"
	}
	root.PersistentFlags().StringVar(&g.home, "home", home, "state directory (env CAGEBOX_HOME)")
	root.PersistentFlags().StringVar(&g.host, "host", os.Getenv("CAGEBOX_HOST"), "daemon URL over TCP, e.g. https://cagebox.example.com:7070 or http://127.0.0.1:7070 (env CAGEBOX_HOST; default: the unix socket)")
	root.PersistentFlags().StringVar(&g.caCert, "ca-cert", os.Getenv("CAGEBOX_CA_CERT"), "CA certificate (PEM) trusted besides the system roots to verify an https:// --host (env CAGEBOX_CA_CERT)")
	g.apiKey = os.Getenv("CAGEBOX_API_KEY")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if g.host == "" || cmd.Name() == "daemon" || cmd.Name() == "node" || cmd.Name() == "controller" {
			return nil
		}
		c, err := client.NewTCP(g.host, g.apiKey, client.Options{CACertFile: g.caCert})
		if err != nil {
			return fmt.Errorf("--host: %w", err)
		}
		g.tcp = c
		return nil
	}
	root.AddCommand(
		runCmd(g),
		createCmd(g),
		execCmd(g),
		cpCmd(g),
		lsCmd(g),
		inspectCmd(g),
		stopCmd(g),
		rmCmd(g),
		pauseCmd(g),
		resumeCmd(g),
		runtimesCmd(g),
		imageCmd(g),
		eventsCmd(g),
		tenantCmd(g),
		poolCmd(g),
		toolCmd(g),
		volumeCmd(g),
		snapshotCmd(g),
		forkCmd(g),
		executeCmd(g),
		secretCmd(g),
		policyCmd(g),
		approvalsCmd(g),
		freezeCmd(g, true),
		freezeCmd(g, false),
		selftestCmd(g),
		consoleCmd(g),
		portCmd(g),
		webhookCmd(g),
		relayCmd(g),
	)
	root.AddCommand(hostCommands(g)...)
	return root
}

// version is the module's version and the commit it was built from, as
// the Go toolchain recorded them (go version -m shows the same).
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " (" + rev + dirty + ")"
	}
	return v
}
