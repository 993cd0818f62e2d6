package resign

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"crypto/sha256"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"testing/iotest"
)

const s3Key = "/bucket/my%20file%2Bname%20%C3%BC.txt" // "my file+name ü.txt", escaped as the S3 SDK does

func TestSigV4ThroughProxy(t *testing.T) {
	emptyHash := sha256hex(nil)
	tests := []struct {
		name      string
		method    string
		pathQuery string
		body      []byte
		opt       guestOpt
	}{
		{"s3 put unsigned payload", "PUT", s3Key, []byte("hello, world"),
			guestOpt{payloadHash: unsignedPayload, sendHash: true, header: map[string]string{"X-Amz-Meta-Note": "  two  spaces  ", "Content-Type": "text/plain"}}},
		{"s3 put payload hash", "PUT", s3Key, []byte("hello, world"),
			guestOpt{sendHash: true, header: map[string]string{"X-Amz-Meta-Note": "x"}}},
		{"s3 get list with query", "GET", "/bucket?list-type=2&prefix=my%20dir%2F%C3%BC&max-keys=10", nil,
			guestOpt{payloadHash: emptyHash, sendHash: true}},
		{"s3 key with reserved characters", "GET", "/bucket/a%21b%27c%28d%29%2A%3Be%3D%40f%24%26%2C.txt", nil,
			guestOpt{payloadHash: emptyHash, sendHash: true}},
		{"non-s3 post, body hashed, path encoded twice", "POST", "/prod/items%20x/%C3%BC?b=2&a=1+1&c=%2F", []byte(`{"k":"v"}`),
			guestOpt{service: "execute-api", header: map[string]string{"Content-Type": "application/json"}}},
		{"sts form post", "POST", "/", []byte("Action=GetCallerIdentity&Version=2011-06-15"),
			guestOpt{service: "sts", header: map[string]string{"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}}},
		{"non-s3 get with empty path segments", "GET", "/a//b/?x=1", nil, guestOpt{service: "execute-api"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, realCreds)
			px := newProxy(t, &SigV4{Placeholder: phCreds, Real: realCreds}, up.URL)
			tt.opt.creds = phCreds
			req := guestRequest(t, tt.method, px.URL, tt.pathQuery, tt.body, tt.opt)

			// Sanity: the upstream refuses the placeholder-signed request as is.
			direct := req.Clone(context.Background())
			direct.URL.Host = strings.TrimPrefix(up.URL, "http://")
			direct.Host = req.URL.Host
			if req.GetBody != nil {
				direct.Body, _ = req.GetBody()
			}
			if code, _ := do(t, direct); code != http.StatusForbidden {
				t.Fatalf("upstream answered %d to the placeholder-signed request", code)
			}

			code, msg := do(t, req)
			if code != 200 {
				t.Fatalf("status %d: %s (proxy error: %v)", code, msg, px.lastErr())
			}
			got := up.accepted()
			if len(got) != 1 {
				t.Fatalf("upstream accepted %d requests", len(got))
			}
			a := got[0]
			wantPath, wantQuery, _ := strings.Cut(tt.pathQuery, "?")
			if a.rawPath != wantPath || a.rawQuery != wantQuery {
				t.Errorf("upstream saw %q ? %q, want %q ? %q", a.rawPath, a.rawQuery, wantPath, wantQuery)
			}
			if !bytes.Equal(a.body, tt.body) {
				t.Errorf("upstream body %q, want %q", a.body, tt.body)
			}
			auth := a.header.Get("Authorization")
			if !strings.Contains(auth, "Credential="+realCreds.AccessKeyID+"/") || strings.Contains(auth, phCreds.AccessKeyID) {
				t.Errorf("upstream Authorization %q does not carry the real key id only", auth)
			}
			if a.header.Get("X-Amz-Date") != signTime.Format(amzDateFormat) {
				t.Errorf("X-Amz-Date changed: %q", a.header.Get("X-Amz-Date"))
			}
		})
	}
}

func TestSigV4Tampered(t *testing.T) {
	body := []byte("original body!")
	tests := []struct {
		name   string
		opt    guestOpt
		tamper func(*http.Request)
	}{
		{"signed header changed", guestOpt{payloadHash: unsignedPayload, sendHash: true, header: map[string]string{"X-Amz-Meta-Note": "blue"}},
			func(r *http.Request) { r.Header.Set("X-Amz-Meta-Note", "red") }},
		{"path changed", guestOpt{payloadHash: unsignedPayload, sendHash: true},
			func(r *http.Request) {
				r.URL.Path, r.URL.RawPath = "/bucket/other file.txt", "/bucket/other%20file.txt"
			}},
		{"path escaping changed", guestOpt{payloadHash: unsignedPayload, sendHash: true},
			func(r *http.Request) { r.URL.RawPath = "/bucket/my%20file+name%20%C3%BC.txt" }},
		{"query added", guestOpt{payloadHash: unsignedPayload, sendHash: true},
			func(r *http.Request) { r.URL.RawQuery = "versionId=2" }},
		{"method changed", guestOpt{payloadHash: unsignedPayload, sendHash: true},
			func(r *http.Request) { r.Method = "POST" }},
		{"date changed", guestOpt{payloadHash: unsignedPayload, sendHash: true},
			func(r *http.Request) { r.Header.Set("X-Amz-Date", "20250314T092654Z") }},
		{"body changed with payload hash", guestOpt{sendHash: true},
			func(r *http.Request) { r.Body = io.NopCloser(strings.NewReader("tampered body!")) }},
		{"body changed, non-s3 hashed body", guestOpt{service: "sqs"},
			func(r *http.Request) { r.Body = io.NopCloser(strings.NewReader("tampered body!")) }},
		{"another access key id", guestOpt{payloadHash: unsignedPayload, sendHash: true, creds: AWSCreds{AccessKeyID: "AKIAOTHERKEY00000000", SecretAccessKey: phCreds.SecretAccessKey}},
			nil},
		{"placeholder id, wrong secret", guestOpt{payloadHash: unsignedPayload, sendHash: true, creds: AWSCreds{AccessKeyID: phCreds.AccessKeyID, SecretAccessKey: "guessed"}},
			nil},
		{"signed with the real key", guestOpt{payloadHash: unsignedPayload, sendHash: true, creds: realCreds},
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, realCreds)
			px := newProxy(t, &SigV4{Placeholder: phCreds, Real: realCreds}, up.URL)
			if tt.opt.creds == (AWSCreds{}) {
				tt.opt.creds = phCreds
			}
			req := guestRequest(t, "PUT", px.URL, s3Key, body, tt.opt)
			if tt.tamper != nil {
				tt.tamper(req)
			}
			code, msg := do(t, req)
			if code != http.StatusForbidden {
				t.Fatalf("status %d (%s), want 403", code, msg)
			}
			if err := px.lastErr(); !errors.Is(err, ErrBadSignature) {
				t.Fatalf("Resign error %v, want ErrBadSignature", err)
			}
			if n := len(up.accepted()); n != 0 {
				t.Fatalf("upstream accepted %d requests", n)
			}
		})
	}
}

func TestSigV4SessionToken(t *testing.T) {
	tests := []struct {
		name        string
		ph, real    AWSCreds
		guestToken  string
		wantErr     error
		wantUpToken string
	}{
		{"placeholder token replaced", withToken(phCreds, phToken), withToken(realCreds, realToken), phToken, nil, realToken},
		{"token injected", phCreds, withToken(realCreds, realToken), "", nil, realToken},
		{"placeholder token dropped", withToken(phCreds, phToken), realCreds, phToken, nil, ""},
		{"other token refused", withToken(phCreds, phToken), withToken(realCreds, realToken), "someone-elses-token", ErrBadSignature, ""},
		{"token where none is expected refused", phCreds, realCreds, "someone-elses-token", ErrBadSignature, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, tt.real)
			px := newProxy(t, &SigV4{Placeholder: tt.ph, Real: tt.real}, up.URL)
			guest := phCreds
			guest.SessionToken = tt.guestToken
			req := guestRequest(t, "GET", px.URL, s3Key, nil, guestOpt{creds: guest, payloadHash: unsignedPayload, sendHash: true})
			if tt.guestToken != "" && !strings.Contains(req.Header.Get("Authorization"), "x-amz-security-token") {
				t.Fatal("the SDK did not sign the session token")
			}
			code, msg := do(t, req)
			if tt.wantErr != nil {
				if code != 403 || !errors.Is(px.lastErr(), tt.wantErr) {
					t.Fatalf("status %d (%s), error %v; want 403 and %v", code, msg, px.lastErr(), tt.wantErr)
				}
				return
			}
			if code != 200 {
				t.Fatalf("status %d: %s (proxy error: %v)", code, msg, px.lastErr())
			}
			a := up.accepted()[0]
			if got := a.header.Values("X-Amz-Security-Token"); strings.Join(got, ",") != tt.wantUpToken {
				t.Errorf("upstream token %q, want %q", got, tt.wantUpToken)
			}
			signed := strings.Contains(a.header.Get("Authorization"), "x-amz-security-token")
			if signed != (tt.wantUpToken != "") {
				t.Errorf("x-amz-security-token signed=%v in %q", signed, a.header.Get("Authorization"))
			}
		})
	}
}

func withToken(c AWSCreds, tok string) AWSCreds { c.SessionToken = tok; return c }

func TestSigV4Chunked(t *testing.T) {
	chunks := [][]byte{bytes.Repeat([]byte("a"), 64<<10), bytes.Repeat([]byte("b"), 64<<10), []byte("tail of the upload")}
	want := bytes.Join(chunks, nil)
	hdr := len("10000;chunk-signature=") + 64 + 2 // a 64 KiB chunk's header
	chunk2 := hdr + 64<<10 + 2 + hdr              // where the second chunk's data starts
	for _, trailer := range []bool{false, true} {
		name := "signed chunks"
		if trailer {
			name = "signed chunks with trailer"
		}
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t, realCreds)
			px := newProxy(t, &SigV4{Placeholder: phCreds, Real: realCreds}, up.URL)
			code, msg := do(t, chunkedUpload(t, px.URL, phCreds, chunks, trailer))
			if code != 200 {
				t.Fatalf("status %d: %s (proxy error: %v)", code, msg, px.lastErr())
			}
			got := up.accepted()
			if len(got) != 1 || !bytes.Equal(got[0].body, want) {
				t.Fatalf("upstream accepted %d requests, body intact: %v", len(got), len(got) == 1 && bytes.Equal(got[0].body, want))
			}
		})
		t.Run(name+" tampered", func(t *testing.T) {
			for _, tamper := range []struct {
				name string
				f    func(body []byte) []byte
			}{
				{"chunk data", func(b []byte) []byte { b[chunk2+100] ^= 1; return b }},
				{"chunk signature", func(b []byte) []byte { b[chunk2-hdr+len("10000;chunk-signature=")] ^= 1; return b }},
				{"chunks swapped", func(b []byte) []byte {
					one := bytes.Clone(b[hdr : hdr+64<<10])
					copy(b[hdr:], b[chunk2:chunk2+64<<10])
					copy(b[chunk2:], one)
					return b
				}},
			} {
				t.Run(tamper.name, func(t *testing.T) {
					up := newUpstream(t, realCreds)
					px := newProxy(t, &SigV4{Placeholder: phCreds, Real: realCreds}, up.URL)
					req := chunkedUpload(t, px.URL, phCreds, chunks, trailer)
					body, _ := io.ReadAll(req.Body)
					body = tamper.f(body)
					req.Body = io.NopCloser(bytes.NewReader(body))
					req.GetBody = nil
					code, msg := do(t, req)
					if code == 200 {
						t.Fatalf("tampered upload accepted: %s", msg)
					}
					if err := px.lastErr(); !errors.Is(err, ErrBadSignature) {
						t.Fatalf("proxy error %v, want ErrBadSignature", err)
					}
					if n := len(up.accepted()); n != 0 {
						t.Fatalf("upstream accepted %d requests", n)
					}
				})
			}
		})
	}
}

// TestSigV4ChunkedStreams checks the chunk re-signer holds one chunk, not
// the body: the first re-signed chunk comes out before the guest has sent
// the rest.
func TestSigV4ChunkedStreams(t *testing.T) {
	chunks := [][]byte{bytes.Repeat([]byte("x"), 8<<10), bytes.Repeat([]byte("y"), 8<<10)}
	req := chunkedUpload(t, "http://bucket.example", phCreds, chunks, false)
	full, _ := io.ReadAll(req.Body)
	pr, pw := io.Pipe()
	req.Body = pr
	first := bytes.Index(full, []byte("\r\n2000;")) + 2 // end of the first chunk
	go pw.Write(full[:first])                           // then stall
	s := &SigV4{Placeholder: phCreds, Real: realCreds}
	if err := s.Resign(req); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, first)
	if _, err := io.ReadFull(req.Body, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(buf, []byte("2000;chunk-signature=")) || bytes.Equal(buf, full[:first]) {
		t.Fatalf("first chunk not re-signed: %q", buf[:40])
	}
	pw.CloseWithError(io.ErrUnexpectedEOF)
}

func TestSigV4Presigned(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		ph, real AWSCreds
		tamper   func(*http.Request)
		wantErr  error
	}{
		{"get", "GET", phCreds, realCreds, nil, nil},
		{"put", "PUT", phCreds, realCreds, nil, nil},
		{"session token replaced", "GET", withToken(phCreds, phToken), withToken(realCreds, realToken), nil, nil},
		{"session token injected", "GET", phCreds, withToken(realCreds, realToken), nil, nil},
		{"expiry changed", "GET", phCreds, realCreds, func(r *http.Request) {
			r.URL.RawQuery = strings.Replace(r.URL.RawQuery, "X-Amz-Expires=300", "X-Amz-Expires=604800", 1)
		}, ErrBadSignature},
		{"path changed", "GET", phCreds, realCreds, func(r *http.Request) { r.URL.RawPath = "/bucket/other.txt"; r.URL.Path = "/bucket/other.txt" }, ErrBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, tt.real)
			px := newProxy(t, &SigV4{Placeholder: tt.ph, Real: tt.real}, up.URL)
			req, _ := http.NewRequest(tt.method, px.URL+s3Key+"?X-Amz-Expires=300&x-id=GetObject", nil)
			signed, _, err := v4.NewSigner().PresignHTTP(context.Background(), tt.ph.Credentials(), req, unsignedPayload, "s3", region, signTime, func(o *v4.SignerOptions) {
				o.DisableURIPathEscaping = true
			})
			if err != nil {
				t.Fatal(err)
			}
			preq, _ := http.NewRequest(tt.method, signed, nil)
			if tt.tamper != nil {
				tt.tamper(preq)
			}
			code, msg := do(t, preq)
			if tt.wantErr != nil {
				if code != 403 || !errors.Is(px.lastErr(), tt.wantErr) {
					t.Fatalf("status %d (%s), error %v; want 403 and %v", code, msg, px.lastErr(), tt.wantErr)
				}
				return
			}
			if code != 200 {
				t.Fatalf("status %d: %s (proxy error: %v)", code, msg, px.lastErr())
			}
			a := up.accepted()[0]
			if strings.Contains(a.rawQuery, phCreds.AccessKeyID) || !strings.Contains(a.rawQuery, realCreds.AccessKeyID) {
				t.Errorf("upstream query %q", a.rawQuery)
			}
		})
	}
}

// TestSigV4NormalisedPath: a signer that normalises the path (botocore) is
// verified, and the request is signed again the same way.
func TestSigV4NormalisedPath(t *testing.T) {
	norm, _ := http.NewRequest("GET", "http://api.example/a/c", nil)
	if err := v4.NewSigner().SignHTTP(context.Background(), phCreds.Credentials(), norm, sha256hex(nil), "execute-api", region, signTime); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "http://api.example/a/./b/../c", nil)
	req.Header = norm.Header.Clone()
	s := &SigV4{Placeholder: phCreds, Real: realCreds}
	if err := s.Resign(req); err != nil {
		t.Fatal(err)
	}
	want, _ := http.NewRequest("GET", "http://api.example/a/c", nil)
	if err := v4.NewSigner().SignHTTP(context.Background(), realCreds.Credentials(), want, sha256hex(nil), "execute-api", region, signTime); err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get("Authorization"); got != want.Header.Get("Authorization") {
		t.Fatalf("got %q\nwant %q", got, want.Header.Get("Authorization"))
	}
}

func TestSigV4Classify(t *testing.T) {
	s := &SigV4{Placeholder: phCreds, Real: realCreds, MaxBody: 16}
	tests := []struct {
		name  string
		setup func(r *http.Request)
		want  error
	}{
		{"no auth", func(r *http.Request) {}, ErrNotSigned},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer abc") }, ErrNotSigned},
		{"sigv2", func(r *http.Request) { r.Header.Set("Authorization", "AWS AKIA:abc=") }, ErrUnsupported},
		{"sigv4a", func(r *http.Request) {
			r.Header.Set("Authorization", "AWS4-ECDSA-P256-SHA256 Credential=AKIA/20250314/s3/aws4_request, SignedHeaders=host, Signature=00")
		}, ErrUnsupported},
		{"malformed", func(r *http.Request) { r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=x") }, ErrBadSignature},
		{"two authorization headers", func(r *http.Request) {
			r.Header.Add("Authorization", "AWS4-HMAC-SHA256 a")
			r.Header.Add("Authorization", "AWS4-HMAC-SHA256 b")
		}, ErrBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "http://bucket.example/k", nil)
			tt.setup(r)
			if err := s.Resign(r); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}

	t.Run("body over the limit", func(t *testing.T) {
		body := []byte("0123456789abcdefXYZ") // 19 bytes > MaxBody 16
		// The payload hash is signed but not declared: verifying needs the
		// whole body in memory (a declared hash streams, see
		// TestSigV4DeclaredHashStreams).
		req := guestRequest(t, "PUT", "http://bucket.example", "/bucket/k", body, guestOpt{creds: phCreds})
		req.ContentLength = -1 // unknown: must stop reading at the limit
		err := s.Resign(req)
		if !errors.Is(err, ErrUnsupported) || !errors.Is(err, ErrBodyTooLarge) {
			t.Fatalf("got %v, want ErrUnsupported and ErrBodyTooLarge", err)
		}
		rest, _ := io.ReadAll(req.Body)
		if !bytes.Equal(rest, body) {
			t.Fatalf("body not restored: %q", rest)
		}
	})
	t.Run("no real credentials", func(t *testing.T) {
		req := guestRequest(t, "GET", "http://bucket.example", "/bucket/k", nil, guestOpt{creds: phCreds, payloadHash: unsignedPayload, sendHash: true})
		if err := (&SigV4{Placeholder: phCreds}).Resign(req); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("got %v, want ErrUnsupported", err)
		}
	})
	t.Run("unsigned streaming trailer passes through", func(t *testing.T) {
		req := guestRequest(t, "PUT", "http://bucket.example", "/bucket/k", []byte("5\r\nhello\r\n0\r\n\r\n"),
			guestOpt{creds: phCreds, payloadHash: streamingUnsignedTrailer, sendHash: true})
		if err := s.Resign(req); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("sigv4a streaming refused", func(t *testing.T) {
		req := guestRequest(t, "PUT", "http://bucket.example", "/bucket/k", []byte("x"),
			guestOpt{creds: phCreds, payloadHash: "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD", sendHash: true})
		if err := s.Resign(req); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("got %v, want ErrUnsupported", err)
		}
	})
	t.Run("refused request left unchanged", func(t *testing.T) {
		req := guestRequest(t, "GET", "http://bucket.example", "/bucket/k", nil, guestOpt{creds: phCreds, payloadHash: unsignedPayload, sendHash: true})
		req.Header.Set("X-Amz-Date", "20250314T000000Z")
		before := req.Header.Clone()
		if err := s.Resign(req); !errors.Is(err, ErrBadSignature) {
			t.Fatalf("got %v", err)
		}
		if req.Header.Get("Authorization") != before.Get("Authorization") {
			t.Fatal("Authorization changed on failure")
		}
	})
}

func BenchmarkSigV4ResignGET(b *testing.B) {
	req := guestRequest(b, "GET", "http://bucket.s3.eu-west-1.amazonaws.com", "/photos/2025/cat%20picture.jpg?versionId=3", nil,
		guestOpt{creds: phCreds, payloadHash: unsignedPayload, sendHash: true})
	hdr := req.Header.Clone()
	s := &SigV4{Placeholder: phCreds, Real: realCreds}
	b.ReportAllocs()
	for b.Loop() {
		req.Header = hdr.Clone()
		if err := s.Resign(req); err != nil {
			b.Fatal(err)
		}
	}
}

// readCounter counts the reads of a body.
type readCounter struct {
	io.ReadCloser
	reads int
}

func (c *readCounter) Read(p []byte) (int, error) {
	c.reads++
	return c.ReadCloser.Read(p)
}

// TestSigV4DeclaredHashStreams: with X-Amz-Content-Sha256 declared, the
// signature is verified (and the request re-signed) before any of the body
// is read, and the body is checked against the hash as it streams, with no
// size limit. Before, the whole body was read into memory first (up to
// 64 MiB), and anything larger was refused.
func TestSigV4DeclaredHashStreams(t *testing.T) {
	s := &SigV4{Placeholder: phCreds, Real: realCreds, MaxBody: 16}
	body := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB ≫ MaxBody
	req := guestRequest(t, "PUT", "http://bucket.example", "/bucket/k", body, guestOpt{creds: phCreds, sendHash: true})
	rc := &readCounter{ReadCloser: req.Body}
	req.Body = rc
	if err := s.Resign(req); err != nil {
		t.Fatal(err)
	}
	if rc.reads != 0 {
		t.Fatalf("Resign read the body %d times before returning", rc.reads)
	}
	if got, err := io.ReadAll(req.Body); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("body: %d bytes, %v", len(got), err)
	}

	// End to end: the upstream gets the body, re-signed.
	up := newUpstream(t, realCreds)
	px := newProxy(t, s, up.URL)
	req = guestRequest(t, "PUT", px.URL, s3Key, body, guestOpt{creds: phCreds, sendHash: true})
	if code, msg := do(t, req); code != http.StatusOK {
		t.Fatalf("status %d (%s)", code, msg)
	}
	if a := up.accepted(); len(a) != 1 || !bytes.Equal(a[0].body, body) {
		t.Fatalf("upstream accepted %d", len(a))
	}
}

// TestSigV4HashReaderHoldsBackTheEnd: a body that does not match its
// declared hash never reaches a reader whole: the reader fails before
// passing its last byte on, whatever the read sizes.
func TestSigV4HashReaderHoldsBackTheEnd(t *testing.T) {
	body := []byte("0123456789")
	wrong := sha256.Sum256([]byte("something else"))
	right := sha256.Sum256(body)
	for _, size := range []int{1, 3, 10, 100} {
		for _, tc := range []struct {
			want [32]byte
			ok   bool
		}{{right, true}, {wrong, false}} {
			hr := newHashReader(io.NopCloser(iotest.OneByteReader(bytes.NewReader(body))), tc.want[:])
			var got []byte
			var err error
			buf := make([]byte, size)
			for {
				var n int
				n, err = hr.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					break
				}
			}
			if tc.ok && (err != io.EOF || !bytes.Equal(got, body)) {
				t.Errorf("size %d, right hash: %q %v", size, got, err)
			}
			if !tc.ok && (!errors.Is(err, ErrBadSignature) || len(got) >= len(body)) {
				t.Errorf("size %d, wrong hash: passed %q on, error %v", size, got, err)
			}
		}
	}
}
