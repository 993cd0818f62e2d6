//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cagebox/cagebox/agentproto"
)

// vsockPort is a port for these tests, away from the agent's own 1024.
func vsockPort() uint32 { return 40000 + uint32(os.Getpid()%20000) }

func requireVsock(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Skipf("AF_VSOCK is not available here: %v", err)
	}
	unix.Close(fd)
}

// vsockLoopback reports whether this kernel can connect to its own vsock
// ports (CID 1): that takes the vsock_loopback transport. Without it a
// connection to CID 1 would go to the hypervisor, if any.
func vsockLoopback() bool {
	if _, err := os.Stat("/sys/module/vsock_loopback"); err == nil {
		return true
	}
	b, err := os.ReadFile("/proc/kallsyms")
	return err == nil && bytes.Contains(b, []byte("vsock_loopback"))
}

// startVsock holds the port before it returns (listen runs here, not in
// the goroutine), so a test never races the listener for its own port.
func startVsock(t *testing.T, port uint32) (cancel func() error) {
	t.Helper()
	srv := &agentproto.Server{Token: testToken, BaseEnv: agentproto.DefaultEnv, Logger: slog.New(slog.DiscardHandler)}
	v := vsockListener(port)
	ln, err := v.listen()
	if err != nil {
		t.Fatalf("vsock listen: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.acceptLoop(ctx, ln, srv, slog.New(slog.DiscardHandler)) }()
	return func() error {
		stop()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			return errors.New("vsock listener did not stop with its context")
		}
	}
}

// bindVsock reports what binding port (any CID) on a fresh socket gives.
func bindVsock(t *testing.T, port uint32) error {
	t.Helper()
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	return unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port})
}

// TestVsockListenerStops: the listener holds its port while it serves,
// ends when its context does, and lets the port go (this works without a
// loopback transport).
func TestVsockListenerStops(t *testing.T) {
	requireVsock(t)
	port := vsockPort()
	stop := startVsock(t, port)
	if err := bindVsock(t, port); !errors.Is(err, unix.EADDRINUSE) {
		stop()
		t.Fatalf("the listener does not hold vsock port %d (a second bind gave %v, want EADDRINUSE)", port, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := bindVsock(t, port); err != nil {
		t.Fatalf("vsock port %d is still held after the listener stopped: %v", port, err)
	}
}

// TestVsockListenerServes connects to the listener over vsock loopback
// and runs an exec through the agent protocol.
func TestVsockListenerServes(t *testing.T) {
	requireVsock(t)
	if !vsockLoopback() {
		t.Skip("no vsock loopback transport here (the vsock_loopback module): a connection to this host's own vsock port cannot be made")
	}
	port := vsockPort() + 1
	stop := startVsock(t, port)
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	var conn fileConn
	deadline := time.Now().Add(5 * time.Second)
	for {
		fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		tv := unix.NsecToTimeval(int64(time.Second))
		_ = unix.SetsockoptTimeval(fd, unix.AF_VSOCK, unix.SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv)
		err = unix.Connect(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_LOCAL, Port: port})
		if err == nil {
			unix.SetNonblock(fd, true)
			conn = fileConn{os.NewFile(uintptr(fd), "vsock")}
			break
		}
		unix.Close(fd)
		if time.Now().After(deadline) {
			t.Fatalf("connect to vsock 1:%d: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx := ctxT(t)
	c, err := agentproto.NewClient(ctx, conn, testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if res, out := run1(t, c, &agentproto.ExecRequest{Argv: []string{"echo", "over vsock"}}); res.ExitCode != 0 || strings.TrimSpace(out) != "over vsock" {
		t.Fatalf("%+v %q", res, out)
	}
}
