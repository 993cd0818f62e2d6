package agentproto

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

func frameBytes(t frameType, n uint32, payload []byte) []byte {
	b := make([]byte, headerSize, headerSize+len(payload))
	b[0] = byte(t)
	binary.BigEndian.PutUint32(b[1:], n)
	return append(b, payload...)
}

func jsonFrame(t frameType, v any) []byte {
	p, _ := json.Marshal(v)
	return frameBytes(t, uint32(len(p)), p)
}

// fakeAgent is a hostile agent: it completes the handshake, then answers
// every stream's request with reply.
func fakeAgent(t *testing.T, reply []byte) *Client {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		defer b.Close()
		if _, _, err := newFrameReader(b).next(); err != nil {
			return
		}
		if _, err := b.Write(jsonFrame(frameHelloOK, helloOK{Proto: ProtocolVersion, Version: "evil"})); err != nil {
			return
		}
		cfg := yamuxConfig()
		sess, err := yamux.Server(b, cfg)
		if err != nil {
			return
		}
		defer sess.Close()
		for {
			st, err := sess.AcceptStream()
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				newFrameReader(st).next()
				st.Write(reply)
			}()
		}
	}()
	c, err := NewClient(ctxT(t), a, testToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestClientRejectsGarbage(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 100)
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 4096)
	for i := range random {
		random[i] = byte(rng.UintN(256))
	}
	cases := map[string][]byte{
		"nothing":             nil,
		"all ones":            bytes.Repeat([]byte{0xff}, 64),
		"type zero":           frameBytes(0, 0, nil),
		"unknown type":        frameBytes(200, 1, []byte{1}),
		"oversized data":      frameBytes(frameStdout, MaxFrameSize+1, big),
		"oversized json":      frameBytes(frameExit, MaxJSONSize+1, big),
		"oversized error":     frameBytes(frameError, 1<<31, big),
		"truncated":           frameBytes(frameStdout, 1000, big),
		"short header":        {byte(frameStdout), 0},
		"bad json exit":       frameBytes(frameExit, 9, []byte("{not json")),
		"bad json reply":      frameBytes(frameReply, 3, []byte("[1,")),
		"bad json error":      frameBytes(frameError, 1, []byte("{")),
		"wrong type exit":     jsonFrame(frameExit, map[string]any{"exit_code": "zero"}),
		"hello in stream":     jsonFrame(frameHelloOK, helloOK{Proto: 1}),
		"data with nonzero":   frameBytes(frameEOF, 3, []byte("abc")),
		"bad names":           append(jsonFrame(frameReply, []FileInfo{{Name: "../../etc/passwd"}}), frameBytes(frameEOF, 0, nil)...),
		"empty name":          append(jsonFrame(frameReply, []FileInfo{{Name: ""}}), frameBytes(frameEOF, 0, nil)...),
		"slash name":          append(jsonFrame(frameReply, []FileInfo{{Name: "a/b"}}), frameBytes(frameEOF, 0, nil)...),
		"data then oversized": append(frameBytes(frameData, 3, []byte("abc")), frameBytes(frameData, 1<<30, nil)...),
		"random":              random,
	}
	for name, reply := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := fakeAgent(t, reply)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			check := func(op string, err error) {
				t.Helper()
				if err == nil {
					t.Errorf("%s accepted garbage", op)
				}
				if errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s hung on garbage", op)
				}
			}
			_, err := c.Exec(ctx, &ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
			check("exec", err)
			_, err = c.Health(ctx)
			check("health", err)
			check("read", c.ReadFile(ctx, "/x", io.Discard, 2))
			_, err = c.ListDir(ctx, "/x")
			check("list", err)
			if !strings.HasPrefix(name, "data") {
				check("write", c.WriteFile(ctx, "/x", 0o644, strings.NewReader("data")))
			}
		})
	}
}

func TestClientGarbageHandshake(t *testing.T) {
	cases := map[string][]byte{
		"nothing":      nil,
		"random":       []byte("HTTP/1.1 200 OK\r\n\r\n"),
		"huge":         frameBytes(frameHelloOK, 1<<31, nil),
		"bad json":     frameBytes(frameHelloOK, 1, []byte("{")),
		"wrong proto":  jsonFrame(frameHelloOK, helloOK{Proto: 99}),
		"wrong type":   jsonFrame(frameReply, helloOK{Proto: 1}),
		"error frame":  jsonFrame(frameError, wireError{Error: "nope"}),
		"empty error":  jsonFrame(frameError, wireError{}),
		"short header": {byte(frameHelloOK)},
	}
	for name, reply := range cases {
		t.Run(name, func(t *testing.T) {
			a, b := net.Pipe()
			go func() {
				defer b.Close()
				newFrameReader(b).next()
				b.Write(reply)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := NewClient(ctx, a, testToken)
			if err == nil {
				c.Close()
				t.Fatal("handshake accepted garbage")
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("handshake hung on garbage")
			}
		})
	}
}

func TestServerRejectsGarbage(t *testing.T) {
	cases := map[string][]byte{
		"random":     []byte("GET / HTTP/1.1\r\n\r\n"),
		"huge hello": frameBytes(frameHello, 1<<31, nil),
		"bad json":   frameBytes(frameHello, 1, []byte("{")),
		"request":    jsonFrame(frameRequest, request{Op: opHealth}),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			go io.Copy(io.Discard, a)
			srv := &Server{Token: testToken, Logger: testLogger(t)}
			errc := make(chan error, 1)
			go func() { errc <- srv.ServeConn(b) }()
			a.Write(in)
			select {
			case err := <-errc:
				if err == nil {
					t.Fatal("server accepted garbage")
				}
			case <-time.After(3 * time.Second):
				t.Fatal("server hung on garbage")
			}
		})
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	fw := newFrameWriter(&buf)
	big := bytes.Repeat([]byte{7}, MaxFrameSize)
	frames := []struct {
		t frameType
		p []byte
	}{
		{frameStdout, []byte("hello")},
		{frameEOF, nil},
		{frameSignal, []byte{9}},
		{frameData, big},
		{frameRequest, []byte(`{"op":"health"}`)},
	}
	for _, f := range frames {
		if err := fw.write(f.t, f.p); err != nil {
			t.Fatal(err)
		}
	}
	if err := fw.write(frameData, append(big, 1)); err == nil {
		t.Fatal("wrote an oversized frame")
	}
	if err := fw.write(frameReply, make([]byte, MaxJSONSize+1)); err == nil {
		t.Fatal("wrote an oversized JSON frame")
	}
	fr := newFrameReader(&buf)
	for _, f := range frames {
		typ, p, err := fr.next()
		if err != nil || typ != f.t || !bytes.Equal(p, f.p) {
			t.Fatalf("read %v %d bytes %v, want %v %d bytes", typ, len(p), err, f.t, len(f.p))
		}
	}
	if _, _, err := fr.next(); err != io.EOF {
		t.Fatalf("at end: %v, want io.EOF", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(frameBytes(frameStdout, 5, []byte("hello")))
	f.Add(frameBytes(frameEOF, 0, nil))
	f.Add(frameBytes(frameExit, 2, []byte("{}")))
	f.Add(frameBytes(frameData, MaxFrameSize+1, nil))
	f.Add(frameBytes(frameSignal, 1, []byte{9}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		fr := newFrameReader(bytes.NewReader(in))
		consumed := 0
		for {
			typ, p, err := fr.next()
			if err != nil {
				return
			}
			if typ == 0 || typ >= frameTypeEnd {
				t.Fatalf("unknown type %d accepted", typ)
			}
			if len(p) > typ.maxPayload() {
				t.Fatalf("%s frame of %d bytes accepted", typ, len(p))
			}
			consumed += headerSize + len(p)
			if consumed > len(in) {
				t.Fatalf("read %d bytes from %d", consumed, len(in))
			}
			// Whatever a frame holds, decoding it must not panic.
			switch typ {
			case frameError:
				_ = decodeError(p)
			case frameExit:
				var r ExecResult
				_ = json.Unmarshal(p, &r)
			}
		}
	})
}
