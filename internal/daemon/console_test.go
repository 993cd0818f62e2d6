package daemon

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/cagebox/cagebox/internal/store/sqlite"
)

// TestConsoleNotOnIngressNames: with --ingress-domain D, the console is
// not served on D or any PORT-ID.D (a guest's page there would share its
// cookies), and is on the API's own name.
func TestConsoleNotOnIngressNames(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "cagebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv := NewServer(st, nil, nil, nil, slog.New(slog.DiscardHandler))
	srv.ingressDomain = "sb.example.test"
	for host, want := range map[string]int{
		"8080-sb0123456789.sb.example.test:8443": http.StatusMisdirectedRequest,
		"sb.example.test":                        http.StatusMisdirectedRequest,
		"API.SB.example.test.:7070":              http.StatusMisdirectedRequest,
		"cagebox.example.test:7070":              http.StatusOK,
		"notsb.example.test":                     http.StatusOK,
	} {
		r := httptest.NewRequest("GET", "http://"+host+"/ui/login", nil)
		r.Host = host
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("GET /ui/login on %s: %d, want %d", host, w.Code, want)
		}
	}
}
