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

// A template has a NIC but no address until its claim: the init loads the
// NIC's driver all the same.
func TestUnneededModulesTemplateNIC(t *testing.T) {
	nic := unneededModules(map[string]string{agentproto.VMParamAgent: "serial:cagebox.agent", agentproto.VMParamNIC: ""})
	for _, f := range []string{"10-virtio_net.ko", "09-net_failover.ko", "08-failover.ko"} {
		if nic(f) {
			t.Errorf("template with a NIC skips %s", f)
		}
	}
	if !nic("03-vsock.ko") {
		t.Error("template on virtio-serial loads vsock")
	}
}
