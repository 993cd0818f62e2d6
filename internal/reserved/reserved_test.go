package reserved_test

import (
	"net/http"
	"testing"

	"github.com/cagebox/cagebox/internal/console"
	"github.com/cagebox/cagebox/internal/ingress"
	"github.com/cagebox/cagebox/internal/reserved"
)

// Every name cagebox uses on the inbound path falls under the rule, so
// nothing strips a list that has fallen behind.
func TestCageboxNamesAreReserved(t *testing.T) {
	for _, c := range []string{console.CookieName, ingress.CookieName, "__Host-" + console.CookieName, "CBX_ACCESS", " cagebox_x"} {
		if !reserved.Cookie(c) {
			t.Errorf("cookie %q is not reserved", c)
		}
	}
	for _, h := range []string{ingress.AccessHeader, "X-Cagebox-Webhook-Verified", "x_cagebox_delivery", "X-CAGEBOX-ATTEMPT"} {
		if !reserved.Header(h) {
			t.Errorf("header %q is not reserved", h)
		}
	}
	for _, p := range []string{ingress.SigParam, "cbx%5Fsig", "CBX%5fSIG", "cbx%255Fsig", "cbx%25255Fsig", "cbx_s%69g", "+cbx_sig"} {
		if !reserved.Param(p) {
			t.Errorf("parameter %q is not reserved", p)
		}
	}
	for _, n := range []string{"session", "cbx", "xcbx_sig", "cagebox", "sig"} {
		if reserved.Cookie(n) || reserved.Param(n) {
			t.Errorf("%q is reserved", n)
		}
	}
	for _, h := range []string{"X-Cagebox", "X-Forwarded-For", "Cagebox-X"} {
		if reserved.Header(h) {
			t.Errorf("header %q is reserved", h)
		}
	}
}

func TestStripCookies(t *testing.T) {
	h := http.Header{"Cookie": {"a=1; cbx_access=x;; cagebox_session=y", "__Secure-cbx_z=1; b=2"}}
	reserved.StripCookies(h)
	if got := h.Values("Cookie"); len(got) != 1 || got[0] != "a=1; b=2" {
		t.Errorf("Cookie = %q", got)
	}
	h = http.Header{"Cookie": {"cagebox_session=y"}}
	reserved.StripCookies(h)
	if _, ok := h["Cookie"]; ok {
		t.Errorf("an empty Cookie header is left: %v", h)
	}
}
