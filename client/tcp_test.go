package client

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewTCPURLs(t *testing.T) {
	for _, u := range []string{"10.0.0.5:7070", "ftp://h:1", "https://", "http://user:pw@h:1", "https://h:1/v1", "https://h:1/?x=1", "::"} {
		if _, err := NewTCP(u, "k", Options{}); err == nil {
			t.Errorf("NewTCP(%q) accepted", u)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("error shows the password: %v", err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:7070", "https://cagebox.example.com:7070/", "https://[::1]:7070"} {
		if _, err := NewTCP(u, "k", Options{}); err != nil {
			t.Errorf("NewTCP(%q): %v", u, err)
		}
	}
	if _, err := NewTCP("http://127.0.0.1:7070", "k", Options{CACertFile: "/x.pem"}); err == nil {
		t.Error("a CA file with a plain HTTP URL accepted")
	}
	if _, err := NewTCP("https://h:1", "k", Options{CACertFile: filepath.Join(t.TempDir(), "none.pem")}); err == nil {
		t.Error("missing CA file accepted")
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	if _, err := NewTCP("https://h:1", "k", Options{CACertFile: notPEM}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("CA file without a certificate: %v", err)
	}
}

// TestNewTCPVerifiesWithCAFile: an https:// daemon whose certificate a
// private CA issued is trusted with the CA file, and refused without it; the
// API key goes only to the verified server.
func TestNewTCPVerifiesWithCAFile(t *testing.T) {
	var gotKey string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotKey = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"ok"}`))
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := NewTCP(srv.URL, "cbk_test", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v, want a certificate error", err)
	}
	if gotKey != "" {
		t.Fatal("the key reached an unverified server")
	}
	c, err = NewTCP(srv.URL, "cbk_test", Options{CACertFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	if gotKey != "Bearer cbk_test" {
		t.Errorf("key %q", gotKey)
	}
}
