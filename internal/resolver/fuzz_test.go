package resolver

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeWriter is a dns.ResponseWriter that keeps the packed reply.
type fakeWriter struct {
	udp   bool
	reply []byte
	msg   *dns.Msg
}

func (w *fakeWriter) LocalAddr() net.Addr {
	if w.udp {
		return &net.UDPAddr{IP: net.IPv4(10, 201, 0, 1), Port: 53}
	}
	return &net.TCPAddr{IP: net.IPv4(10, 201, 0, 1), Port: 53}
}
func (w *fakeWriter) RemoteAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(10, 201, 0, 2), Port: 40000}
}
func (w *fakeWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	w.reply, w.msg = b, m
	return nil
}
func (w *fakeWriter) Write(b []byte) (int, error) { w.reply = b; return len(b), nil }
func (w *fakeWriter) Close() error                { return nil }
func (w *fakeWriter) TsigStatus() error           { return nil }
func (w *fakeWriter) TsigTimersOnly(bool)         {}
func (w *fakeWriter) Hijack()                     {}
func (w *fakeWriter) Network() string {
	if w.udp {
		return "udp"
	}
	return "tcp"
}

func fuzzSeeds(f *testing.F) {
	add := func(m *dns.Msg) {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
	}
	for _, q := range []struct {
		name string
		t    uint16
	}{
		{"ok.allowed.test.", dns.TypeA}, {"ok.allowed.test.", dns.TypeAAAA}, {"ok.allowed.test.", dns.TypeTXT},
		{"denied.test.", dns.TypeA}, {"localhost.", dns.TypeA}, {"1.0.18.198.in-addr.arpa.", dns.TypePTR},
		{".", dns.TypeANY}, {"mzxw6ytboi.allowed.test.", dns.TypeNULL},
	} {
		add(new(dns.Msg).SetQuestion(q.name, q.t))
	}
	m := new(dns.Msg).SetQuestion("x.allowed.test.", dns.TypeA)
	m.SetEdns0(4096, true)
	add(m)
	m = new(dns.Msg).SetQuestion("x.allowed.test.", dns.TypeA)
	m.Opcode = dns.OpcodeUpdate
	add(m)
	f.Add([]byte{}, false)
	f.Add([]byte{0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}, true)
}

// FuzzHandle feeds arbitrary bytes through dns.Msg.Unpack into the handler:
// it must never panic, always reply with a packable message, and never
// answer anything but a synthetic A/AAAA for an allowed name.
func FuzzHandle(f *testing.F) {
	fuzzSeeds(f)
	pool, err := NewPool(netip.MustParsePrefix("198.18.0.0/24"), DefaultV6Prefix)
	if err != nil {
		f.Fatal(err)
	}
	var last QueryEvent
	s, err := newServer(Config{
		Pool:      pool,
		Allow:     func(n string) bool { return strings.HasSuffix(n, "allowed.test") },
		OnQuery:   func(ev QueryEvent) { last = ev },
		RateLimit: -1,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, udp bool) {
		req := new(dns.Msg)
		if err := req.Unpack(data); err != nil {
			s.invalid(data, err)
			return
		}
		if req.Response {
			return // dropped by acceptAll before the handler
		}
		w := &fakeWriter{udp: udp}
		s.ServeDNS(w, req)
		if w.msg == nil {
			t.Fatalf("no reply to %v", req)
		}
		r := new(dns.Msg)
		if err := r.Unpack(w.reply); err != nil {
			t.Fatalf("reply does not unpack: %v", err)
		}
		if r.Id != req.Id || !r.Response {
			t.Fatalf("bad reply header %v", r.MsgHdr)
		}
		if udp && len(w.reply) > maxUDPSize {
			t.Fatalf("udp reply of %d bytes", len(w.reply))
		}
		if last.Rcode != rcodeString(r.Rcode) {
			t.Fatalf("event rcode %q, reply %d", last.Rcode, r.Rcode)
		}
		if len(r.Ns) != 0 {
			t.Fatalf("authority records in reply: %v", r.Ns)
		}
		if len(r.Answer) == 0 {
			return
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || len(req.Question) != 1 {
			t.Fatalf("unexpected answer: %v", r)
		}
		q := req.Question[0]
		name, ok := Normalize(q.Name)
		if !ok || !strings.HasSuffix(name, "allowed.test") || Reserved(name) || q.Qclass != dns.ClassINET {
			t.Fatalf("answered %q", q.Name)
		}
		var a netip.Addr
		switch rr := r.Answer[0].(type) {
		case *dns.A:
			a, _ = netip.AddrFromSlice(rr.A.To4())
		case *dns.AAAA:
			a, _ = netip.AddrFromSlice(rr.AAAA)
		default:
			t.Fatalf("answer of type %T", rr)
		}
		if r.Answer[0].Header().Rrtype != q.Qtype {
			t.Fatalf("answer type %d for question type %d", r.Answer[0].Header().Rrtype, q.Qtype)
		}
		if got, _ := pool.Lookup(a); got != name {
			t.Fatalf("answer %v maps to %q, not %q", a, got, name)
		}
	})
}

func TestLongestNameFits(t *testing.T) {
	f := start(t, true, func(c *Config) { c.Allow = func(string) bool { return true } })
	name := strings.Repeat("a.", 126) + "a"
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		r := f.query(t, "udp", name, qt)
		if r.Truncated {
			t.Fatal("truncated")
		}
		answerAddr(t, r)
	}
}

// BenchmarkUDPQueries measures allowed A queries per second over UDP on
// loopback, with the rate limit off, from parallel clients each holding one
// socket. Client and server share the machine's CPUs.
func BenchmarkUDPQueries(b *testing.B) {
	pool, _ := NewPool(DefaultV4Prefix, netip.Prefix{})
	s, err := Start(Config{Addr: "127.0.0.1:0", Pool: pool, RateLimit: -1,
		Allow: func(string) bool { return true }, OnQuery: func(QueryEvent) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	names := make([]string, 64)
	for i := range names {
		names[i] = "host" + string(rune('a'+i%26)) + strings.Repeat("x", i/26) + ".example.com."
	}
	b.ReportAllocs()
	b.SetParallelism(4) // 4×GOMAXPROCS clients: the round trip, not the CPU, bounds one client
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		c, err := dns.Dial("udp", s.Addr())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		i := 0
		for pb.Next() {
			m := new(dns.Msg).SetQuestion(names[i%len(names)], dns.TypeA)
			i++
			if err := c.WriteMsg(m); err != nil {
				b.Error(err)
				return
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			r, err := c.ReadMsg()
			if err != nil || r.Rcode != dns.RcodeSuccess {
				b.Errorf("query: %v %v", err, r)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "queries/s")
}
