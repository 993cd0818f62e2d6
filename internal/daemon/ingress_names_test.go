package daemon

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The API and console are not served under the ingress domain, where
// guests' pages live and can set cookies.
func TestAPINotUnderIngressDomain(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	h := notUnderIngress(IngressConfig{Addr: "127.0.0.1:0", Domain: "sb.example.com"}, ok)
	for host, want := range map[string]int{
		"sb.example.com":                          421,
		"SB.example.com.:8443":                    421,
		"api.sb.example.com":                      421,
		"8080-sb-0123456789abcdef.sb.example.com": 421,
		"cagebox.example.com:8443":                200,
		"127.0.0.1:8443":                          200,
		"xsb.example.com":                         200,
	} {
		r := httptest.NewRequest("GET", "/ui/", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("Host %s: %d, want %d", host, w.Code, want)
		}
	}
	if h := notUnderIngress(IngressConfig{}, ok); h == nil {
		t.Fatal("nil handler without ingress")
	}
}
