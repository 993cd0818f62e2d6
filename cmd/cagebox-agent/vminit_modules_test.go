//go:build linux

package main

import (
	"testing"

	"github.com/cagebox/cagebox/agentproto"
)

func TestUnneededModules(t *testing.T) {
	serialNoNet := unneededModules(map[string]string{agentproto.VMParamAgent: "serial:cagebox.agent"})
	vsockNet := unneededModules(map[string]string{agentproto.VMParamAgent: "vsock:1024", agentproto.VMParamAddr: "10.0.0.2/30"})
	for _, c := range []struct {
		file            string
		serial, vsockOK bool // skipped with serial and no net; skipped with vsock and net
	}{
		{"03-vsock.ko", true, false},
		{"04-vmw_vsock_virtio_transport_common.ko", true, false},
		{"10-virtio_net.ko", true, false},
		{"09-net_failover.ko", true, false},
		{"08-failover.ko", true, false},
		{"01-virtio_mmio.ko", false, false},
		{"05-ext4.ko", false, false},
		{"06-virtio_console.ko", false, false},
	} {
		if got := serialNoNet(c.file); got != c.serial {
			t.Errorf("serial, no network: skip %s = %v", c.file, got)
		}
		if got := vsockNet(c.file); got != c.vsockOK {
			t.Errorf("vsock + network: skip %s = %v", c.file, got)
		}
	}
}
