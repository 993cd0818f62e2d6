package daemon

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// A tenant's websocket relay URL cannot reach the host's loopback, private
// or metadata addresses.
func TestRelayPublicClientRefusesPrivate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hits := 0
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++ }))
	for _, u := range []string{"http://" + ln.Addr().String() + "/", "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1:1/", "http://[::1]:1/"} {
		resp, err := publicClient.Get(u)
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: reached (status %d), want refused", u, resp.StatusCode)
			continue
		}
		if !strings.Contains(err.Error(), "relay dial") {
			t.Errorf("%s: %v, want the relay dialer's refusal", u, err)
		}
	}
	if hits != 0 {
		t.Errorf("the loopback server was reached %d times", hits)
	}
}
