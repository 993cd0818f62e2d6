package credentials

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"io"
	"strings"
	"testing"
)

// clientFrame encodes a masked frame as a guest sends it.
func clientFrame(fin bool, rsv, op byte, payload []byte) []byte {
	b0 := op | rsv<<4
	if fin {
		b0 |= 0x80
	}
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, 0x80|byte(n))
	case n <= 0xffff:
		out = append(out, 0x80|126, byte(n>>8), byte(n))
	default:
		out = append(out, 0x80|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	key := []byte{0x12, 0x34, 0x56, 0x78}
	out = append(out, key...)
	for i, c := range payload {
		out = append(out, c^key[i&3])
	}
	return out
}

// serverFrame encodes an unmasked frame as an upstream sends it.
func serverFrame(fin bool, rsv, op byte, payload []byte) []byte {
	out := appendFrame(nil, fin, op, payload)
	out[0] |= rsv << 4
	return out
}

// fakeUp is the upstream side of an upgraded connection.
type fakeUp struct {
	r     io.Reader
	wrote bytes.Buffer
}

func (f *fakeUp) Read(p []byte) (int, error)  { return f.r.Read(p) }
func (f *fakeUp) Write(p []byte) (int, error) { return f.wrote.Write(p) }
func (f *fakeUp) Close() error                { return nil }

// readFrames decodes what the wsConn hands the guest.
func readFrames(t *testing.T, c io.Reader) []*frame {
	t.Helper()
	all, _ := io.ReadAll(c)
	var out []*frame
	for len(all) > 0 {
		f, err := parseFrame(all, 1<<30)
		if err != nil {
			t.Fatalf("frame to the guest: %v", err)
		}
		out = append(out, f)
		all = all[f.raw:]
	}
	return out
}

func wsScrub(t *testing.T, sw Swap, upstream []byte) (*wsConn, *fakeUp, *[]Reflection, *[]Alert) {
	var refl []Reflection
	var alerts []Alert
	s := &Scrub{Reals: &Reals{}, OnReflect: func(r Reflection) { refl = append(refl, r) }, OnAlert: func(a Alert) { alerts = append(alerts, a) },
		Placeholder: func(text string) (string, bool) {
			if strings.Contains(text, sw.Placeholder) || strings.Contains(text, base64.StdEncoding.EncodeToString([]byte(sw.Placeholder))[:20]) {
				return sw.Name, true
			}
			return "", false
		}, PlaceholderWindow: 2 * len(sw.Placeholder), MaxFrame: 1 << 17}
	s.Reals.Add(sw)
	swaps, _, _ := s.Reals.snapshot()
	up := &fakeUp{r: bytes.NewReader(upstream)}
	return s.newWSConn(up, newMatcher(swaps)), up, &refl, &alerts
}

// Upstream frames of every length encoding, fragmented messages with a
// value split across fragments and a ping between them, and a close
// reason: the guest gets the placeholder everywhere.
func TestWebSocketUpstreamFrames(t *testing.T) {
	sw := pair(t, "ghp_"+randFrom(t, alnum, 36))
	long := strings.Repeat("a", 70000) + sw.Real // 64-bit length
	mid := strings.Repeat("b", 300) + sw.Real    // 16-bit length
	var in []byte
	in = append(in, serverFrame(true, 0, opText, []byte("auth="+sw.Real))...)
	in = append(in, serverFrame(true, 0, opText, []byte(mid))...)
	in = append(in, serverFrame(true, 0, opBinary, []byte(long))...)
	in = append(in, serverFrame(false, 0, opText, []byte("split "+sw.Real[:10]))...)
	in = append(in, serverFrame(true, 0, opPing, []byte("p"))...)
	in = append(in, serverFrame(true, 0, opCont, []byte(sw.Real[10:]+" end"))...)
	in = append(in, serverFrame(true, 0, opClose, append([]byte{0x03, 0xe8}, "bye "+sw.Real...))...)
	c, _, refl, _ := wsScrub(t, sw, in)
	fs := readFrames(t, c)
	want := []struct {
		op   byte
		text string
	}{
		{opText, "auth=" + sw.Placeholder},
		{opText, strings.Repeat("b", 300) + sw.Placeholder},
		{opBinary, strings.Repeat("a", 70000) + sw.Placeholder},
		{opPing, "p"},
		{opText, "split " + sw.Placeholder + " end"},
		{opClose, "\x03\xe8bye " + sw.Placeholder},
	}
	if len(fs) != len(want) {
		t.Fatalf("%d frames, want %d", len(fs), len(want))
	}
	for i, w := range want {
		if fs[i].op != w.op || !fs[i].fin || string(fs[i].payload) != w.text {
			t.Errorf("frame %d: op %x fin %v %q…", i, fs[i].op, fs[i].fin, string(fs[i].payload)[:min(40, len(fs[i].payload))])
		}
	}
	if len(*refl) != 1 || (*refl)[0].Where != "websocket" {
		t.Errorf("reflections %+v", *refl)
	}
}

func TestWebSocketRefusesUninspectable(t *testing.T) {
	sw := pair(t, "ghp_"+randFrom(t, alnum, 36))
	for name, in := range map[string][]byte{
		"compressed (rsv1)":   serverFrame(true, 4, opText, []byte("x")),
		"masked from server":  clientFrame(true, 0, opText, []byte("x")),
		"over the limit":      serverFrame(true, 0, opBinary, make([]byte, 1<<17+1)),
		"long control frame":  append([]byte{0x89, 126, 0, 200}, make([]byte, 200)...),
		"continuation alone":  serverFrame(true, 0, opCont, []byte("x")),
		"fragmented too long": append(serverFrame(false, 0, opText, make([]byte, 1<<16+10)), serverFrame(true, 0, opCont, make([]byte, 1<<16+10))...),
	} {
		c, _, _, _ := wsScrub(t, sw, in)
		if _, err := io.ReadAll(c); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

// Guest frames: forwarded byte for byte, whatever the write boundaries;
// a placeholder in one (also split across frames, also base64) is an
// alert and an error that ends the connection.
func TestWebSocketGuestFrames(t *testing.T) {
	sw := pair(t, "ghp_"+randFrom(t, alnum, 36))
	clean := append(clientFrame(true, 0, opText, []byte("hello")), clientFrame(true, 0, opBinary, bytes.Repeat([]byte("z"), 300))...)
	c, up, _, alerts := wsScrub(t, sw, nil)
	for i := range clean { // one byte per write
		if _, err := c.Write(clean[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(up.wrote.Bytes(), clean) || len(*alerts) != 0 {
		t.Fatalf("forwarded %d of %d bytes, alerts %v", up.wrote.Len(), len(clean), *alerts)
	}
	for name, frames := range map[string][]byte{
		"literal": clientFrame(true, 0, opText, []byte("k="+sw.Placeholder)),
		"split": append(clientFrame(false, 0, opText, []byte("k="+sw.Placeholder[:7])),
			clientFrame(true, 0, opCont, []byte(sw.Placeholder[7:]))...),
		"base64":      clientFrame(true, 0, opBinary, []byte(base64.StdEncoding.EncodeToString([]byte(sw.Placeholder)))),
		"close":       clientFrame(true, 0, opClose, append([]byte{3, 232}, sw.Placeholder...)),
		"compressed":  clientFrame(true, 4, opText, []byte("x")),
		"unmasked":    serverFrame(true, 0, opText, []byte("x")),
		"over limit":  clientFrame(true, 0, opBinary, make([]byte, 1<<17+1)),
		"placeholder": clientFrame(true, 0, opText, []byte(sw.Placeholder)),
	} {
		c, up, _, alerts := wsScrub(t, sw, nil)
		_, err := c.Write(frames)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		if bytes.Contains(up.wrote.Bytes(), []byte(sw.Placeholder[7:])) {
			t.Errorf("%s: the frame with the placeholder reached the upstream", name)
		}
		wantAlert := name != "compressed" && name != "unmasked" && name != "over limit"
		if (len(*alerts) == 1) != wantAlert {
			t.Errorf("%s: alerts %v", name, *alerts)
		}
	}
}
