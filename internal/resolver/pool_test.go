package resolver

import (
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

func TestPoolAssignStable(t *testing.T) {
	p, err := NewPool(DefaultV4Prefix, DefaultV6Prefix)
	if err != nil {
		t.Fatal(err)
	}
	a4, a6, err := p.Assign("Example.COM.")
	if err != nil {
		t.Fatal(err)
	}
	if a4 != netip.MustParseAddr("198.18.0.1") || a6 != netip.MustParseAddr("2001:2::1") {
		t.Fatalf("first slot = %v %v", a4, a6)
	}
	b4, b6, _ := p.Assign("example.com")
	if a4 != b4 || a6 != b6 {
		t.Fatalf("not stable: %v %v then %v %v", a4, a6, b4, b6)
	}
	c4, c6, _ := p.Assign("other.example")
	if c4 == a4 || c6 == a6 {
		t.Fatal("two names share an address")
	}
	for _, a := range []string{"198.18.0.1", "::ffff:198.18.0.1", "2001:2::1"} {
		if n, ok := p.Lookup(netip.MustParseAddr(a)); !ok || n != "example.com" {
			t.Errorf("Lookup(%s) = %q, %v", a, n, ok)
		}
	}
	if _, ok := p.Lookup(netip.MustParseAddr("198.18.0.99")); ok {
		t.Error("Lookup of an unassigned address succeeded")
	}
	if p.Len() != 2 {
		t.Errorf("Len = %d", p.Len())
	}
	if !p.Contains(netip.MustParseAddr("::ffff:198.19.255.255")) || p.Contains(netip.MustParseAddr("10.0.0.1")) {
		t.Error("Contains wrong")
	}
}

func TestPoolExhaustion(t *testing.T) {
	p, err := NewPool(netip.MustParsePrefix("10.9.8.4/30"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Cap() != 2 || p.HasV6() {
		t.Fatalf("Cap = %d HasV6 = %v", p.Cap(), p.HasV6())
	}
	a, v6, _ := p.Assign("a.test")
	b, _, _ := p.Assign("b.test")
	if a.String() != "10.9.8.5" || b.String() != "10.9.8.6" || v6.IsValid() {
		t.Fatalf("got %v %v %v", a, b, v6)
	}
	if _, _, err := p.Assign("c.test"); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("third name: err = %v", err)
	}
	// Existing names still resolve; nothing wrapped around.
	if a2, _, err := p.Assign("a.test"); err != nil || a2 != a {
		t.Fatalf("a.test after exhaustion: %v %v", a2, err)
	}
	if n, _ := p.Lookup(a); n != "a.test" {
		t.Fatalf("a overwritten by %q", n)
	}
}

func TestPoolV6Smaller(t *testing.T) {
	p, err := NewPool(netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("2001:2::ff00/126"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Cap() != 3 {
		t.Fatalf("Cap = %d, want 3", p.Cap())
	}
	_, v6, _ := p.Assign("x.test")
	if v6.String() != "2001:2::ff01" {
		t.Fatal(v6)
	}
}

func TestNewPoolErrors(t *testing.T) {
	for _, c := range []struct{ v4, v6 string }{
		{"", ""},
		{"2001:2::/64", ""},
		{"10.0.0.0/31", ""},
		{"10.0.0.0/24", "10.0.0.0/24"},
		{"10.0.0.0/24", "2001:2::/127"},
		{"10.0.0.0/24", "::ffff:10.0.0.0/120"},
	} {
		var v4, v6 netip.Prefix
		if c.v4 != "" {
			v4 = netip.MustParsePrefix(c.v4)
		}
		if c.v6 != "" {
			v6 = netip.MustParsePrefix(c.v6)
		}
		if _, err := NewPool(v4, v6); err == nil {
			t.Errorf("NewPool(%q, %q) succeeded", c.v4, c.v6)
		}
	}
}

func TestPoolConcurrent(t *testing.T) {
	p, _ := NewPool(DefaultV4Prefix, netip.Prefix{})
	var wg sync.WaitGroup
	got := make([]netip.Addr, 16)
	for i := range got {
		wg.Go(func() {
			a, _, err := p.Assign("same.test")
			if err != nil {
				t.Error(err)
			}
			got[i] = a
		})
	}
	wg.Wait()
	for _, a := range got {
		if a != got[0] {
			t.Fatal("concurrent Assign gave different addresses")
		}
	}
}

func TestNormalize(t *testing.T) {
	long := strings.Repeat("a", 63)
	for in, want := range map[string]string{
		"Example.COM.":    "example.com",
		"a":               "a",
		"_dmarc.x.y":      "_dmarc.x.y",
		"mzxw6ytboi.t.co": "mzxw6ytboi.t.co",
		long + ".com":     long + ".com",
	} {
		if got, ok := Normalize(in); !ok || got != want {
			t.Errorf("Normalize(%q) = %q, %v", in, got, ok)
		}
	}
	for _, in := range []string{
		"", ".", "a..b", ".a", long + "a.com", "-a.com", "a-.com", `a\.b.com`, `a\000.com`,
		"a b.com", "é.com", strings.Repeat("abcdefghi.", 26), "1.2.3.4", "a.0x7f", "\u212Aey.com",
	} {
		if _, ok := Normalize(in); ok {
			t.Errorf("Normalize(%q) accepted", in)
		}
	}
	// 253 characters is the limit.
	n := strings.Repeat("a.", 126) + "a"
	valid := func(name string) bool { _, ok := Normalize(name); return ok }
	if len(n) != 253 || !valid(n) || !valid(n+".") || valid(n+"a") {
		t.Errorf("length limit wrong")
	}
}

func TestReserved(t *testing.T) {
	for _, n := range []string{"localhost", "foo.localhost", "printer.local", "metadata.google.internal",
		"1.0.0.127.in-addr.arpa", "arpa", "x.onion", "x.invalid"} {
		if !Reserved(n) {
			t.Errorf("Reserved(%q) = false", n)
		}
	}
	for _, n := range []string{"notlocalhost", "local.example.com", "internal.dev", "xarpa", "example.com"} {
		if Reserved(n) {
			t.Errorf("Reserved(%q) = true", n)
		}
	}
}
