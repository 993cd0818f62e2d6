package credentials

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The WebSocket frame reader below is hand-written: the gateway needs the
// frames of an already-upgraded connection handed to it as a byte stream
// (httputil.ReverseProxy's 101 handling), masked client frames read as
// they are and forwarded byte for byte, and server frames re-encoded after
// a rewrite. Libraries (golang.org/x/net/websocket, coder/websocket) own
// the handshake and hide the frames; RFC 6455's framing is small.

// WebSocket opcodes.
const (
	opCont   = 0x0
	opText   = 0x1
	opBinary = 0x2
	opClose  = 0x8
	opPing   = 0x9
	opPong   = 0xA
)

// frame is one parsed WebSocket frame.
type frame struct {
	fin     bool
	rsv     byte
	op      byte
	masked  bool
	key     [4]byte
	payload []byte // unmasked
	raw     int    // length on the wire
}

var errShort = errors.New("short frame")

// parseFrame reads one frame from b. errShort: b holds only part of it.
// A frame whose payload is over max is refused before it is read.
func parseFrame(b []byte, max int) (*frame, error) {
	if len(b) < 2 {
		return nil, errShort
	}
	f := &frame{fin: b[0]&0x80 != 0, rsv: b[0] >> 4 & 7, op: b[0] & 0x0f, masked: b[1]&0x80 != 0}
	n := uint64(b[1] & 0x7f)
	h := 2
	switch n {
	case 126:
		if len(b) < 4 {
			return nil, errShort
		}
		n, h = uint64(binary.BigEndian.Uint16(b[2:])), 4
	case 127:
		if len(b) < 10 {
			return nil, errShort
		}
		n, h = binary.BigEndian.Uint64(b[2:]), 10
		if n>>63 != 0 {
			return nil, errors.New("websocket: frame length with the top bit set")
		}
	}
	if f.op >= 0x8 && (n > 125 || !f.fin) {
		return nil, errors.New("websocket: control frame longer than 125 bytes or fragmented")
	}
	if n > uint64(max) {
		return nil, fmt.Errorf("websocket: a %d-byte frame is over the gateway's %d-byte inspection limit", n, max)
	}
	if f.masked {
		if len(b) < h+4 {
			return nil, errShort
		}
		copy(f.key[:], b[h:h+4])
		h += 4
	}
	if uint64(len(b)-h) < n {
		return nil, errShort
	}
	f.payload = make([]byte, n)
	copy(f.payload, b[h:h+int(n)])
	if f.masked {
		for i := range f.payload {
			f.payload[i] ^= f.key[i&3]
		}
	}
	f.raw = h + int(n)
	return f, nil
}

// readFrame reads one whole frame from r.
func readFrame(r *bufio.Reader, max int) (*frame, error) {
	for need := 2; ; {
		b, err := r.Peek(need)
		if err != nil && len(b) < need {
			if err == io.EOF && len(b) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		f, perr := parseFrame(b, max)
		if perr == nil {
			_, _ = r.Discard(f.raw)
			return f, nil
		}
		if perr != errShort {
			return nil, perr
		}
		need = frameNeed(b)
		if need > r.Size() {
			// A frame bigger than the buffer: read it whole.
			buf := make([]byte, need)
			if _, err := io.ReadFull(r, buf); err != nil {
				return nil, err
			}
			return parseFrame(buf, max)
		}
	}
}

// frameNeed is how many bytes the frame starting at b needs, as far as b
// tells.
func frameNeed(b []byte) int {
	if len(b) < 2 {
		return 2
	}
	n := int(b[1] & 0x7f)
	h := 2
	switch n {
	case 126:
		if len(b) < 4 {
			return 4
		}
		n, h = int(binary.BigEndian.Uint16(b[2:])), 4
	case 127:
		if len(b) < 10 {
			return 10
		}
		n, h = int(binary.BigEndian.Uint64(b[2:])), 10
	}
	if b[1]&0x80 != 0 {
		h += 4
	}
	return h + n
}

// appendFrame encodes an unmasked frame (server to client).
func appendFrame(out []byte, fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	out = append(out, b0)
	switch n := len(payload); {
	case n < 126:
		out = append(out, byte(n))
	case n <= 0xffff:
		out = append(out, 126, byte(n>>8), byte(n))
	default:
		out = append(out, 127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	return append(out, payload...)
}

// wsConn sits between the proxy and the upstream of an upgraded
// connection. Reads are upstream→guest frames, scrubbed of real values
// (a fragmented message is gathered, up to MaxFrame, scrubbed and sent as
// one frame, as RFC 6455 lets an intermediary do without extensions);
// writes are guest→upstream frames, checked for placeholders and
// forwarded unchanged. Frames with reserved bits (a compression extension
// the gateway did not let through) end the connection.
type wsConn struct {
	s   *Scrub
	up  io.ReadWriteCloser
	br  *bufio.Reader
	m   *matcher
	max int

	// upstream → guest
	out   []byte
	msg   []byte
	msgOp byte
	inMsg bool

	// guest → upstream
	in   []byte
	look []byte
}

func (s *Scrub) newWSConn(up io.ReadWriteCloser, m *matcher) *wsConn {
	max := s.MaxFrame
	if max <= 0 {
		max = DefaultMaxFrame
	}
	return &wsConn{s: s, up: up, br: bufio.NewReaderSize(up, 64<<10), m: m, max: max}
}

func (c *wsConn) Close() error { return c.up.Close() }

func (c *wsConn) scrub(p []byte) []byte {
	if c.m.empty() || len(p) == 0 {
		return p
	}
	return []byte(scrubString(c.m, string(p), c.s.hits(c.m, "websocket")))
}

func (c *wsConn) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		f, err := readFrame(c.br, c.max)
		if err != nil {
			return 0, err
		}
		if f.rsv != 0 {
			return 0, errors.New("websocket: upstream frame with reserved bits (an extension) cannot be inspected")
		}
		if f.masked {
			return 0, errors.New("websocket: masked frame from the upstream")
		}
		switch {
		case f.op == opClose:
			pl := f.payload
			if len(pl) > 2 {
				pl = append(pl[:2:2], c.scrub(pl[2:])...)
				if len(pl) > 125 {
					pl = pl[:125]
				}
			}
			c.out = appendFrame(c.out, true, f.op, pl)
		case f.op == opPing || f.op == opPong:
			pl := c.scrub(f.payload)
			if len(pl) > 125 {
				pl = pl[:125]
			}
			c.out = appendFrame(c.out, true, f.op, pl)
		case f.op == opText || f.op == opBinary:
			if c.inMsg {
				return 0, errors.New("websocket: new message inside a fragmented one")
			}
			if f.fin {
				c.out = appendFrame(c.out, true, f.op, c.scrub(f.payload))
				continue
			}
			c.inMsg, c.msgOp, c.msg = true, f.op, f.payload
		case f.op == opCont:
			if !c.inMsg {
				return 0, errors.New("websocket: continuation frame outside a message")
			}
			if len(c.msg)+len(f.payload) > c.max {
				return 0, fmt.Errorf("websocket: fragmented message over the gateway's %d-byte inspection limit", c.max)
			}
			c.msg = append(c.msg, f.payload...)
			if f.fin {
				c.out = appendFrame(c.out, true, c.msgOp, c.scrub(c.msg))
				c.inMsg, c.msg = false, nil
			}
		default:
			return 0, fmt.Errorf("websocket: unknown opcode %#x from the upstream", f.op)
		}
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	if len(c.out) == 0 {
		c.out = nil
	}
	return n, nil
}

// Write takes guest bytes; whole frames are checked and forwarded.
func (c *wsConn) Write(p []byte) (int, error) {
	c.in = append(c.in, p...)
	for {
		f, err := parseFrame(c.in, c.max)
		if err == errShort {
			return len(p), nil
		}
		if err != nil {
			return 0, err
		}
		if f.rsv != 0 {
			return 0, errors.New("websocket: guest frame with reserved bits (an extension) cannot be inspected")
		}
		if !f.masked {
			return 0, errors.New("websocket: unmasked frame from the guest")
		}
		if c.s.Placeholder != nil && len(f.payload) > 0 {
			text := append(c.look, f.payload...)
			if name, found := c.s.Placeholder(string(text)); found {
				if c.s.OnAlert != nil {
					c.s.OnAlert(Alert{Name: name, Reason: fmt.Sprintf("placeholder for %s in a WebSocket frame: placeholders are swapped in the upgrade request's allowed places only", name)})
				}
				return 0, fmt.Errorf("websocket: guest frame carries the placeholder for %s", name)
			}
			w := max(c.s.PlaceholderWindow, 1)
			if len(text) > w {
				text = text[len(text)-w:]
			}
			c.look = append(c.look[:0], text...)
		}
		if _, err := c.up.Write(c.in[:f.raw]); err != nil {
			return 0, err
		}
		c.in = c.in[f.raw:]
		if len(c.in) == 0 {
			c.in = nil
		}
	}
}
