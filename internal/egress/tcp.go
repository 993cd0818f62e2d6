package egress

import (
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cagebox/cagebox/internal/sniff"
)

// serveTCP splices a raw flow to its upstream if the policy allows raw TCP
// to the destination's name and port; otherwise it closes the flow.
func (p *Proxy) serveTCP(pc *sniff.Conn, sb *Sandbox, lim *sbState, dst netip.AddrPort, start time.Time) {
	ev := Event{Port: int(dst.Port()), Protocol: "tcp", Time: start}
	name, ok := sb.nameOf(dst.Addr())
	if !ok {
		ev.Verdict, ev.Rule, ev.Reason = VerdictDeny, ruleLiteralIP, "destination is a literal IP address, not a name from the sandbox's DNS"
		p.emit(sb, ev)
		return
	}
	ev.Host = name
	d, verdict := p.decide(p.ctx, sb, &Request{Host: name, Port: int(dst.Port()), Protocol: "tcp"})
	ev.Rule, ev.Reason = d.Rule, d.Reason
	if verdict != VerdictAllow {
		if ev.Rule == "" {
			ev.Rule = defaultRuleName
		}
		ev.Verdict = verdict
		p.emit(sb, ev)
		return
	}
	up, err := lim.dial(p.ctx, p.guard, "tcp", net.JoinHostPort(name, strconv.Itoa(int(dst.Port()))))
	if err != nil {
		ev.Verdict, ev.Reason = VerdictError, upstreamErrPrefix+upstreamReason(err)
		if rule := refusalRule(err); rule != "" {
			ev.Rule = rule
		}
		p.log.Info("egress upstream error", "sandbox", sb.ID, "host", name, "err", err)
		p.emit(sb, ev)
		return
	}
	defer up.Close()
	ev.Verdict = VerdictAllow
	ev.BytesUp, ev.BytesDown = splice(pc, up)
	ev.Duration = time.Since(start)
	p.emit(sb, ev)
}

// splice copies both ways until both directions are done, passing half-closes
// on. It returns the bytes copied from a to b and from b to a.
func splice(a, b net.Conn) (ab, ba int64) {
	var wg sync.WaitGroup
	var nab, nba atomic.Int64
	cp := func(dst, src net.Conn, n *atomic.Int64) {
		defer wg.Done()
		c, err := io.Copy(dst, src)
		n.Store(c)
		if err != nil {
			// One side failed: tear both down.
			_ = a.Close()
			_ = b.Close()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Add(2)
	go cp(b, a, &nab)
	go cp(a, b, &nba)
	wg.Wait()
	return nab.Load(), nba.Load()
}
