//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
)

// vsockListener listens on an AF_VSOCK port (any CID) and serves every
// connection: the agent's transport in Firecracker guests.
type vsockListener uint64

func (v vsockListener) serve(ctx context.Context, srv *agentproto.Server, log *slog.Logger) error {
	ln, err := v.listen()
	if err != nil {
		return err
	}
	return v.acceptLoop(ctx, ln, srv, log)
}

// listen binds and listens on the port: once it returns, the port is held.
func (v vsockListener) listen() (*os.File, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: uint32(v)}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock bind port %d: %w", v, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock listen: %w", err)
	}
	// A non-blocking file joins the runtime's poller, so Accept waits
	// without a thread and Close (on ctx) ends it.
	return os.NewFile(uintptr(fd), fmt.Sprintf("vsock:%d", v)), nil
}

// acceptLoop serves every connection on ln until ctx ends; it closes ln.
func (v vsockListener) acceptLoop(ctx context.Context, ln *os.File, srv *agentproto.Server, log *slog.Logger) error {
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	rc, err := ln.SyscallConn()
	if err != nil {
		return err
	}
	for {
		var nfd int
		var aerr error
		err := rc.Read(func(fd uintptr) bool {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			return !errors.Is(aerr, unix.EAGAIN)
		})
		if err == nil {
			err = aerr
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, unix.ECONNABORTED) || errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("vsock accept: %w", err)
		}
		go serveConn(srv, fileConn{os.NewFile(uintptr(nfd), "vsock")}, log)
	}
}
