package resolver

import (
	"crypto/rand"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

type recorder struct {
	mu     sync.Mutex
	events []QueryEvent
}

func (r *recorder) add(ev QueryEvent) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

func (r *recorder) all() []QueryEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]QueryEvent(nil), r.events...)
}

func (r *recorder) last(t *testing.T) QueryEvent {
	t.Helper()
	ev := r.all()
	if len(ev) == 0 {
		t.Fatal("no event recorded")
	}
	return ev[len(ev)-1]
}

type fixture struct {
	srv   *Server
	pool  *Pool
	rec   *recorder
	allow atomic.Pointer[map[string]bool]
}

// start runs a server on 127.0.0.1:0 allowing the names in the fixture's
// allow set (mutable via setAllow). mod may adjust the config.
func start(t *testing.T, v6 bool, mod func(*Config)) *fixture {
	t.Helper()
	var p6 netip.Prefix
	if v6 {
		p6 = DefaultV6Prefix
	}
	pool, err := NewPool(DefaultV4Prefix, p6)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{pool: pool, rec: &recorder{}}
	f.setAllow("allowed.example.com", "api.github.com")
	cfg := Config{
		Addr:    "127.0.0.1:0",
		Pool:    pool,
		Allow:   func(name string) bool { return (*f.allow.Load())[name] },
		OnQuery: f.rec.add,
	}
	if mod != nil {
		mod(&cfg)
	}
	f.srv, err = Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.srv.Close() })
	return f
}

func (f *fixture) setAllow(names ...string) {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	f.allow.Store(&m)
}

func (f *fixture) query(t *testing.T, net, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: net, Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, f.srv.Addr())
	if err != nil {
		t.Fatalf("%s %s %s: %v", net, name, dns.TypeToString[qtype], err)
	}
	if r.Id != m.Id || !r.Response {
		t.Fatalf("bad reply header: %v", r.MsgHdr)
	}
	return r
}

func answerAddr(t *testing.T, r *dns.Msg) netip.Addr {
	t.Helper()
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("want one answer, got %s", r)
	}
	switch rr := r.Answer[0].(type) {
	case *dns.A:
		a, _ := netip.AddrFromSlice(rr.A)
		return a.Unmap()
	case *dns.AAAA:
		a, _ := netip.AddrFromSlice(rr.AAAA)
		return a
	}
	t.Fatalf("unexpected answer %v", r.Answer[0])
	return netip.Addr{}
}

func wantRcode(t *testing.T, r *dns.Msg, rcode int) {
	t.Helper()
	if r.Rcode != rcode {
		t.Fatalf("rcode = %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[rcode])
	}
	if len(r.Answer) != 0 {
		t.Fatalf("unexpected answers: %v", r.Answer)
	}
}

func TestAllowedA(t *testing.T) {
	f := start(t, false, nil)
	r := f.query(t, "udp", "Allowed.Example.com", dns.TypeA)
	a := answerAddr(t, r)
	if !DefaultV4Prefix.Contains(a) {
		t.Fatalf("answer %v outside the pool", a)
	}
	if r.Answer[0].Header().Ttl != DefaultTTL || r.Answer[0].Header().Name != "Allowed.Example.com." {
		t.Fatalf("answer header %v", r.Answer[0].Header())
	}
	if got := answerAddr(t, f.query(t, "udp", "allowed.example.com.", dns.TypeA)); got != a {
		t.Fatalf("second answer %v != %v", got, a)
	}
	if n, ok := f.pool.Lookup(a); !ok || n != "allowed.example.com" {
		t.Fatalf("Lookup(%v) = %q %v", a, n, ok)
	}
	ev := f.rec.last(t)
	want := QueryEvent{Name: "allowed.example.com", Type: "A", Rcode: "NOERROR", Answer: a.String(), Reason: ReasonAllowed}
	if !strings.HasPrefix(ev.Client, "127.0.0.1:") {
		t.Errorf("client = %q", ev.Client)
	}
	ev.Client = ""
	if ev != want {
		t.Fatalf("event = %+v, want %+v", ev, want)
	}
}

func TestDisallowedAndReserved(t *testing.T) {
	f := start(t, true, func(c *Config) {
		inner := c.Allow
		c.Allow = func(n string) bool { return inner(n) || n == "localhost" || strings.HasSuffix(n, ".internal") }
	})
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"evil.example.com", dns.TypeA},
		{"evil.example.com", dns.TypeAAAA},
		{"mzxw6ytboi2gk3tdnfqw4zlsmvzw63q.tunnel.example", dns.TypeA},
		{"localhost", dns.TypeA},
		{"localhost", dns.TypeAAAA},
		{"metadata.google.internal", dns.TypeA},
		{"printer.local", dns.TypeA},
		{"1.0.18.198.in-addr.arpa", dns.TypePTR},
		{"1.0.0.127.in-addr.arpa", dns.TypePTR},
	} {
		r := f.query(t, "udp", q.name, q.qtype)
		wantRcode(t, r, dns.RcodeNameError)
		if len(r.Ns) != 0 {
			t.Errorf("%s: authority section present (negative answers must not be cached)", q.name)
		}
		if ev := f.rec.last(t); ev.Rcode != "NXDOMAIN" || ev.Name != q.name {
			t.Errorf("event %+v", ev)
		}
	}
	if f.pool.Len() != 0 {
		t.Fatalf("denied names got addresses: %d", f.pool.Len())
	}
}

func TestRefusedTypes(t *testing.T) {
	f := start(t, true, nil)
	for _, qt := range []uint16{dns.TypeTXT, dns.TypeANY, dns.TypeMX, dns.TypeNS, dns.TypeSRV,
		dns.TypeCNAME, dns.TypeNULL, dns.TypeAXFR, dns.TypeIXFR, dns.TypeSOA, dns.TypePTR, dns.TypeHTTPS, 65280} {
		for _, name := range []string{"allowed.example.com", "evil.example.com"} {
			r := f.query(t, "udp", name, qt)
			wantRcode(t, r, dns.RcodeRefused)
			ev := f.rec.last(t)
			if ev.Rcode != "REFUSED" || ev.Reason != ReasonType || ev.Type != typeString(qt) {
				t.Errorf("event %+v", ev)
			}
		}
	}
	if f.pool.Len() != 0 {
		t.Fatal("refused queries assigned addresses")
	}
}

func TestAAAA(t *testing.T) {
	t.Run("with v6", func(t *testing.T) {
		f := start(t, true, nil)
		a6 := answerAddr(t, f.query(t, "udp", "api.github.com", dns.TypeAAAA))
		if !DefaultV6Prefix.Contains(a6) {
			t.Fatalf("AAAA %v outside the pool", a6)
		}
		a4 := answerAddr(t, f.query(t, "udp", "api.github.com", dns.TypeA))
		for _, a := range []netip.Addr{a4, a6} {
			if n, _ := f.pool.Lookup(a); n != "api.github.com" {
				t.Fatalf("Lookup(%v) = %q", a, n)
			}
		}
	})
	t.Run("without v6", func(t *testing.T) {
		f := start(t, false, nil)
		r := f.query(t, "udp", "api.github.com", dns.TypeAAAA)
		wantRcode(t, r, dns.RcodeSuccess) // NODATA
		if ev := f.rec.last(t); ev.Rcode != "NOERROR" || ev.Answer != "" || ev.Reason != ReasonNoData {
			t.Fatalf("event %+v", ev)
		}
		wantRcode(t, f.query(t, "udp", "evil.example.com", dns.TypeAAAA), dns.RcodeNameError)
	})
}

func TestPolicyChangeIsLive(t *testing.T) {
	f := start(t, false, nil)
	wantRcode(t, f.query(t, "udp", "new.example.org", dns.TypeA), dns.RcodeNameError)
	f.setAllow("new.example.org")
	answerAddr(t, f.query(t, "udp", "new.example.org", dns.TypeA))
	f.setAllow()
	wantRcode(t, f.query(t, "udp", "new.example.org", dns.TypeA), dns.RcodeNameError)
}

func TestPoolExhaustedServer(t *testing.T) {
	pool, _ := NewPool(netip.MustParsePrefix("198.18.0.0/30"), netip.Prefix{})
	f := start(t, false, func(c *Config) {
		c.Pool = pool
		c.Allow = func(string) bool { return true }
	})
	a := answerAddr(t, f.query(t, "udp", "one.test", dns.TypeA))
	b := answerAddr(t, f.query(t, "udp", "two.test", dns.TypeA))
	wantRcode(t, f.query(t, "udp", "three.test", dns.TypeA), dns.RcodeServerFailure)
	ev := f.rec.last(t)
	if ev.Rcode != "SERVFAIL" || ev.Reason != ReasonExhausted || ev.Name != "three.test" {
		t.Fatalf("event %+v", ev)
	}
	if got := answerAddr(t, f.query(t, "udp", "one.test", dns.TypeA)); got != a {
		t.Fatal("one.test changed address")
	}
	if n, _ := pool.Lookup(b); n != "two.test" {
		t.Fatal("wrapped around")
	}
}

func TestEventsForEveryQuery(t *testing.T) {
	f := start(t, false, nil)
	f.query(t, "udp", "allowed.example.com", dns.TypeA)
	f.query(t, "tcp", "evil.example.com", dns.TypeA)
	f.query(t, "udp", "allowed.example.com", dns.TypeTXT)
	f.query(t, "udp", "localhost", dns.TypeA)
	got := f.rec.all()
	want := []string{"NOERROR", "NXDOMAIN", "REFUSED", "NXDOMAIN"}
	if len(got) != len(want) {
		t.Fatalf("%d events: %+v", len(got), got)
	}
	for i, ev := range got {
		if ev.Rcode != want[i] {
			t.Errorf("event %d: %+v, want rcode %s", i, ev, want[i])
		}
	}
}

func TestTCP(t *testing.T) {
	f := start(t, true, nil)
	a := answerAddr(t, f.query(t, "tcp", "allowed.example.com", dns.TypeA))
	if b := answerAddr(t, f.query(t, "udp", "allowed.example.com", dns.TypeA)); a != b {
		t.Fatal("tcp and udp disagree")
	}
	wantRcode(t, f.query(t, "tcp", "allowed.example.com", dns.TypeTXT), dns.RcodeRefused)
	// Several queries on one connection.
	conn, err := dns.DialTimeout("tcp", f.srv.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range 3 {
		m := new(dns.Msg).SetQuestion("api.github.com.", dns.TypeA)
		if err := conn.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		r, err := conn.ReadMsg()
		if err != nil {
			t.Fatal(err)
		}
		answerAddr(t, r)
	}
}

func rawExchange(t *testing.T, addr string, pkt []byte) *dns.Msg {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(pkt); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestMalformedQueries(t *testing.T) {
	f := start(t, false, nil)
	pack := func(m *dns.Msg) []byte {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	q := func() *dns.Msg { return new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA) }

	two := q()
	two.Question = append(two.Question, dns.Question{Name: "api.github.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	none := q()
	none.Question = nil
	withAnswer := q()
	withAnswer.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: net.IPv4(1, 2, 3, 4)}}
	twoOPT := q()
	twoOPT.SetEdns0(1232, false)
	twoOPT.Extra = append(twoOPT.Extra, twoOPT.Extra[0])
	// A name over 255 octets on the wire (over 253 characters) cannot even
	// be unpacked: miekg/dns answers FORMERR itself.
	long := new(dns.Msg).SetQuestion(strings.Repeat("abcdefgh.", 28)+"com.", dns.TypeA)
	for name, m := range map[string]*dns.Msg{"two questions": two, "no question": none, "answer section": withAnswer,
		"two OPT": twoOPT, "overlong name": long} {
		r := rawExchange(t, f.srv.Addr(), pack(m))
		if r.Rcode != dns.RcodeFormatError || len(r.Answer) != 0 {
			t.Errorf("%s: rcode %s", name, dns.RcodeToString[r.Rcode])
		}
	}

	notify := q()
	notify.Opcode = dns.OpcodeNotify
	update := q()
	update.Opcode = dns.OpcodeUpdate
	chaos := new(dns.Msg).SetQuestion("version.bind.", dns.TypeTXT)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	chaosA := q()
	chaosA.Question[0].Qclass = dns.ClassCHAOS
	badName := new(dns.Msg).SetQuestion(`a\000b.example.com.`, dns.TypeA)
	for name, m := range map[string]*dns.Msg{"notify": notify, "update": update, "chaos TXT": chaos,
		"chaos A": chaosA, "binary label": badName} {
		r := rawExchange(t, f.srv.Addr(), pack(m))
		if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("%s: rcode %s", name, dns.RcodeToString[r.Rcode])
		}
	}

	edns1 := q()
	edns1.SetEdns0(4096, true)
	edns1.IsEdns0().SetVersion(1)
	r := rawExchange(t, f.srv.Addr(), pack(edns1))
	if r.Rcode != dns.RcodeBadVers || len(r.Answer) != 0 || r.IsEdns0() == nil {
		t.Errorf("edns1: rcode %d", r.Rcode)
	}
	edns0 := q()
	edns0.SetEdns0(4096, true)
	r = rawExchange(t, f.srv.Addr(), pack(edns0))
	answerAddr(t, r)
	if o := r.IsEdns0(); o == nil || o.UDPSize() != maxUDPSize || o.Do() {
		t.Errorf("edns0 reply OPT = %v", o)
	}
	if f.pool.Len() != 1 {
		t.Fatalf("pool has %d names, want 1", f.pool.Len())
	}
}

func TestGarbageDoesNotKillServer(t *testing.T) {
	f := start(t, false, nil)
	c, err := net.Dial("udp", f.srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	valid, _ := new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA).Pack()
	for i := range 300 {
		var pkt []byte
		switch i % 4 {
		case 0: // random bytes of random length
			pkt = make([]byte, 1+i%700)
			rand.Read(pkt)
		case 1: // valid header, garbage body
			pkt = append([]byte(nil), valid...)
			rand.Read(pkt[12:])
			pkt[2] &^= 0x80
		case 2: // truncated valid query
			pkt = valid[:i%len(valid)]
		case 3: // compression pointer loop in the question name
			pkt = append(append([]byte(nil), valid[:12]...), 0xc0, 12, 0, 1, 0, 1)
		}
		c.Write(pkt)
	}
	// Also over TCP: a length prefix followed by garbage, then hang up.
	if tc, err := net.Dial("tcp", f.srv.Addr()); err == nil {
		tc.Write([]byte{0, 40, 1, 2, 3})
		tc.Close()
	}
	// The burst may overflow the socket's receive queue and the kernel then
	// drops datagrams, so retry like a stub resolver would.
	m := new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA)
	var r *dns.Msg
	for range 5 {
		if r, _, err = (&dns.Client{Timeout: 500 * time.Millisecond}).Exchange(m, f.srv.Addr()); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("server dead after garbage: %v", err)
	}
	answerAddr(t, r)
	answerAddr(t, f.query(t, "tcp", "allowed.example.com", dns.TypeA))
	malformed := 0
	for _, ev := range f.rec.all() {
		if ev.Reason == ReasonMalformed {
			malformed++
		}
	}
	if malformed == 0 {
		t.Error("no malformed events recorded")
	}
}

func TestRateLimit(t *testing.T) {
	f := start(t, false, func(c *Config) { c.RateLimit, c.Burst = 1, 5 })
	c := &dns.Client{Timeout: 2 * time.Second}
	refused := 0
	for range 20 {
		m := new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA)
		r, _, err := c.Exchange(m, f.srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if r.Rcode == dns.RcodeRefused {
			refused++
		}
	}
	if refused < 14 || refused > 15 {
		t.Fatalf("refused %d of 20 with burst 5", refused)
	}
	limited := 0
	for _, ev := range f.rec.all() {
		if ev.Reason == ReasonRateLimited {
			if ev.Rcode != "REFUSED" {
				t.Fatalf("event %+v", ev)
			}
			limited++
		}
	}
	if limited != refused {
		t.Fatalf("%d rate-limit events for %d refusals", limited, refused)
	}
}

func TestCloseIdempotentAndFreesPort(t *testing.T) {
	f := start(t, false, nil)
	addr := f.srv.Addr()
	if err := f.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	n := len(f.rec.all())
	// The same address can be bound again, UDP and TCP.
	pool, _ := NewPool(DefaultV4Prefix, netip.Prefix{})
	s2, err := Start(Config{Addr: addr, Pool: pool, Allow: func(string) bool { return true }})
	if err != nil {
		t.Fatalf("rebind %s: %v", addr, err)
	}
	defer s2.Close()
	if s2.Addr() != addr {
		t.Fatalf("addr %s != %s", s2.Addr(), addr)
	}
	f.srv = s2
	answerAddr(t, f.query(t, "tcp", "x.test", dns.TypeA))
	if len(f.rec.all()) != n {
		t.Fatal("closed server still reporting events")
	}
}

func TestStartErrors(t *testing.T) {
	pool, _ := NewPool(DefaultV4Prefix, netip.Prefix{})
	if _, err := Start(Config{Addr: "127.0.0.1:0"}); err == nil {
		t.Error("no pool accepted")
	}
	if _, err := Start(Config{Addr: "nonsense", Pool: pool}); err == nil {
		t.Error("bad address accepted")
	}
	f := start(t, false, nil)
	if _, err := Start(Config{Addr: f.srv.Addr(), Pool: pool}); err == nil {
		t.Error("address in use accepted")
	}
}

func TestPanickingPolicy(t *testing.T) {
	f := start(t, false, func(c *Config) {
		c.Allow = func(n string) bool {
			if n == "boom.test" {
				panic("policy bug")
			}
			return true
		}
		c.OnQuery = func(ev QueryEvent) {
			if ev.Name == "audit-boom.test" {
				panic("audit bug")
			}
		}
	})
	wantRcode(t, f.query(t, "udp", "boom.test", dns.TypeA), dns.RcodeServerFailure)
	answerAddr(t, f.query(t, "udp", "audit-boom.test", dns.TypeA))
	answerAddr(t, f.query(t, "udp", "fine.test", dns.TypeA))
}
