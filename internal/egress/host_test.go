package egress

import (
	"crypto/tls"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestServerNameComparedASCIIOnly: a TLS server name that equals the
// destination's name only under Unicode case folding (the Kelvin sign
// U+212A folds to "k") is not that name: the handshake is refused as a
// mismatch, as the policy, the vault and the substitution would refuse such
// a name (package hostname).
func TestServerNameComparedASCIIOnly(t *testing.T) {
	h := newHarness(t)
	dst := netip.MustParseAddrPort("198.18.0.11:443")
	h.sb.NameOf = func(a netip.Addr) (string, bool) {
		if a == dst.Addr() {
			return "kelvin.example.test", true
		}
		return "", false
	}
	h.setDst(dst)
	for _, sni := range []string{"\u212Aelvin.example.test", "KELVIN.example.test"} {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		err = tc.Handshake()
		tc.Close()
		if sni[0] == 'K' {
			// Plain ASCII case: the same name.
			if err != nil {
				t.Errorf("%q: %v, want the handshake to succeed", sni, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%q: handshake succeeded", sni)
		}
		if ev := h.waitEvents(1); len(ev) != 1 || ev[0].Rule != "builtin:sni-mismatch" {
			t.Errorf("%q: events %+v, want builtin:sni-mismatch", sni, ev)
		}
	}
}
