package safedial

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"time"
)

// HTTPClient returns an HTTP client that dials only through d: no proxy
// from the environment, no redirects followed (a redirect's answer is
// returned as it is), TLS verified against roots (nil: the system's), and
// every phase bounded.
func (d *Dialer) HTTPClient(roots *x509.CertPool) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           d.DialContext,
			TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout:   15 * time.Second,
			ResponseHeaderTimeout: time.Minute,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
