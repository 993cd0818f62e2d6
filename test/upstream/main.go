// Command upstream is a stand-in for public HTTPS services in demos and
// benchmarks on a machine without internet: it makes its own CA, serves
// HTTPS (HTTP/1.1 and HTTP/2) on loopback for the names given, and answers
// every request with what it saw. The daemon reaches it through
// `--resolve NAME:443=ADDR:PORT --upstream-ca CA`.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/cagebox/cagebox/internal/testpki"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	names := flag.String("names", "api.example.test", "comma-separated DNS names for the certificate")
	caOut := flag.String("ca", "upstream-ca.pem", "where to write the CA certificate")
	addrOut := flag.String("addr-file", "", "write the bound address here")
	flag.Parse()

	pki, err := testpki.New(7*24*time.Hour, strings.Split(*names, ",")...)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*caOut, pki.CAPEM, 0o644); err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if *addrOut != "" {
		if err := os.WriteFile(*addrOut, []byte(ln.Addr().String()), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "upstream %s got %s %s over %s\n", r.Host, r.Method, r.URL.Path, r.Proto)
			// What arrived, on the host side only: echoing credentials back
			// would hand the real value to the guest.
			log.Printf("upstream received %s %s%s Authorization=%q", r.Method, r.Host, r.URL.Path, r.Header.Get("Authorization"))
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pki.Leaf}, NextProtos: []string{"h2", "http/1.1"}},
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Printf("upstream: https on %s for %s (CA in %s)", ln.Addr(), *names, *caOut)
	log.Fatal(srv.ServeTLS(ln, "", ""))
}
