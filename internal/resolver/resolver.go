// Package resolver is the synthetic DNS server that runs on each sandbox's
// gateway.
//
// It never forwards a guest's query upstream. For a name the sandbox's policy
// allows, an A (or AAAA) query is answered with a synthetic address drawn
// from the sandbox's Pool and bound to that name; the transparent proxy later
// maps a connection to that address back to the name with Pool.Lookup and
// resolves the real address itself. Everything else gets nothing useful:
//
//   - names the policy does not allow, localhost and anything under .local,
//     .internal, .arpa (reverse lookups included), .invalid, .onion:
//     NXDOMAIN;
//   - an allowed name asked for AAAA when the pool has no IPv6: NOERROR with
//     no answer (NODATA);
//   - any query type other than A and AAAA (TXT, ANY, MX, NS, SRV, CNAME,
//     NULL, AXFR, IXFR, PTR outside the reserved zones, ...), a class other
//     than IN, an opcode other than QUERY, a name that is not a valid host
//     name, or a query beyond the rate limit: REFUSED;
//   - zero or several questions, records in the answer or authority
//     sections, several OPT records, non-OPT additional records: FORMERR;
//     an EDNS version other than 0: BADVERS;
//   - pool exhaustion: SERVFAIL.
//
// With nothing but synthetic addresses ever returned and no record type that
// can carry data, DNS tunnelling and DNS rebinding have nothing to work with.
// Negative answers carry no SOA, so resolvers do not cache them and a policy
// change applies to the next query.
package resolver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Defaults for Config fields left zero.
const (
	DefaultTTL       = 30
	DefaultRateLimit = 200 // queries per second
	DefaultBurst     = 400
	maxTCPConns      = 64
	maxUDPSize       = 1232 // largest UDP answer, per the DNS flag day 2020 advice
)

// Reasons reported in QueryEvent.Reason.
const (
	ReasonAllowed     = "allowed"
	ReasonDenied      = "denied by policy"
	ReasonReserved    = "reserved name"
	ReasonType        = "query type refused"
	ReasonClass       = "query class refused"
	ReasonOpcode      = "opcode refused"
	ReasonInvalidName = "invalid name"
	ReasonMalformed   = "malformed query"
	ReasonEDNS        = "bad edns"
	ReasonRateLimited = "rate limited"
	ReasonExhausted   = "address pool exhausted"
	ReasonNoData      = "no address of this family"
	ReasonInternal    = "internal error"
)

// Config configures a Server.
type Config struct {
	// Addr is the "IP:PORT" to listen on, over UDP and TCP, e.g. the sandbox
	// gateway "10.201.0.1:53". Port 0 picks a free port, the same for both.
	Addr string
	// Pool holds the sandbox's synthetic addresses. Required.
	Pool *Pool
	// Allow is the policy: may this sandbox resolve name? It is called with
	// the normalized name (lower case, no trailing dot) for every query, so
	// a policy change applies to the next query. Nil denies every name.
	Allow func(name string) bool
	// OnQuery, if not nil, is called for every query received, answered or
	// not, from the goroutine serving it (it should not block for long).
	OnQuery func(QueryEvent)
	// Logger receives debug lines per query and warnings; nil discards.
	Logger *slog.Logger
	// TTL of the synthetic answers, in seconds; 0 means DefaultTTL.
	TTL uint32
	// RateLimit is the sustained number of queries per second the server
	// answers (token bucket shared by UDP and TCP); beyond it queries are
	// REFUSED. 0 means DefaultRateLimit; negative turns the limit off.
	RateLimit float64
	// Burst is the token bucket's size; 0 means DefaultBurst.
	Burst int
}

// QueryEvent describes one query and what the server did with it.
type QueryEvent struct {
	Name   string // normalized query name when valid, else as received ("" when unparsable)
	Type   string // "A", "AAAA", "TXT", ... ("" when unparsable)
	Rcode  string // "NOERROR", "NXDOMAIN", "REFUSED", "FORMERR", "SERVFAIL", "BADVERS"; "" when no reply was sent
	Answer string // the synthetic address answered, or ""
	Client string // "IP:PORT" of the querier ("" when unparsable)
	Reason string // one of the Reason constants
}

// Server is a running synthetic DNS server.
type Server struct {
	cfg     Config
	ttl     uint32
	log     *slog.Logger
	limit   *bucket // nil when unlimited
	addr    string
	udp     *dns.Server
	tcp     *dns.Server
	served  chan error // one value per dns.Server when it stops serving
	closeMu sync.Mutex
	closed  bool
	lastRL  time.Time // last rate-limit warning, guarded by closeMu
}

// Start listens on cfg.Addr over UDP and TCP and serves queries until Close.
// It returns once both listeners are bound and serving.
func Start(cfg Config) (*Server, error) {
	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	pc, ln, err := listen(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("start resolver: %w", err)
	}
	s.addr = pc.LocalAddr().String()
	if uc, ok := pc.(*net.UDPConn); ok {
		// Best effort: absorb bursts rather than drop datagrams.
		_ = uc.SetReadBuffer(1 << 20)
	}
	started := make(chan struct{}, 2)
	notify := func() { started <- struct{}{} }
	s.udp = &dns.Server{
		PacketConn:        pc,
		Handler:           s,
		UDPSize:           maxUDPSize,
		MsgAcceptFunc:     acceptAll,
		MsgInvalidFunc:    s.invalid,
		NotifyStartedFunc: notify,
	}
	s.tcp = &dns.Server{
		Listener:          newLimitListener(ln, maxTCPConns),
		Handler:           s,
		ReadTimeout:       2 * time.Second,
		WriteTimeout:      2 * time.Second,
		IdleTimeout:       func() time.Duration { return 10 * time.Second },
		MaxTCPQueries:     128,
		MsgAcceptFunc:     acceptAll,
		MsgInvalidFunc:    s.invalid,
		NotifyStartedFunc: notify,
	}
	s.served = make(chan error, 2)
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		go func() { s.served <- srv.ActivateAndServe() }()
	}
	for range 2 {
		select {
		case <-started:
		case err := <-s.served:
			s.served <- err // keep the count right for Close
			_ = s.Close()
			return nil, fmt.Errorf("start resolver on %s: %w", s.addr, err)
		}
	}
	s.log.Debug("resolver started", "addr", s.addr)
	return s, nil
}

func newServer(cfg Config) (*Server, error) {
	if cfg.Pool == nil {
		return nil, errors.New("start resolver: no address pool")
	}
	s := &Server{cfg: cfg, ttl: cfg.TTL, log: cfg.Logger}
	if s.ttl == 0 {
		s.ttl = DefaultTTL
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.RateLimit >= 0 {
		rate, burst := cfg.RateLimit, cfg.Burst
		if rate == 0 {
			rate = DefaultRateLimit
		}
		if burst <= 0 {
			burst = DefaultBurst
		}
		s.limit = newBucket(rate, burst)
	}
	return s, nil
}

// listen binds UDP and TCP on the same address; with port 0 it retries until
// the port the kernel picked for UDP is free for TCP as well.
func listen(addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen: %w", err)
	}
	tries := 1
	if port == "0" {
		tries = 20
	}
	var lastErr error
	for range tries {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("listen udp: %w", err)
		}
		_, bound, _ := net.SplitHostPort(pc.LocalAddr().String())
		ln, err := net.Listen("tcp", net.JoinHostPort(host, bound))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		lastErr = err
	}
	return nil, nil, fmt.Errorf("listen tcp: %w", lastErr)
}

// Addr returns the address the server is bound to, "IP:PORT", the same for
// UDP and TCP.
func (s *Server) Addr() string { return s.addr }

// Close stops both listeners and waits for in-flight queries; OnQuery is not
// called after it returns. It is idempotent.
func (s *Server) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	s.closeMu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		if err := srv.ShutdownContext(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	// Both serve loops have returned once shutdown completes; collect their
	// results (ignoring the normal nil).
	for range 2 {
		select {
		case err := <-s.served:
			if err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
	}
	// Make sure the sockets are gone even if a shutdown failed half way.
	_ = s.udp.PacketConn.Close()
	_ = s.tcp.Listener.Close()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close resolver %s: %w", s.addr, err)
	}
	s.log.Debug("resolver stopped", "addr", s.addr)
	return nil
}

// acceptAll lets every request (QR=0) through to ServeDNS so that it is
// checked, answered and reported in one place; responses are dropped.
func acceptAll(dh dns.Header) dns.MsgAcceptAction {
	const qr = 1 << 15
	if dh.Bits&qr != 0 {
		return dns.MsgIgnore
	}
	return dns.MsgAccept
}

// invalid reports a message miekg/dns could not parse. miekg/dns answers
// FORMERR when the 12-byte header was readable and stays silent otherwise.
func (s *Server) invalid(m []byte, err error) {
	if s.limit != nil {
		s.limit.allow(time.Now()) // garbage costs a token too
	}
	ev := QueryEvent{Reason: ReasonMalformed}
	if len(m) >= 12 && m[2]&0x80 == 0 {
		ev.Rcode = "FORMERR"
	}
	s.log.Debug("malformed dns message", "len", len(m), "err", err)
	s.emit(ev)
}

// emit hands ev to OnQuery; a panicking OnQuery is logged, not fatal.
func (s *Server) emit(ev QueryEvent) {
	if s.cfg.OnQuery == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("resolver OnQuery panicked", "panic", r, "name", ev.Name)
		}
	}()
	s.cfg.OnQuery(ev)
}

// ServeDNS implements dns.Handler.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	client := ""
	if ra := w.RemoteAddr(); ra != nil {
		client = ra.String()
	}
	_, udp := w.LocalAddr().(*net.UDPAddr)
	var ev QueryEvent
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("resolver handler panicked", "panic", r, "client", client)
			resp := reply(req, dns.RcodeServerFailure)
			ev = QueryEvent{Client: client, Rcode: "SERVFAIL", Reason: ReasonInternal}
			if len(req.Question) == 1 {
				ev.Name, ev.Type = req.Question[0].Name, typeString(req.Question[0].Qtype)
			}
			s.emit(ev)
			_ = w.WriteMsg(resp)
		}
	}()
	resp, ev := s.answer(req, client, udp)
	s.log.Debug("dns query", "name", ev.Name, "type", ev.Type, "rcode", ev.Rcode,
		"answer", ev.Answer, "client", ev.Client, "reason", ev.Reason)
	// The event is emitted before the reply so that whoever sees the answer
	// can rely on the audit record existing.
	s.emit(ev)
	if err := w.WriteMsg(resp); err != nil {
		s.log.Debug("dns reply not sent", "client", client, "err", err)
	}
}

// answer computes the reply to req and the event describing it.
func (s *Server) answer(req *dns.Msg, client string, udp bool) (*dns.Msg, QueryEvent) {
	ev := QueryEvent{Client: client}
	if len(req.Question) > 0 {
		ev.Name, ev.Type = req.Question[0].Name, typeString(req.Question[0].Qtype)
	}
	fail := func(rcode int, reason string) (*dns.Msg, QueryEvent) {
		ev.Rcode, ev.Reason = rcodeString(rcode), reason
		return reply(req, rcode), ev
	}

	if s.limit != nil && !s.limit.allow(time.Now()) {
		s.warnRateLimited(client)
		return fail(dns.RcodeRefused, ReasonRateLimited)
	}
	if req.Opcode != dns.OpcodeQuery {
		return fail(dns.RcodeRefused, ReasonOpcode)
	}
	if len(req.Question) != 1 || len(req.Answer) != 0 || len(req.Ns) != 0 {
		return fail(dns.RcodeFormatError, ReasonMalformed)
	}
	var opt *dns.OPT
	for _, rr := range req.Extra {
		o, ok := rr.(*dns.OPT)
		if !ok || opt != nil || o.Hdr.Name != "." {
			return fail(dns.RcodeFormatError, ReasonEDNS)
		}
		opt = o
	}
	size := dns.MinMsgSize
	if opt != nil {
		size = max(size, min(int(opt.UDPSize()), maxUDPSize))
		if opt.Version() != 0 {
			resp := reply(req, dns.RcodeBadVers)
			resp.SetEdns0(maxUDPSize, false)
			ev.Rcode, ev.Reason = "BADVERS", ReasonEDNS
			return resp, ev
		}
	}
	finish := func(resp *dns.Msg) *dns.Msg {
		if opt != nil {
			resp.SetEdns0(maxUDPSize, false)
		}
		if udp {
			resp.Truncate(size)
		}
		return resp
	}

	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		r, e := fail(dns.RcodeRefused, ReasonClass)
		return finish(r), e
	}
	name, ok := Normalize(q.Name)
	if !ok {
		r, e := fail(dns.RcodeRefused, ReasonInvalidName)
		return finish(r), e
	}
	ev.Name = name
	if Reserved(name) {
		r, e := fail(dns.RcodeNameError, ReasonReserved)
		return finish(r), e
	}
	if q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA {
		r, e := fail(dns.RcodeRefused, ReasonType)
		return finish(r), e
	}
	if s.cfg.Allow == nil || !s.cfg.Allow(name) {
		r, e := fail(dns.RcodeNameError, ReasonDenied)
		return finish(r), e
	}
	v4, v6, err := s.cfg.Pool.Assign(name)
	if err != nil {
		s.log.Warn("synthetic address not assigned", "name", name, "client", client, "err", err)
		reason := ReasonInternal
		if errors.Is(err, ErrPoolExhausted) {
			reason = ReasonExhausted
		}
		r, e := fail(dns.RcodeServerFailure, reason)
		return finish(r), e
	}
	resp := reply(req, dns.RcodeSuccess)
	ev.Rcode, ev.Reason = "NOERROR", ReasonAllowed
	hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: s.ttl}
	switch {
	case q.Qtype == dns.TypeA:
		hdr.Rrtype = dns.TypeA
		resp.Answer = []dns.RR{&dns.A{Hdr: hdr, A: v4.AsSlice()}}
		ev.Answer = v4.String()
	case v6.IsValid():
		hdr.Rrtype = dns.TypeAAAA
		resp.Answer = []dns.RR{&dns.AAAA{Hdr: hdr, AAAA: v6.AsSlice()}}
		ev.Answer = v6.String()
	default:
		ev.Reason = ReasonNoData
	}
	return finish(resp), ev
}

// reply builds a response to req with rcode, echoing the question when
// there is exactly one.
func reply(req *dns.Msg, rcode int) *dns.Msg {
	resp := &dns.Msg{}
	resp.Id = req.Id
	resp.Response = true
	resp.Opcode = req.Opcode
	resp.RecursionDesired = req.RecursionDesired
	resp.RecursionAvailable = true
	resp.CheckingDisabled = req.CheckingDisabled
	resp.Rcode = rcode
	resp.Compress = true
	if len(req.Question) == 1 {
		resp.Question = []dns.Question{req.Question[0]}
	}
	return resp
}

func (s *Server) warnRateLimited(client string) {
	now := time.Now()
	s.closeMu.Lock()
	warn := now.Sub(s.lastRL) >= time.Second
	if warn {
		s.lastRL = now
	}
	s.closeMu.Unlock()
	if warn {
		s.log.Warn("dns rate limit exceeded; refusing queries", "addr", s.addr, "client", client)
	}
}

func typeString(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return "TYPE" + strconv.Itoa(int(t))
}

func rcodeString(rc int) string {
	if rc == dns.RcodeBadVers {
		return "BADVERS"
	}
	if s, ok := dns.RcodeToString[rc]; ok {
		return s
	}
	return "RCODE" + strconv.Itoa(rc)
}
