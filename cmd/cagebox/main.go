// Command cagebox is the CLI and the daemon (`cagebox daemon`).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
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
	apiKey string
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "cagebox",
		Short:         "Run untrusted code in sandboxes whose credentials never enter the guest",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	home := os.Getenv("CAGEBOX_HOME")
	if home == "" {
		home = "/var/lib/cagebox"
	}
	root.PersistentFlags().StringVar(&g.home, "home", home, "state directory (env CAGEBOX_HOME)")
	root.PersistentFlags().StringVar(&g.host, "host", os.Getenv("CAGEBOX_HOST"), "daemon URL over TCP, e.g. http://10.0.0.5:7070 (env CAGEBOX_HOST; default: the unix socket)")
	g.apiKey = os.Getenv("CAGEBOX_API_KEY")
	root.AddCommand(
		daemonCmd(g),
		runCmd(g),
		createCmd(g),
		execCmd(g),
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
		secretCmd(g),
	)
	return root
}
