package sniff

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// realHello is the first flight of a crypto/tls client with conf.
func realHello(t *testing.T, conf *tls.Config) []byte {
	t.Helper()
	c, s := net.Pipe()
	go func() {
		_ = tls.Client(c, conf).Handshake()
		c.Close()
	}()
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf bytes.Buffer
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(s, hdr); err != nil {
		t.Fatal(err)
	}
	n := int(hdr[3])<<8 | int(hdr[4])
	body := make([]byte, n)
	if _, err := io.ReadFull(s, body); err != nil {
		t.Fatal(err)
	}
	s.Close()
	buf.Write(hdr)
	buf.Write(body)
	return buf.Bytes()
}

// split re-frames a one-record ClientHello into records of at most n
// handshake bytes each.
func split(rec []byte, n int) []byte {
	var out []byte
	hs := rec[5:]
	for len(hs) > 0 {
		k := min(n, len(hs))
		out = append(out, 0x16, rec[1], rec[2], byte(k>>8), byte(k))
		out = append(out, hs[:k]...)
		hs = hs[k:]
	}
	return out
}

func TestClientHello(t *testing.T) {
	withSNI := realHello(t, &tls.Config{ServerName: "8080-sb-0123456789abcdef.example.test", NextProtos: []string{"h2", "http/1.1"}})
	noSNI := realHello(t, &tls.Config{InsecureSkipVerify: true})
	after := []byte("rest of the stream")
	for _, tc := range []struct {
		name   string
		in     []byte
		size   int
		sni    string
		protos int
		err    error
	}{
		{"one record", withSNI, 16 << 10, "8080-sb-0123456789abcdef.example.test", 2, nil},
		{"several records", split(withSNI, 100), 16 << 10, "8080-sb-0123456789abcdef.example.test", 2, nil},
		{"no SNI", noSNI, 16 << 10, "", 0, nil},
		{"over the limit", withSNI, 256, "", 0, ErrTooLarge},
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 4096, "", 0, ErrNotTLS},
		{"truncated", withSNI[:len(withSNI)-10], 16 << 10, "", 0, ErrNotTLS},
		{"header split over records", split(withSNI, 2), 16 << 10, "", 0, ErrNotTLS},
		{"garbage hello", append([]byte{0x16, 3, 1, 0, 8, 1, 0, 0, 4}, 'a', 'b', 'c', 'd'), 4096, "", 0, ErrNotTLS},
		{"empty record", []byte{0x16, 3, 1, 0, 0}, 4096, "", 0, ErrNotTLS},
		{"server hello", []byte{0x16, 3, 3, 0, 4, 2, 0, 0, 0}, 4096, "", 0, ErrNotTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]byte(nil), tc.in...)
			if tc.err == nil {
				in = append(in, after...)
			}
			br := bufio.NewReaderSize(bytes.NewReader(in), tc.size)
			h, err := ClientHello(br)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("ClientHello = %+v, %v; want %v", h, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.ServerName != tc.sni || len(h.Protos) != tc.protos || h.Len != len(tc.in) {
				t.Errorf("ClientHello = %+v, want SNI %q, %d protos, len %d", h, tc.sni, tc.protos, len(tc.in))
			}
			// Nothing was consumed: the whole stream replays.
			all, _ := io.ReadAll(br)
			if !bytes.Equal(all, in) {
				t.Error("ClientHello consumed bytes")
			}
		})
	}
}

// A ClientHello that never ends is cut by the caller's read deadline.
func TestClientHelloDeadline(t *testing.T) {
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	hello := realHello(t, &tls.Config{ServerName: "a.example.test"})
	go func() { _, _ = c.Write(hello[:len(hello)/2]) }()
	_ = s.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	start := time.Now()
	_, err := ClientHello(bufio.NewReaderSize(s, 16<<10))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("ClientHello = %v, want a timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("cut after %v", d)
	}
}

func TestClassify(t *testing.T) {
	for in, want := range map[string]Kind{
		"\x16\x03\x01":        TLS,
		"GET / HTTP/1.1\r\n":  HTTP,
		"M-SEARCH * HTTP/1.1": HTTP,
		"SSH-2.0-OpenSSH\r\n": TCP,
		" GET":                TCP,
		"get / HTTP/1.1":      TCP,
		"ABCDEFGHIJKLMNOPQRS": TCP,
	} {
		if got, err := Classify(bufio.NewReader(bytes.NewReader([]byte(in)))); got != want || err != nil {
			t.Errorf("Classify(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	c, s := net.Pipe()
	defer c.Close()
	_ = s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if got, err := Classify(bufio.NewReader(s)); got != Silent || err != nil {
		t.Errorf("silent flow: %v, %v", got, err)
	}
}
