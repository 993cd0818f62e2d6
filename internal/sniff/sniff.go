// Package sniff reads the first bytes of a TCP flow without consuming
// them: whether it is a TLS handshake, an HTTP request or something else
// (Classify), and a TLS ClientHello's server name and ALPN protocols
// (ClientHello), so that the caller can then hand the untouched stream on
// (Conn replays what was peeked). The egress proxy classifies sandbox
// flows with it; the fleet router routes TLS connections by their SNI
// with it, without terminating TLS.
package sniff

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Kind is what a flow's first bytes look like.
type Kind int

// Flow kinds.
const (
	// TLS is a TLS handshake record.
	TLS Kind = iota + 1
	// HTTP is an HTTP/1 request line ("METHOD ").
	HTTP
	// TCP is anything else.
	TCP
	// Silent is a flow that sent nothing before the read deadline (a
	// server-speaks-first protocol, or a slow client).
	Silent
)

// Classify peeks at the first bytes of a flow: a TLS handshake record, an
// HTTP request line ("METHOD "), or anything else (raw TCP). A flow that
// sends nothing before the read deadline is Silent. Nothing is consumed.
func Classify(br *bufio.Reader) (Kind, error) {
	b, err := br.Peek(1)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return Silent, nil
		}
		return 0, err
	}
	if b[0] == recordTypeHandshake {
		return TLS, nil
	}
	const maxMethod = 16
	for n := 1; n <= maxMethod; n++ {
		b, err := br.Peek(n)
		if err != nil {
			return TCP, nil
		}
		switch c := b[n-1]; {
		case c == ' ' && n > 1:
			return HTTP, nil
		case c >= 'A' && c <= 'Z', c == '-' || c == '_':
		default:
			return TCP, nil
		}
	}
	return TCP, nil
}

// Conn is a connection whose first bytes were peeked through R: reads
// come from R (the peeked bytes first), everything else from Conn.
type Conn struct {
	net.Conn
	R *bufio.Reader
}

// NewConn replays br's buffered bytes ahead of c's.
func NewConn(c net.Conn, br *bufio.Reader) *Conn { return &Conn{Conn: c, R: br} }

func (c *Conn) Read(b []byte) (int, error) { return c.R.Read(b) }

// CloseWrite half-closes the underlying connection when it can.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// TLS record framing (RFC 8446 §5.1).
const (
	recordTypeHandshake  = 0x16
	recordHeaderLen      = 5
	maxPlaintext         = 1 << 14
	handshakeClientHello = 1
)

// Errors of ClientHello.
var (
	// ErrNotTLS: the flow does not start with a TLS ClientHello.
	ErrNotTLS = errors.New("not a TLS ClientHello")
	// ErrTooLarge: the ClientHello does not fit in the reader's buffer.
	ErrTooLarge = errors.New("TLS ClientHello larger than the limit")
)

// Hello is what ClientHello read.
type Hello struct {
	// ServerName is the SNI as sent (crypto/tls refuses a trailing dot);
	// "" when the client sent none.
	ServerName string
	// Protos is the ALPN list.
	Protos []string
	// Len is how many bytes of the stream the ClientHello's records take.
	Len int
}

// ClientHello peeks a whole TLS ClientHello (which may span several
// records) from br without consuming it, and parses it. The ClientHello
// may be at most br.Size() bytes (ErrTooLarge otherwise), so br's size is
// the limit; the caller bounds the time with a read deadline, which
// counts for the whole ClientHello, not per read. Framing is checked here;
// the message itself is parsed by crypto/tls (on a copy of the bytes, on
// a connection that cannot write), so the router accepts exactly the
// ClientHellos Go's TLS stack does.
func ClientHello(br *bufio.Reader) (*Hello, error) {
	off := 0    // bytes of records peeked so far
	hsLen := -1 // the handshake message's length with its header, once known
	got := 0    // handshake bytes seen so far
	for hsLen < 0 || got < hsLen {
		hdr, err := peek(br, off+recordHeaderLen)
		if err != nil {
			return nil, err
		}
		hdr = hdr[off:]
		if hdr[0] != recordTypeHandshake || hdr[1] != 3 {
			return nil, ErrNotTLS
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > maxPlaintext {
			return nil, fmt.Errorf("%w: record length %d", ErrNotTLS, n)
		}
		rec, err := peek(br, off+recordHeaderLen+n)
		if err != nil {
			return nil, err
		}
		frag := rec[off+recordHeaderLen:]
		if hsLen < 0 {
			if len(frag) < 4 {
				// A handshake header split over records: legal, never seen
				// from a real client; refuse rather than reassemble.
				return nil, fmt.Errorf("%w: handshake header split over records", ErrNotTLS)
			}
			if frag[0] != handshakeClientHello {
				return nil, fmt.Errorf("%w: handshake type %d", ErrNotTLS, frag[0])
			}
			hsLen = 4 + (int(frag[1])<<16 | int(frag[2])<<8 | int(frag[3]))
		}
		got += n
		off += recordHeaderLen + n
	}
	if got != hsLen {
		// More handshake bytes than the ClientHello in its records: a
		// client sends nothing else before the server answers.
		return nil, fmt.Errorf("%w: trailing handshake data", ErrNotTLS)
	}
	raw, _ := br.Peek(off)
	h, err := parse(raw)
	if err != nil {
		return nil, err
	}
	h.Len = off
	return h, nil
}

// peek is br.Peek with ErrTooLarge for a full buffer.
func peek(br *bufio.Reader, n int) ([]byte, error) {
	if n > br.Size() {
		return nil, ErrTooLarge
	}
	b, err := br.Peek(n)
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, ErrTooLarge
	}
	if err == io.EOF && len(b) > 0 {
		err = fmt.Errorf("%w: connection closed inside the ClientHello", ErrNotTLS)
	}
	return b, err
}

// errGotHello ends the handshake once the ClientHello is parsed.
var errGotHello = errors.New("sniff: got the ClientHello")

// parse runs crypto/tls's server handshake on raw up to the point where
// the ClientHello is parsed (GetConfigForClient), then stops it.
func parse(raw []byte) (*Hello, error) {
	var h *Hello
	conf := &tls.Config{
		GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			h = &Hello{ServerName: hi.ServerName, Protos: append([]string(nil), hi.SupportedProtos...)}
			return nil, errGotHello
		},
	}
	err := tls.Server(&replay{b: raw}, conf).Handshake()
	if h == nil {
		return nil, fmt.Errorf("%w: %v", ErrNotTLS, err)
	}
	return h, nil
}

// replay is a read-only net.Conn over bytes already read: writes fail, so
// crypto/tls sends no alert anywhere.
type replay struct {
	b []byte
}

func (r *replay) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func (*replay) Write([]byte) (int, error)        { return 0, io.ErrClosedPipe }
func (*replay) Close() error                     { return nil }
func (*replay) LocalAddr() net.Addr              { return nil }
func (*replay) RemoteAddr() net.Addr             { return nil }
func (*replay) SetDeadline(time.Time) error      { return nil }
func (*replay) SetReadDeadline(time.Time) error  { return nil }
func (*replay) SetWriteDeadline(time.Time) error { return nil }
