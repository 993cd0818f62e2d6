package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/cagebox/cagebox/client"
)

// runExecTTY runs argv on a terminal in the sandbox, with the local terminal
// in raw mode: every key (Ctrl-C included) goes to the sandbox, a window
// resize follows, and the command's exit code becomes the CLI's.
func runExecTTY(ctx context.Context, c *client.Client, id string, argv, env []string, cwd, user, timeout string) error {
	inFd := int(os.Stdin.Fd())
	if !term.IsTerminal(inFd) {
		return &exitError{code: 125, msg: "-t: stdin is not a terminal (run from a terminal, or drop -t to pipe input with -i)"}
	}
	sizeFd := inFd
	if term.IsTerminal(int(os.Stdout.Fd())) {
		sizeFd = int(os.Stdout.Fd())
	}
	cols, rows, err := term.GetSize(sizeFd)
	if err != nil || rows < 1 || cols < 1 {
		rows, cols = 24, 80
	}
	ctx, cancel := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer cancel()
	p, err := c.Pty(ctx, id, client.PtyOptions{Argv: argv, Env: env, Cwd: cwd, User: user, Timeout: timeout, Rows: rows, Cols: cols})
	if err != nil {
		return &exitError{code: 125, msg: err.Error()}
	}
	defer p.Close()

	old, err := term.MakeRaw(inFd)
	if err != nil {
		return &exitError{code: 125, msg: fmt.Sprintf("-t: put the terminal in raw mode: %v", err)}
	}
	// Restored on every way out: a return (also after SIGINT, SIGTERM or
	// SIGHUP, which cancel ctx) runs this before main exits.
	defer term.Restore(inFd, old)

	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for {
			select {
			case <-p.Done():
				return
			case <-winch:
				if cols, rows, err := term.GetSize(sizeFd); err == nil {
					_ = p.Resize(rows, cols)
				}
			}
		}
	}()
	// Keys to the sandbox. The goroutine may stay blocked in Read after
	// the command ends; the process exits then.
	go func() { _, _ = io.Copy(p, os.Stdin) }()
	outDone := make(chan struct{})
	go func() {
		defer close(outDone)
		_, _ = io.Copy(os.Stdout, p)
	}()

	res, err := p.Wait(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: 130, msg: "interrupted"}
		}
		return &exitError{code: 125, msg: err.Error()}
	}
	<-outDone
	term.Restore(inFd, old)
	code := 0
	if res.ExitCode != nil {
		code = *res.ExitCode
	}
	msg := ""
	switch {
	case code == 127 && res.Error != "":
		msg = fmt.Sprintf("%s: command not found in the sandbox (%s)", argvName(argv), res.Error)
	case res.Error != "":
		msg = res.Error
	case res.OOMKilled:
		msg = "the command was killed for exceeding the sandbox's memory limit (raise --memory)"
	case res.TimedOut:
		msg = "the command timed out and was killed"
	}
	if code == 0 && msg == "" {
		return nil
	}
	return &exitError{code: code, msg: msg}
}

func argvName(argv []string) string {
	if len(argv) == 0 {
		return "the login shell"
	}
	return argv[0]
}
