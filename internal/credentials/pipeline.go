package credentials

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/resign"
	"github.com/cagebox/cagebox/internal/substitute"
)

// Exfil modes: what happens to a request carrying a credential-shaped
// string that is not one of the sandbox's placeholders.
const (
	ExfilFlag  = "flag"  // an event (the default)
	ExfilBlock = "block" // a 403
	ExfilOff   = "off"   // nothing
)

// ScanBudget bounds the exfil scan of one request (see substitute.Budget).
type ScanBudget = substitute.Budget

// Config is the gateway-wide configuration of every sandbox's pipeline.
type Config struct {
	// Exfil is ExfilFlag (""), ExfilBlock or ExfilOff.
	Exfil string
	// ExfilScan bounds the exfil scan of one request (zero fields:
	// substitute's defaults). Its Body is how much of a body is read ahead
	// and scanned. Past a bound the rest of the request is not scanned: an
	// event under "flag", a 403 under "block" (which refuses what it cannot
	// scan, bodies longer than Body included).
	ExfilScan ScanBudget
}

// Check validates c and fills in its defaults; under flag and block it
// also loads the exfil detector, so a daemon that cannot scan does not
// start.
func (c *Config) Check() error {
	switch c.Exfil {
	case "":
		c.Exfil = ExfilFlag
	case ExfilFlag, ExfilBlock, ExfilOff:
	default:
		return fmt.Errorf("exfil mode %q: use flag, block or off", c.Exfil)
	}
	if c.ExfilScan.Body == 0 {
		c.ExfilScan.Body = substitute.DefaultScanBody
	}
	if c.ExfilScan.Bytes <= 0 {
		c.ExfilScan.Bytes = substitute.DefaultScanBytes
	}
	if c.ExfilScan.Time <= 0 {
		c.ExfilScan.Time = substitute.DefaultScanTime
	}
	if c.Exfil != ExfilOff {
		if _, err := detector(); err != nil {
			return err
		}
	}
	return nil
}

// detector is the exfil scan's rule set, compiled once per process (it is
// immutable and safe for concurrent use).
var detector = sync.OnceValues(substitute.NewDetector)

// Emit records one of the pipeline's events (secret.used, secret.refused,
// secret.alert, secret.error, secret.exfil_suspect, secret.exfil_unscanned,
// secret.reflected) for the sandbox the pipeline belongs to.
type Emit func(ev api.EventPayload)

// Refusal is the pipeline's denial of a request: 403 unless Status says
// otherwise (413 for a body too large to check). It is also the error a
// request body fails with when the pipeline refuses it as it streams (a
// signature chunk that does not verify).
type Refusal struct {
	Rule, Reason string
	Status       int
}

func (r *Refusal) Error() string { return r.Reason }

// unboundVerifyMax bounds the body read to tell whether a request to a host
// an HMAC binding is not bound to was signed with its placeholder key (an
// alert, not a protection: that signature is worth nothing upstream).
const unboundVerifyMax = 64 << 10

// Pipeline is one sandbox's credential pipeline: its bindings, the request
// half (exfil scan, SigV4 re-sign, HMAC re-sign, placeholder swap, with
// their refusals and alerts) and the response half (Scrub). It is safe for
// concurrent use; bindings installed or unbound apply from the next
// request on.
type Pipeline struct {
	cfg  Config
	emit Emit

	// mu guards b. *b is never changed once installed: Unbind installs a
	// copy.
	mu sync.Mutex
	b  *Bindings
}

// New returns a pipeline with no bindings. cfg has been checked
// (Config.Check); emit may be nil.
func New(cfg Config, emit Emit) *Pipeline {
	if emit == nil {
		emit = func(api.EventPayload) {}
	}
	return &Pipeline{cfg: cfg, emit: emit, b: &Bindings{}}
}

// Install replaces the pipeline's bindings (nil: none).
func (p *Pipeline) Install(b *Bindings) {
	if b == nil {
		b = &Bindings{}
	}
	p.mu.Lock()
	p.b = b
	p.mu.Unlock()
}

// Unbind removes the binding called name: from the very next request its
// placeholder is refused (with an alert) everywhere, and its re-signing
// stops. A SigV4 binding's key id placeholder becomes a guard, so a request
// still signed with it is refused rather than forwarded.
func (p *Pipeline) Unbind(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	nb := *p.b
	if nb.Swap == nil {
		nb.Swap, _ = substitute.NewSet()
	}
	nb.Swap.Remove(name)
	for _, b := range nb.SigV4 {
		if b.Name == name {
			// A key id too short or odd to be a placeholder cannot be
			// one of ours (Bind made it), so there is nothing to guard.
			_ = nb.Swap.Add(&substitute.Binding{Name: name, Placeholder: b.Placeholder.AccessKeyID, Guard: true})
		}
	}
	nb.SigV4 = slices.DeleteFunc(slices.Clone(nb.SigV4), func(b *SigV4Binding) bool { return b.Name == name })
	nb.HMAC = slices.DeleteFunc(slices.Clone(nb.HMAC), func(b *HMACBinding) bool { return b.Name == name })
	p.b = &nb
}

// Bindings returns the installed bindings (never nil).
func (p *Pipeline) Bindings() *Bindings {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.b
}

// Request is the egress proxy's request hook: placeholders become real
// values on requests to their bound hosts over intercepted TLS, and
// anything else carrying a placeholder is refused (and raises an alert).
// The order is: what the headers alone refuse (a placeholder-signed AWS
// request to a host it is not bound to), the exfil scan of the request as
// the guest sent it, SigV4 re-signing, HMAC re-signing, the swap. Every real
// value put into the request (swapped, injected, or a re-signer's key id
// and signatures) is recorded for the response filter it returns, which
// scrubs those values out of the response (secret.reflected) and, after a
// WebSocket upgrade, checks the guest's frames for placeholders.
func (p *Pipeline) Request(r *http.Request) (*Refusal, func(*http.Response) error) {
	b := p.Bindings()
	set := b.Swap
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	// What can be refused from the headers alone is refused before any
	// of the body is read.
	if ref := p.resignSigV4(b, r, host, nil, true); ref != nil {
		return ref, nil
	}
	// Credential-shaped strings that are not our placeholders: scanned on
	// the request as the guest sent it, before any swap.
	if ref := p.exfilScan(b, r, host); ref != nil {
		return ref, nil
	}
	reals := &Reals{}
	if ref := p.resignSigV4(b, r, host, reals, false); ref != nil {
		return ref, nil
	}
	if ref := p.resignHMAC(b, r, host, reals); ref != nil {
		return ref, nil
	}
	streaming := false
	if set != nil {
		res, err := set.ApplyReport(r, host, r.TLS != nil, func(name, real, ph string) {
			reals.Add(Swap{Name: name, Real: real, Placeholder: ph})
		})
		if err != nil {
			p.emit(api.SecretError{Host: host, Error: err.Error()})
			return &Refusal{Rule: "secret", Reason: err.Error()}, nil
		}
		if res.Refusal != nil {
			v := api.SecretVerdict{Host: host, Method: r.Method, Path: r.URL.Path, Rule: res.Refusal.Rule, Reason: res.Refusal.Reason}
			if res.Alert {
				p.emit(api.SecretAlert(v))
			} else {
				p.emit(api.SecretRefused(v))
			}
			return &Refusal{Rule: res.Refusal.Rule, Reason: res.Refusal.Reason}, nil
		}
		if len(res.Replaced) > 0 {
			p.emit(api.SecretUsed{Host: host, Method: r.Method, Path: r.URL.Path, Names: res.Replaced})
		}
		if res.Streaming {
			reals.SetPending()
			streaming = true
		}
	}
	if r.TLS == nil || (reals.Len() == 0 && !b.bound(host)) {
		return nil, nil
	}
	// Frames must stay readable on a bound host; a response that may carry
	// a real value must come in an encoding the scrub decodes.
	r.Header.Del("Sec-WebSocket-Extensions")
	if reals.Len() > 0 || streaming {
		NarrowAcceptEncoding(r)
	}
	method, path := r.Method, r.URL.Path
	scrub := &Scrub{
		Reals:             reals,
		Placeholder:       b.placeholderIn,
		PlaceholderWindow: b.placeholderWindow(),
		OnReflect: func(ref Reflection) {
			p.emit(api.SecretReflected{Host: host, Method: method, Path: path, Name: ref.Name, Where: ref.Where, Encoding: ref.Encoding})
		},
		OnAlert: func(al Alert) {
			p.emit(api.SecretAlert{Host: host, Method: method, Path: path, Rule: "secret:" + al.Name, Reason: al.Reason})
		},
	}
	return nil, scrub.Filter
}

// Denied raises secret.alert when a request the proxy refused (policy,
// fronting, literal IPs, …) carries one of the sandbox's placeholders in
// its URL or headers: the request is already refused, but a credential
// heading somewhere it may not go is what an operator wants to hear about.
// It reads no body.
func (p *Pipeline) Denied(r *http.Request, host string) {
	var text strings.Builder
	text.WriteString(r.URL.String())
	for k, vs := range r.Header {
		for _, v := range vs {
			text.WriteString("\n" + k + ": " + v)
		}
	}
	if name, found := p.Bindings().placeholderIn(text.String()); found {
		p.emit(api.SecretAlert{Host: host, Method: r.Method, Path: r.URL.Path, Rule: "secret:" + name, Reason: fmt.Sprintf("placeholder for %s sent to %s, which the policy denies", name, host)})
	}
}

// exfilScan scans r for credential-shaped strings within the configured
// budget. Under "block" a finding, or a part of the request the scan could
// not cover (a spent budget, a body longer than the scan window or of
// unknown length, a body that failed to arrive), is a 403: block refuses
// what it cannot scan. Under "flag" findings and spent budgets are events.
func (p *Pipeline) exfilScan(bs *Bindings, r *http.Request, host string) *Refusal {
	if p.cfg.Exfil == ExfilOff {
		return nil
	}
	det, err := detector()
	if err != nil {
		// Config.Check loaded it; this cannot happen, and must not pass.
		return &Refusal{Rule: "builtin:exfil-unscanned", Reason: "the exfil scan is unavailable"}
	}
	b := p.cfg.ExfilScan
	if p.cfg.Exfil != ExfilBlock && r.ContentLength < 0 {
		// A stream is not read ahead under flag: a client waiting for an
		// answer before sending more would stall.
		b.Body = 0
	}
	res, err := det.ScanBudget(r, b, known{bs})
	for _, f := range res.Findings {
		p.emit(api.SecretExfilSuspect{Host: host, Method: r.Method, Path: r.URL.Path, Rule: f.Rule, Where: f.Where, Preview: f.Preview, Mode: p.cfg.Exfil})
	}
	block := p.cfg.Exfil == ExfilBlock
	if block && len(res.Findings) > 0 {
		f := res.Findings[0]
		return &Refusal{Rule: f.Rule, Reason: "request carries a credential-shaped string (" + f.Rule + " in " + f.Where + ", …" + strings.TrimPrefix(f.Preview, "…") + ")"}
	}
	if res.Complete {
		return nil
	}
	if res.Limit == substitute.LimitBody && !block && err == nil {
		return nil // under flag, bodies are scanned as far as the window reaches
	}
	p.emit(api.SecretExfilUnscanned{Host: host, Method: r.Method, Path: r.URL.Path, Limit: res.Limit, Unscanned: res.Gap, ScannedBytes: res.Scanned, Mode: p.cfg.Exfil})
	if !block {
		return nil
	}
	reason := "the exfil scan (--exfil block) could not cover the request: " + res.Gap + "; block refuses what it cannot scan"
	switch res.Limit {
	case substitute.LimitBytes:
		reason += fmt.Sprintf(" (scan budget %d bytes, --exfil-scan-bytes)", p.cfg.ExfilScan.Bytes)
	case substitute.LimitTime:
		reason += fmt.Sprintf(" (scan time budget %s, --exfil-scan-time)", p.cfg.ExfilScan.Time)
	case substitute.LimitBody:
		reason += fmt.Sprintf(" (scan window %d body bytes, --exfil-scan-body); send less", b.Body)
	}
	return &Refusal{Rule: "builtin:exfil-unscanned", Reason: reason}
}

// refuse emits kind (secret.alert, else secret.refused) for binding name
// and returns the refusal naming it.
func (p *Pipeline) refuse(r *http.Request, host, name string, kind api.EventKind, reason string) *Refusal {
	v := api.SecretVerdict{Host: host, Method: r.Method, Path: r.URL.Path, Rule: "secret:" + name, Reason: reason}
	if kind == api.EventSecretAlert {
		p.emit(api.SecretAlert(v))
	} else {
		p.emit(api.SecretRefused(v))
	}
	return &Refusal{Rule: v.Rule, Reason: reason}
}

// resignHMAC handles requests carrying an HMAC signature made with a
// sandbox's placeholder key: re-signed with the real key for a bound host
// (one the secret's current hosts still cover, which Real checks) over
// intercepted TLS; refused with an alert when such a signature heads
// anywhere else; refused when it does not verify on a bound host. A
// request without the binding's header passes untouched.
func (p *Pipeline) resignHMAC(bs *Bindings, r *http.Request, host string, reals *Reals) *Refusal {
	for _, b := range bs.HMAC {
		if r.Header.Get(b.Signer.Header) == "" {
			continue
		}
		bound := r.TLS != nil && hostname.MatchAny(b.Hosts, host)
		why := "bound to " + strings.Join(b.Hosts, ", ")
		var real []byte
		if bound {
			var err error
			real, err = b.Real(host)
			switch {
			case errors.Is(err, ErrNotBound):
				// The secret's hosts no longer cover host: as if the
				// binding did not name it.
				bound, why = false, err.Error()
			case err != nil:
				return p.refuse(r, host, b.Name, api.EventSecretRefused, fmt.Sprintf("%s cannot be used: %v", b.Name, err))
			}
		}
		if !bound {
			// Another header of the same name is none of our business;
			// a signature made with our placeholder key is — but only
			// worth an alert, so it is checked only when that is cheap:
			// a signature over no body or a small one of known length.
			if signsSmallBody(b.Signer, r) && b.Signer.Verify(r) == nil {
				return p.refuse(r, host, b.Name, api.EventSecretAlert, fmt.Sprintf("request signed with the placeholder key of %s sent to %s (%s)", b.Name, host, why))
			}
			continue
		}
		s := *b.Signer
		s.Real = real
		s.Report = reals.AddFunc(b.Name)
		if err := s.Resign(r); err != nil {
			ref := p.refuse(r, host, b.Name, api.EventSecretRefused, fmt.Sprintf("HMAC signature of %s: %v", b.Name, err))
			if errors.Is(err, resign.ErrBodyTooLarge) {
				ref.Status = http.StatusRequestEntityTooLarge
			}
			return ref
		}
		p.emit(api.SecretUsed{Host: host, Method: r.Method, Path: r.URL.Path, Names: []string{b.Name}, Resigned: "hmac"})
		return nil
	}
	return nil
}

// resignSigV4 handles requests signed with a sandbox's placeholder AWS key:
// re-signed with the real key for a bound host (one the secret's current
// hosts still cover, which Real checks) over intercepted TLS, refused
// (with an alert) anywhere else or when the signature does not verify. It runs before the generic swap, which must not touch them. With
// headersOnly it only refuses what the headers show (the placeholder key
// headed for a host it is not bound to) and reads no body; otherwise every
// real-key output it puts in is recorded in reals for the response scrub.
func (p *Pipeline) resignSigV4(bs *Bindings, r *http.Request, host string, reals *Reals, headersOnly bool) *Refusal {
	if len(bs.SigV4) == 0 {
		return nil
	}
	cred := r.Header.Get("Authorization") + " " + r.URL.Query().Get("X-Amz-Credential")
	for _, b := range bs.SigV4 {
		if !strings.Contains(cred, b.Placeholder.AccessKeyID) {
			continue
		}
		if r.TLS == nil || !hostname.MatchAny(b.Hosts, host) {
			return p.refuse(r, host, b.Name, api.EventSecretAlert, fmt.Sprintf("AWS request signed with the placeholder key of %s sent to %s (bound to %s)", b.Name, host, strings.Join(b.Hosts, ", ")))
		}
		if headersOnly {
			return nil
		}
		real, err := b.Real(host)
		if errors.Is(err, ErrNotBound) {
			// The secret's hosts no longer cover host: as if the
			// binding did not name it.
			return p.refuse(r, host, b.Name, api.EventSecretAlert, fmt.Sprintf("AWS request signed with the placeholder key of %s sent to %s (%v)", b.Name, host, err))
		}
		if err != nil {
			return p.refuse(r, host, b.Name, api.EventSecretRefused, fmt.Sprintf("%s cannot be used: %v", b.Name, err))
		}
		s := &resign.SigV4{Placeholder: b.Placeholder, Real: real, Report: reals.AddFunc(b.Name)}
		if err := s.Resign(r); err != nil {
			ref := p.refuse(r, host, b.Name, api.EventSecretRefused, fmt.Sprintf("AWS signature of %s: %v", b.Name, err))
			if errors.Is(err, resign.ErrBodyTooLarge) {
				ref.Status = http.StatusRequestEntityTooLarge
			}
			return ref
		}
		// The body may still fail its check as it streams (a payload
		// hash, an aws-chunked signature): refuse it then, by name.
		if r.Body != nil && r.Body != http.NoBody {
			name := b.Name
			r.Body = &refusingBody{ReadCloser: r.Body, refuse: func(err error) error {
				return p.refuse(r, host, name, api.EventSecretRefused, fmt.Sprintf("AWS signature of %s: %v", name, err))
			}}
		}
		p.emit(api.SecretUsed{Host: host, Method: r.Method, Path: r.URL.Path, Names: []string{b.Name}, Resigned: "sigv4"})
		return nil
	}
	return nil
}

// signsSmallBody reports whether checking h's signature on r reads at most
// unboundVerifyMax body bytes.
func signsSmallBody(h *resign.HMAC, r *http.Request) bool {
	if !slices.Contains(h.Canonical, "body") || r.Body == nil || r.Body == http.NoBody {
		return true
	}
	return r.ContentLength >= 0 && r.ContentLength <= unboundVerifyMax
}

// refusingBody turns a re-signer's failure on a streaming body into a
// *Refusal, so the sandbox gets a 403 naming the secret instead of a
// broken upstream request.
type refusingBody struct {
	io.ReadCloser
	once   sync.Once
	refuse func(error) error
	err    error
}

func (b *refusingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && (errors.Is(err, resign.ErrBadSignature) || errors.Is(err, resign.ErrUnsupported)) {
		b.once.Do(func() { b.err = b.refuse(err) })
		return n, b.err
	}
	return n, err
}
