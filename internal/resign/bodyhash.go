package resign

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"io"
	"net/http"
)

// checkBody makes r's body verify against want (a SHA-256) as it is read.
func checkBody(r *http.Request, want []byte) {
	r.Body = newHashReader(r.Body, want)
	if gb := r.GetBody; gb != nil {
		r.GetBody = func() (io.ReadCloser, error) {
			b, err := gb()
			if err != nil {
				return nil, err
			}
			return newHashReader(b, want), nil
		}
	}
}

// hashReader passes a body on while hashing it, always holding back its
// last byte until the end: at the end it compares the hash and either
// passes that byte and io.EOF on, or fails (wrapping ErrBadSignature). A
// reader downstream therefore never sees the whole of a body that does not
// match. It holds at most one read's worth of bytes.
type hashReader struct {
	rc   io.ReadCloser
	want []byte
	h    hash.Hash
	buf  [32 << 10]byte
	lo   int // buf[lo:hi] is read and not yet passed on
	hi   int
	eof  bool
	err  error
}

func newHashReader(rc io.ReadCloser, want []byte) *hashReader {
	return &hashReader{rc: rc, want: want, h: sha256.New()}
}

func (c *hashReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	// Have more than the held-back byte, or the end.
	for !c.eof && c.hi-c.lo <= 1 {
		if c.lo > 0 { // keep the held byte at the front
			c.hi = copy(c.buf[:], c.buf[c.lo:c.hi])
			c.lo = 0
		}
		n, err := c.rc.Read(c.buf[c.hi:])
		c.h.Write(c.buf[c.hi : c.hi+n])
		c.hi += n
		switch {
		case err == io.EOF:
			c.eof = true
			if !hmac.Equal(c.h.Sum(nil), c.want) {
				c.err = bad("the body does not match X-Amz-Content-Sha256")
				c.lo, c.hi = 0, 0
				return 0, c.err
			}
		case err != nil:
			c.err = err
			return 0, err
		}
	}
	end := c.hi
	if !c.eof {
		end-- // held back until the hash is checked
	}
	if c.lo == end {
		return 0, io.EOF
	}
	n := copy(p, c.buf[c.lo:end])
	c.lo += n
	return n, nil
}

func (c *hashReader) Close() error { return c.rc.Close() }
