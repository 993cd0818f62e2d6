//go:build lite

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
)

// The exec of cagebox-server is made from the process's main thread: an
// exec from another thread leaves the thread-group leader a zombie in
// /proc for a moment, which a supervisor reading /proc/PID/stat would take
// for the daemon's death. cobra runs commands on main's goroutine.
func init() { runtime.LockOSThread() }

// hostCommands are stand-ins that hand the command to cagebox-server.
func hostCommands(*globals) []*cobra.Command {
	return []*cobra.Command{serverCmd(docDaemon), serverCmd(docNode), serverCmd(docController), serverCmd(docMCP)}
}

func imageHostCmds(*globals) []*cobra.Command {
	return []*cobra.Command{serverCmd(docImageBuild), serverCmd(docImageLs), serverCmd(docImageRm)}
}

// serverCmd runs as cagebox-server with this process's arguments; its
// flags and help are the server's (`cagebox daemon --help` shows them).
func serverCmd(d cmdDoc) *cobra.Command {
	return &cobra.Command{
		Use:                d.use,
		Short:              d.short,
		DisableFlagParsing: true,
		RunE:               func(*cobra.Command, []string) error { return execServer() },
	}
}

// localRuntimes needs the runtimes' own probes: the server answers.
func localRuntimes(string) []api.Runtime {
	err := execServer()
	fmt.Fprintln(os.Stderr, "cagebox:", err)
	os.Exit(125)
	return nil
}

func rotateMasterKey(context.Context, string, string) (string, int, error) {
	return "", 0, execServer()
}

func daemonExecutable() (string, error) { return serverPath() }

// serverPath finds cagebox-server: beside this executable, else on $PATH.
func serverPath() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), serverName)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(serverName)
	if err != nil {
		return "", &exitError{code: 125, msg: fmt.Sprintf("this command runs in %s, which is neither beside this cagebox nor on $PATH: install both binaries (make build puts them in bin/)", serverName)}
	}
	return p, nil
}

// execServer replaces this process with cagebox-server and the same
// arguments: same pid, signals and exit status, as if it were one binary.
func execServer() error {
	p, err := serverPath()
	if err != nil {
		return err
	}
	err = syscall.Exec(p, append([]string{p}, os.Args[1:]...), os.Environ())
	return &exitError{code: 125, msg: fmt.Sprintf("exec %s: %v", p, err)}
}
