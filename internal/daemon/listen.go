package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// ErrPlainListen refuses plain HTTP on a non-loopback address.
var ErrPlainListen = errors.New("refusing to serve the API in plain HTTP on a non-loopback address")

// apiListener is the API's TCP listener, opened by openAPIListener.
type apiListener struct {
	net.Listener
	tls *tls.Config // nil: plain HTTP
}

// openAPIListener checks the TCP listener settings and opens it. Plain
// HTTP is served on loopback addresses only: elsewhere API keys, secret
// values given inline and every byte of exec and file I/O would cross the
// network in clear. A certificate (TLSCert, TLSKey) makes it HTTPS on any
// address; InsecureListen allows plain HTTP anyway, with a warning. It
// returns nil when no TCP address is configured.
func openAPIListener(ctx context.Context, cfg Config, log *slog.Logger) (*apiListener, error) {
	return openListener(ctx, cfg, "--listen", log)
}

// openListener opens cfg.Listen as openAPIListener does, for the listener
// of flag (its name in messages): the E2B front's obeys the same rules.
func openListener(ctx context.Context, cfg Config, flag string, log *slog.Logger) (*apiListener, error) {
	withTLS := cfg.TLSCert != "" || cfg.TLSKey != ""
	if cfg.Listen == "" {
		if (withTLS || cfg.InsecureListen) && cfg.E2B.Listen == "" {
			return nil, errors.New("--tls-cert, --tls-key and --insecure-listen configure the TCP listener: give " + flag + " ADDR (or --e2b-listen ADDR) too")
		}
		return nil, nil
	}
	if withTLS && (cfg.TLSCert == "" || cfg.TLSKey == "") {
		return nil, errors.New("--tls-cert and --tls-key go together: give the certificate (PEM, with its chain) and its private key")
	}
	if withTLS && cfg.InsecureListen {
		return nil, errors.New("--insecure-listen allows plain HTTP; with --tls-cert the API is served over HTTPS: drop one of them")
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("%s %q: want HOST:PORT, e.g. 127.0.0.1:7070: %w", flag, cfg.Listen, err)
	}
	loopback, what, err := loopbackOnly(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", flag, cfg.Listen, err)
	}
	if !withTLS && !loopback && !cfg.InsecureListen {
		return nil, fmt.Errorf("%s %s (%s): %w: API keys and secret values would cross the network unencrypted; "+
			"serve HTTPS with --tls-cert FILE --tls-key FILE, listen on 127.0.0.1, or pass --insecure-listen on a network you trust",
			flag, cfg.Listen, what, ErrPlainListen)
	}
	var tc *tls.Config
	if withTLS {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s --tls-key %s: %w", cfg.TLSCert, cfg.TLSKey, err)
		}
		if cert.Leaf != nil && time.Now().After(cert.Leaf.NotAfter) {
			return nil, fmt.Errorf("--tls-cert %s: the certificate expired on %s", cfg.TLSCert, cert.Leaf.NotAfter.Format(time.DateOnly))
		}
		tc = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	if !withTLS && !loopback {
		log.Warn("INSECURE: the API is served in plain HTTP on a non-loopback address (--insecure-listen): "+
			"API keys, secret values and sandbox I/O cross the network unencrypted; use --tls-cert and --tls-key",
			"flag", flag, "addr", l.Addr().String(), "listening_on", what)
	}
	return &apiListener{Listener: l, tls: tc}, nil
}

// loopbackOnly reports whether host (of a listen address) stands for
// loopback addresses only, and describes it. A name is resolved (e.g.
// localhost from /etc/hosts); every address it has must be loopback.
func loopbackOnly(ctx context.Context, host string) (bool, string, error) {
	if host == "" {
		return false, "every address of the host", nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		switch {
		case a.IsUnspecified():
			return false, "every address of the host", nil
		case a.IsLoopback():
			return true, "loopback", nil
		}
		return false, "a non-loopback address", nil
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(rctx, "ip", host)
	if err != nil {
		return false, "", fmt.Errorf("resolve %s: %w", host, err)
	}
	for _, a := range addrs {
		if !a.Unmap().IsLoopback() {
			return false, "a name with non-loopback addresses", nil
		}
	}
	return len(addrs) > 0, "loopback", nil
}
