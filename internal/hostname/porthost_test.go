package hostname_test

import (
	"testing"

	"github.com/cagebox/cagebox/internal/hostname"
)

const testID = "sb-0123456789abcdef"

func TestParsePortHost(t *testing.T) {
	for _, tc := range []struct {
		host string
		ok   bool
		port uint16
	}{
		{"8080-" + testID + ".sb.test", true, 8080},
		{"8080-" + testID + ".SB.test:8443", true, 8080},
		{"8080-" + testID + ".sb.test.", true, 8080},
		{"1-" + testID + ".sb.test", true, 1},
		{"65535-" + testID + ".sb.test", true, 65535},
		{"65536-" + testID + ".sb.test", false, 0},
		{"0-" + testID + ".sb.test", false, 0},
		{"080-" + testID + ".sb.test", false, 0},
		{"-1-" + testID + ".sb.test", false, 0},
		{"+80-" + testID + ".sb.test", false, 0},
		{"8080-sb-0123.sb.test", false, 0},
		{"8080-sb-0123456789ABCDEF.sb.test", true, 8080}, // hosts are case-insensitive
		{"8080-sb-0123456789abcdeg.sb.test", false, 0},
		{"8080-sb-0123456789abcdef0.sb.test", false, 0},
		{"8080-sb-0123456789abcde\u212a.sb.test", false, 0}, // the Kelvin sign is not "k"
		{"8080-" + testID + ".evil.sb.test", false, 0},
		{"8080-" + testID + ".sb.test.evil", false, 0},
		{"8080-" + testID + "sb.test", false, 0},
		{"x.8080-" + testID + ".sb.test", false, 0},
		{"sb.test", false, 0},
		{".sb.test", false, 0},
		{"8080" + testID + ".sb.test", false, 0},
		{"", false, 0},
	} {
		port, id, ok := hostname.ParsePortHost(tc.host, "sb.test")
		if ok != tc.ok || (ok && (port != tc.port || id != testID)) {
			t.Errorf("ParsePortHost(%q) = %d %q %v, want ok=%v port %d", tc.host, port, id, ok, tc.ok, tc.port)
		}
	}
	if _, _, ok := hostname.ParsePortHost("8080-"+testID+".sb.test", ""); ok {
		t.Error("no domain routed a host")
	}
	if _, _, ok := hostname.ParsePortHost("8080-"+testID+".sb.test", "SB.Test."); !ok {
		t.Error("the domain's case and trailing dot are not ignored")
	}
	host := hostname.PortHost(8080, testID, "sb.test.")
	if port, id, ok := hostname.ParsePortHost(host, "sb.test"); host != "8080-"+testID+".sb.test" || !ok || port != 8080 || id != testID {
		t.Errorf("PortHost = %q, parsed back %d %q %v", host, port, id, ok)
	}
}

func TestParsePort(t *testing.T) {
	for s, want := range map[string]uint16{"1": 1, "443": 443, "65535": 65535, "0": 0, "65536": 0, "080": 0, "+80": 0, "-1": 0, "": 0, "1e3": 0, "123456": 0} {
		got, err := hostname.ParsePort(s)
		if got != want || (want == 0) != (err != nil) {
			t.Errorf("ParsePort(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
}
