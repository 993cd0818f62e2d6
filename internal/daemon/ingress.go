package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/hooks"
	"github.com/cagebox/cagebox/internal/hostname"
	"github.com/cagebox/cagebox/internal/ingress"
	"github.com/cagebox/cagebox/internal/sandbox"
)

// IngressConfig configures the inbound listener (package ingress).
type IngressConfig struct {
	// Addr is where it listens (host:port); "" = no ingress.
	Addr string
	// Domain D: ports are served as https://PORT-ID.D.
	Domain string
	// Cert and Key are PEM files for D and *.D; empty: a certificate
	// signed by the daemon's own ingress CA ($HOME/ingress/ca.pem).
	Cert, Key string
	// MaxBody bounds request bodies (0: ingress.DefaultMaxBody).
	MaxBody int64
	// Rate is each port's requests a second (a sandbox's: 4×; 0: the
	// default, 100; negative: no limit).
	Rate float64
	// PublicPort is the port in the URLs the daemon hands out (0: the
	// listener's own; set it behind a port-forward or load balancer).
	PublicPort int
	// PlainAddr also serves ingress over plain HTTP, on a loopback
	// address only: for a TLS-terminating proxy on the same host (which
	// must keep the Host header). Clients outside never reach it.
	PlainAddr string
}

// IngressDir is where the daemon keeps its ingress CA and URL-signing key.
func IngressDir(home string) string { return filepath.Join(home, "ingress") }

// startIngress runs the ingress listener until stop, which waits for it
// to close. srv (nil without --ingress) is also the path webhook
// deliveries and relays take to a guest (srv.Send).
func startIngress(cfg Config, mgr *sandbox.Manager, gw *gateway.Gateway, emit func(string, string, api.EventPayload), hooksSvc *hooks.Service, log *slog.Logger) (srv *ingress.Server, stop func(), err error) {
	ic := cfg.Ingress
	if ic.Addr == "" {
		return nil, func() {}, nil
	}
	domain, err := hostname.Parse(ic.Domain)
	if err != nil || ic.Domain == "" {
		return nil, nil, fmt.Errorf("--ingress-domain %q: want a DNS name such as sandboxes.example.com (its wildcard *.D must resolve to this host)", ic.Domain)
	}
	dir := IngressDir(cfg.Home)
	var tlsConf *tls.Config
	if ic.Cert != "" || ic.Key != "" {
		if ic.Cert == "" || ic.Key == "" {
			return nil, nil, errors.New("--ingress-cert and --ingress-key go together")
		}
		tlsConf, err = ingress.FromFiles(ic.Cert, ic.Key)
	} else {
		tlsConf, err = ingress.SelfSigned(dir, domain)
	}
	if err != nil {
		return nil, nil, err
	}
	key, err := ingress.LoadOrCreateKey(filepath.Join(dir, "url.key"))
	if err != nil {
		return nil, nil, fmt.Errorf("ingress url key: %w", err)
	}
	var mark uint32
	if gw != nil {
		mark = gw.Links().IngressMark()
	}
	srv = ingress.New(ingress.Config{
		Domain: domain, Backend: mgr.Ports(), Signer: &ingress.Signer{Key: key}, Emit: emit,
		Mark: mark, MaxBody: ic.MaxBody, Rate: ic.Rate, SandboxRate: sandboxRate(ic.Rate), Burst: int(2 * ic.Rate), SandboxBurst: int(8 * ic.Rate),
		Logger: log.With("component", "ingress"),
	})
	if hooksSvc != nil {
		srv.SetHooks(hooksSvc)
	}
	l, err := net.Listen("tcp", ic.Addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--ingress %s: %w", ic.Addr, err)
	}
	port := ic.PublicPort
	if port == 0 {
		port = l.Addr().(*net.TCPAddr).Port
	}
	suffix := ""
	if port != 443 {
		suffix = ":" + strconv.Itoa(port)
	}
	if hooksSvc != nil {
		hooksSvc.SetBaseURL("https://hooks." + strings.TrimSuffix(domain, ".") + suffix)
	}
	mgr.Ports().SetIngress(&sandbox.Ingress{
		Signer: &ingress.Signer{Key: key},
		URL: func(id string, p uint16) string {
			return "https://" + ingress.HostFor(id, p, domain) + suffix + "/"
		},
		PathURL: func(id string, p uint16) string {
			return "https://" + strings.TrimSuffix(domain, ".") + suffix + "/s/" + id + "/" + strconv.Itoa(int(p)) + "/"
		},
		OnRevoke: srv.Revoke,
	})
	var pl net.Listener
	if ic.PlainAddr != "" {
		host, _, err := net.SplitHostPort(ic.PlainAddr)
		if err != nil {
			l.Close()
			return nil, nil, fmt.Errorf("--ingress-plain %q: want HOST:PORT on loopback, e.g. 127.0.0.1:8443", ic.PlainAddr)
		}
		if ok, what, err := loopbackOnly(context.Background(), host); err != nil || !ok {
			l.Close()
			if err == nil {
				err = fmt.Errorf("%s is %s", host, what)
			}
			return nil, nil, fmt.Errorf("--ingress-plain %s: plain HTTP is served on loopback only, for a TLS-terminating proxy on this host: %w", ic.PlainAddr, err)
		}
		if pl, err = net.Listen("tcp", ic.PlainAddr); err != nil {
			l.Close()
			return nil, nil, fmt.Errorf("--ingress-plain %s: %w", ic.PlainAddr, err)
		}
	}
	hs := srv.HTTPServer(tlsConf)
	var ps *http.Server
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("ingress listener", "err", err)
		}
	}()
	plainDone := make(chan struct{})
	if pl != nil {
		ps = srv.HTTPServer(nil)
		go func() {
			defer close(plainDone)
			if err := ps.Serve(pl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("ingress plain listener", "err", err)
			}
		}()
		log.Info("ingress also on plain HTTP (loopback, for a TLS-terminating proxy)", "addr", pl.Addr().String())
	} else {
		close(plainDone)
	}
	attrs := []any{"addr", l.Addr().String(), "domain", domain}
	if ic.Cert == "" {
		attrs = append(attrs, "ca", ingress.CAPath(dir))
	}
	log.Info("ingress listening", attrs...)
	return srv, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		if ps != nil {
			_ = ps.Shutdown(sctx)
		}
		<-done
		<-plainDone
	}, nil
}

func sandboxRate(r float64) float64 {
	if r < 0 {
		return -1
	}
	return 4 * r // 0 stays 0: the default
}

// notUnderIngress refuses (421) requests to the API and console listener
// under the ingress domain D or a name below it: browsers send a host's
// cookies to every port of it, and a guest's page on PORT-ID.D can set
// cookies for D and every name below it, so the console's session cookie
// must never live there. Without ingress h is returned as it is.
func notUnderIngress(ic IngressConfig, h http.Handler) http.Handler {
	if ic.Addr == "" || ic.Domain == "" {
		return h
	}
	d := strings.ToLower(strings.TrimSuffix(ic.Domain, "."))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := strings.ToLower(r.Host)
		if hh, _, err := net.SplitHostPort(host); err == nil {
			host = hh
		}
		if underDomain(d, strings.TrimSuffix(host, ".")) {
			http.Error(w, "this is the cagebox API, which is not served under the ingress domain "+d+" (sandboxes' pages live there): use the API's own host name", http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// underDomain reports whether host (lower case, no port or trailing dot)
// is the ingress domain d or a name below it; "" d is no domain.
func underDomain(d, host string) bool {
	return d != "" && (host == d || strings.HasSuffix(host, "."+d))
}
