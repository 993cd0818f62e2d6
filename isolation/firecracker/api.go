package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"

	sdk "github.com/firecracker-microvm/firecracker-go-sdk"
	fcclient "github.com/firecracker-microvm/firecracker-go-sdk/client"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/operations"
	httptransport "github.com/go-openapi/runtime/client"
	"github.com/go-openapi/strfmt"
	"golang.org/x/sys/unix"
)

// dialJailed connects to a unix socket that the jailed VMM made in its
// jail. The jail's root directory belongs to the VMM's uid, so the last
// path component is the VMM's to replace: it is opened with O_PATH and
// O_NOFOLLOW, checked to be a socket, and connected to through
// /proc/self/fd. A VMM that swapped its socket for a symlink to some other
// host socket (the daemon's API, another sandbox's vsock) gets an error,
// not a connection carrying this sandbox's agent token. The short
// /proc/self/fd path also lifts the 108-byte limit on socket paths, which
// a deep $CAGEBOX_HOME would otherwise hit.
func dialJailed(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s is not a socket (mode %#o): refusing to connect", path, st.Mode)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
	return c, nil
}

// newAPIClient is firecracker-go-sdk's client for the API socket at path,
// with a transport that dials through dialJailed and honours the request
// context (the SDK's own unix transport ignores both).
func newAPIClient(path string) *sdk.Client {
	tr := httptransport.New(fcclient.DefaultHost, fcclient.DefaultBasePath, fcclient.DefaultSchemes)
	tr.Transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialJailed(ctx, path)
		},
		// One VMM, a handful of calls: no idle connections to leak.
		DisableKeepAlives: true,
	}
	ops := operations.New(tr, strfmt.Default)
	return sdk.NewClient(path, nil, false, sdk.WithOpsClient(ops))
}

// apiError makes an API failure readable: Firecracker's fault_message
// when it sent one (the generated error types print a pointer otherwise).
func apiError(what string, err error) error {
	var fault interface{ GetPayload() *models.Error }
	if errors.As(err, &fault) {
		if p := fault.GetPayload(); p != nil && p.FaultMessage != "" {
			return fmt.Errorf("firecracker API: %s: %s", what, p.FaultMessage)
		}
	}
	return fmt.Errorf("firecracker API: %s: %w", what, err)
}

// configure sends cfg to a freshly started Firecracker and boots the VM:
// machine, boot source, drives, network interfaces, vsock, InstanceStart.
func configure(ctx context.Context, c *sdk.Client, cfg *vmConfig) error {
	type step struct {
		what string
		do   func() error
	}
	steps := []step{
		{"machine config", func() error { _, err := c.PutMachineConfiguration(ctx, &cfg.Machine); return err }},
		{"boot source", func() error { _, err := c.PutGuestBootSource(ctx, &cfg.Boot); return err }},
	}
	for i := range cfg.Drives {
		d := &cfg.Drives[i]
		steps = append(steps, step{"drive " + *d.DriveID, func() error { _, err := c.PutGuestDriveByID(ctx, *d.DriveID, d); return err }})
	}
	for i := range cfg.Net {
		n := &cfg.Net[i]
		steps = append(steps, step{"network interface " + *n.IfaceID, func() error {
			_, err := c.PutGuestNetworkInterfaceByID(ctx, *n.IfaceID, n)
			return err
		}})
	}
	steps = append(steps,
		step{"vsock", func() error { _, err := c.PutGuestVsock(ctx, &cfg.Vsock); return err }},
		step{"start the instance", func() error {
			_, err := c.CreateSyncAction(ctx, &models.InstanceActionInfo{ActionType: sdk.String(models.InstanceActionInfoActionTypeInstanceStart)})
			return err
		}},
	)
	for _, st := range steps {
		if err := st.do(); err != nil {
			return apiError(st.what, err)
		}
	}
	return nil
}
