package resign

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// MaxChunk bounds one aws-chunked chunk; a chunk is held in memory while its
// signature is checked (SDKs send 64 KiB to 1 MiB chunks).
const MaxChunk = 16 << 20

const (
	chunkSigPrefix   = "chunk-signature="
	trailerSigHeader = "x-amz-trailer-signature"
	maxTrailerLines  = 16
)

// streamBody replaces the body of an aws-chunked upload by a reader that
// re-signs it chunk by chunk. realSeed is the new request signature.
func (q *sigv4Req) streamBody(s *SigV4, guestKey, realKey, realSeed []byte) {
	t, _ := time.Parse(amzDateFormat, q.amzDate) // checked in parse
	want := int64(-1)
	if v := q.headers["x-amz-decoded-content-length"]; len(v) == 1 {
		if n, err := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64); err == nil && n >= 0 {
			want = n
		}
	}
	max := int64(MaxChunk)
	if m := s.maxBody(); m < max {
		max = m
	}
	orig := q.r.Body
	q.r.Body = &chunkReader{
		src:       bufio.NewReaderSize(orig, 4096),
		orig:      orig,
		guest:     v4.NewStreamSigner(s.Placeholder.Credentials(), q.service, q.region, q.signature),
		real:      v4.NewStreamSigner(s.Real.Credentials(), q.service, q.region, realSeed),
		guestKey:  guestKey,
		realKey:   realKey,
		amzDate:   q.amzDate,
		scope:     q.scope,
		t:         t,
		trailer:   q.payloadHash == streamingSignedTrailer,
		maxChunk:  max,
		want:      want,
		guestPrev: q.signature,
		realPrev:  realSeed,
		report:    s.Report,
	}
	q.r.GetBody = nil
}

// chunkReader verifies a STREAMING-AWS4-HMAC-SHA256-PAYLOAD(-TRAILER) body
// against the placeholder signature chain and emits it signed with the real
// chain. Only one chunk is held at a time; a chunk is emitted only after its
// signature verified. Signatures keep their length, so Content-Length holds.
type chunkReader struct {
	src         *bufio.Reader
	orig        io.ReadCloser
	guest, real *v4.StreamSigner
	// keys and previous signatures for the trailer signature, which the
	// SDK's StreamSigner does not compute.
	guestKey, realKey   []byte
	guestPrev, realPrev []byte
	amzDate, scope      string
	t                   time.Time
	trailer             bool
	maxChunk            int64
	want, got           int64
	chunks              int
	report              Reporter

	data []byte
	out  []byte
	off  int
	err  error
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for c.off >= len(c.out) {
		if c.err != nil {
			return 0, c.err
		}
		c.out, c.off = c.out[:0], 0
		if c.err = c.next(); c.err != nil && c.err != io.EOF {
			c.out = c.out[:0]
		}
	}
	n := copy(p, c.out[c.off:])
	c.off += n
	return n, nil
}

func (c *chunkReader) Close() error { return c.orig.Close() }

func chunkErr(format string, a ...any) error {
	return fmt.Errorf("%w: aws-chunked body: "+format, append([]any{ErrBadSignature}, a...)...)
}

// line reads one CRLF-terminated line, returned with its CRLF.
func (c *chunkReader) line() ([]byte, error) {
	l, err := c.src.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, chunkErr("line too long")
	case err == io.EOF:
		return nil, chunkErr("ends early: %w", io.ErrUnexpectedEOF)
	case err != nil:
		return nil, err
	case len(l) < 2 || l[len(l)-2] != '\r':
		return nil, chunkErr("line not terminated by CRLF")
	}
	return l, nil
}

// next processes one chunk, appending its re-signed form to c.out. It
// returns io.EOF after the final chunk.
func (c *chunkReader) next() error {
	hdr, err := c.line()
	if err != nil {
		return err
	}
	c.chunks++
	hdrLine := string(hdr[:len(hdr)-2])
	sizeHex, ext, _ := strings.Cut(hdrLine, ";")
	size, err := strconv.ParseInt(sizeHex, 16, 64)
	if err != nil || size < 0 {
		return chunkErr("malformed chunk size in chunk %d", c.chunks)
	}
	if !strings.HasPrefix(ext, chunkSigPrefix) || !isHex64(ext[len(chunkSigPrefix):]) {
		return chunkErr("chunk %d has no chunk-signature", c.chunks)
	}
	sigStart := len(sizeHex) + 1 + len(chunkSigPrefix)
	guestSig, _ := hex.DecodeString(hdrLine[sigStart : sigStart+64])
	if size > c.maxChunk {
		return fmt.Errorf("%w: aws-chunked chunk of %d bytes is over the %d-byte limit; use smaller chunks", ErrUnsupported, size, c.maxChunk)
	}
	if int64(cap(c.data)) < size {
		c.data = make([]byte, size)
	}
	data := c.data[:size]
	if _, err := io.ReadFull(c.src, data); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return chunkErr("ends early: %w", io.ErrUnexpectedEOF)
		}
		return err
	}

	ctx := context.Background()
	want, _ := c.guest.GetSignature(ctx, nil, data, c.t)
	if !hmac.Equal(want, guestSig) {
		return chunkErr("chunk %d does not match its signature", c.chunks)
	}
	realSig, _ := c.real.GetSignature(ctx, nil, data, c.t)
	c.report.report(hex.EncodeToString(realSig), hex.EncodeToString(want))
	c.guestPrev, c.realPrev = want, realSig
	c.got += size

	c.out = append(c.out, hdr[:sigStart]...)
	c.out = hex.AppendEncode(c.out, realSig)
	c.out = append(c.out, hdr[sigStart+64:]...)
	c.out = append(c.out, data...)
	if size > 0 {
		crlf, err := c.line()
		if err != nil {
			return err
		}
		if len(crlf) != 2 {
			return chunkErr("chunk %d is longer than its size", c.chunks)
		}
		c.out = append(c.out, crlf...)
		return nil
	}
	if err := c.trailers(); err != nil {
		return err
	}
	if c.want >= 0 && c.got != c.want {
		return chunkErr("carries %d bytes, X-Amz-Decoded-Content-Length says %d", c.got, c.want)
	}
	if _, err := c.src.Peek(1); err == nil {
		return chunkErr("data after the final chunk")
	} else if err != io.EOF {
		return err
	}
	return io.EOF
}

// trailers handles what follows the final chunk: an empty line, or (with
// trailers) "name:value" lines with an x-amz-trailer-signature, then an
// empty line.
func (c *chunkReader) trailers() error {
	var lines [][]byte
	var canon strings.Builder
	sigAt, sigOff := -1, 0 // line holding the signature, offset of its hex
	var guestSig []byte
	for {
		l, err := c.line()
		if err != nil {
			return err
		}
		if len(l) == 2 {
			break
		}
		if !c.trailer || len(lines) >= maxTrailerLines {
			return chunkErr("unexpected data after the final chunk")
		}
		text := string(l[:len(l)-2])
		name, val, ok := strings.Cut(text, ":")
		if !ok {
			return chunkErr("malformed trailer")
		}
		name, val = strings.ToLower(strings.TrimSpace(name)), strings.TrimSpace(val)
		if name == trailerSigHeader {
			if sigAt >= 0 || !isHex64(val) {
				return chunkErr("malformed trailer signature")
			}
			guestSig, _ = hex.DecodeString(val)
			sigAt, sigOff = len(lines), strings.LastIndex(text, val)
		} else {
			canon.WriteString(name + ":" + val + "\n")
		}
		lines = append(lines, bytes.Clone(l))
	}
	if len(lines) > 0 && sigAt < 0 {
		return chunkErr("trailers without x-amz-trailer-signature")
	}
	for i, l := range lines {
		if i != sigAt {
			c.out = append(c.out, l...)
			continue
		}
		h := sha256Hex([]byte(canon.String()))
		sts := func(prev []byte) string {
			return "AWS4-HMAC-SHA256-TRAILER\n" + c.amzDate + "\n" + c.scope + "\n" + hex.EncodeToString(prev) + "\n" + h
		}
		if !hmac.Equal(hmacSHA256(c.guestKey, sts(c.guestPrev)), guestSig) {
			return chunkErr("trailers do not match their signature")
		}
		// Rewrite only the hex, so the body keeps its length.
		c.out = append(c.out, l[:sigOff]...)
		realSig := hmacSHA256(c.realKey, sts(c.realPrev))
		c.report.report(hex.EncodeToString(realSig), hex.EncodeToString(guestSig))
		c.out = hex.AppendEncode(c.out, realSig)
		c.out = append(c.out, l[sigOff+64:]...)
	}
	c.out = append(c.out, "\r\n"...)
	return nil
}

var _ io.ReadCloser = (*chunkReader)(nil)
