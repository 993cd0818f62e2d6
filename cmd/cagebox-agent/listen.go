package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cagebox/cagebox/agentproto"
)

// listener is where the host's connections come from.
type listener interface {
	// serve serves connections until ctx is done or it fails. It returns
	// nil if there will be no more connections (a one-shot fd).
	serve(ctx context.Context, srv *agentproto.Server, log *slog.Logger) error
}

// parseListen understands unix:PATH, fd:N, dev:PATH and vsock:PORT.
func parseListen(spec string) (listener, error) {
	scheme, arg, ok := strings.Cut(spec, ":")
	if !ok || arg == "" {
		return nil, fmt.Errorf("%q: want unix:PATH, fd:N, dev:PATH or vsock:PORT", spec)
	}
	switch scheme {
	case "unix":
		return unixListener(arg), nil
	case "fd":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 3 {
			return nil, fmt.Errorf("%q: bad file descriptor", spec)
		}
		return fdListener(n), nil
	case "dev":
		return devListener(arg), nil
	case "vsock":
		port, err := strconv.ParseUint(arg, 10, 32)
		if err != nil || port == 1<<32-1 { // VMADDR_PORT_ANY is no port to be found at
			return nil, fmt.Errorf("%q: bad vsock port", spec)
		}
		return vsockListener(port), nil
	}
	return nil, fmt.Errorf("%q: unknown scheme %q", spec, scheme)
}

// unixListener listens on a unix socket (bind-mounted out of a container)
// and serves every connection.
type unixListener string

func (u unixListener) serve(ctx context.Context, srv *agentproto.Server, log *slog.Logger) error {
	path := string(u)
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path) // stale socket from an earlier run
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	return acceptLoop(ctx, ln, srv, log)
}

func acceptLoop(ctx context.Context, ln net.Listener, srv *agentproto.Server, log *slog.Logger) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer ln.Close()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		go serveConn(srv, conn, log)
	}
}

func serveConn(srv *agentproto.Server, conn net.Conn, log *slog.Logger) {
	log.Debug("connection", "remote", conn.RemoteAddr())
	if err := srv.ServeConn(conn); err != nil {
		if errors.Is(err, io.EOF) {
			// A device with no host at the other end (a virtio-serial
			// port) reads EOF at once, again and again until the host
			// connects.
			log.Debug("connection ended", "err", err)
			return
		}
		log.Warn("connection ended", "err", err)
	}
}

// fdListener uses an inherited file descriptor: a listening socket (serve
// every connection), a connected socket (serve it once) or a character
// device (serve it again and again).
type fdListener int

func (n fdListener) serve(ctx context.Context, srv *agentproto.Server, log *slog.Logger) error {
	f := os.NewFile(uintptr(n), "fd:"+strconv.Itoa(int(n)))
	if f == nil {
		return fmt.Errorf("fd %d is not open", n)
	}
	listening, err := syscall.GetsockoptInt(int(n), syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
	if err == nil && listening == 1 {
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return err
		}
		return acceptLoop(ctx, ln, srv, log)
	}
	if conn, err := net.FileConn(f); err == nil {
		f.Close()
		serveConn(srv, conn, log)
		return nil
	}
	if err := syscall.SetNonblock(int(n), true); err != nil {
		return err
	}
	for ctx.Err() == nil {
		// Each connection gets a duplicate, which ServeConn closes.
		dup, err := syscall.Dup(int(n))
		if err != nil {
			return err
		}
		syscall.CloseOnExec(dup)
		conn := fileConn{os.NewFile(uintptr(dup), f.Name())}
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		serveLoopConn(ctx, srv, conn, log)
		stop()
	}
	return nil
}

// serveLoopConn serves one connection of a device that is served again and
// again, pausing a little after a connection that ended at once so that a
// device reading EOF does not make the agent spin.
func serveLoopConn(ctx context.Context, srv *agentproto.Server, conn net.Conn, log *slog.Logger) {
	start := time.Now()
	serveConn(srv, conn, log)
	if time.Since(start) < time.Second {
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// devListener serves a character device such as a virtio-serial port,
// reopening it after each connection ends.
type devListener string

func (d devListener) serve(ctx context.Context, srv *agentproto.Server, log *slog.Logger) error {
	for ctx.Err() == nil {
		f, err := os.OpenFile(string(d), os.O_RDWR|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		if err != nil {
			log.Warn("open device", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		stop := context.AfterFunc(ctx, func() { f.Close() })
		serveLoopConn(ctx, srv, fileConn{f}, log)
		stop()
	}
	return nil
}

// fileConn makes a (pollable) file a net.Conn.
type fileConn struct{ *os.File }

type fileAddr string

func (a fileAddr) Network() string { return "file" }
func (a fileAddr) String() string  { return string(a) }

func (c fileConn) LocalAddr() net.Addr  { return fileAddr(c.Name()) }
func (c fileConn) RemoteAddr() net.Addr { return fileAddr(c.Name()) }

var _ net.Conn = fileConn{}
