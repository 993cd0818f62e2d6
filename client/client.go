// Package client is the Go client of the cagebox API, used by the CLI and
// the end-to-end tests.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/cagebox/cagebox/api"
)

// Client talks to one daemon.
type Client struct {
	base string
	key  string
	http *http.Client
}

// SocketPath is the daemon's unix socket in its home directory.
func SocketPath(home string) string { return filepath.Join(home, "cagebox.sock") }

// Unix returns a client for the daemon's unix socket (admin tenant).
func Unix(sock string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: 8,
	}
	return &Client{base: "http://cagebox", http: &http.Client{Transport: tr}}
}

// TCP returns a client for a daemon's TCP listener, authenticating with key.
// An https:// baseURL is verified against the system roots; see NewTCP for
// a private CA.
func TCP(baseURL, key string) *Client {
	return &Client{base: strings.TrimRight(baseURL, "/"), key: key, http: &http.Client{}}
}

// Options configure a TCP client.
type Options struct {
	// CACertFile holds PEM certificates trusted, besides the system roots,
	// to verify an https:// daemon (one whose certificate a private CA
	// issued).
	CACertFile string
}

// NewTCP returns a client for a daemon's TCP listener at baseURL, http://
// (loopback listeners, or a daemon run with --insecure-listen) or https://,
// authenticating with key.
func NewTCP(baseURL, key string, o Options) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("daemon URL %q: want http://HOST:PORT or https://HOST:PORT", baseURL)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("daemon URL %q: want the scheme, host and port only", u.Redacted())
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if o.CACertFile != "" {
		if u.Scheme != "https" {
			return nil, fmt.Errorf("a CA certificate (%s) verifies an https:// daemon; %s is plain HTTP", o.CACertFile, baseURL)
		}
		pem, err := os.ReadFile(o.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("CA certificate: %w", err)
		}
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA certificate %s: no PEM certificate in it", o.CACertFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return &Client{base: u.Scheme + "://" + u.Host, key: key, http: &http.Client{Transport: tr}}, nil
}

// Error is an API error answer.
type Error struct {
	Status int
	Kind   string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// IsNotFound reports whether err is a not-found answer.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

func (c *Client) req(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	r, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		r.Header.Set("Authorization", "Bearer "+c.key)
	}
	return r, nil
}

// open sends a request and returns its response when the status is 2xx;
// otherwise it decodes the API error. The caller closes the body.
func (c *Client) open(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	r, err := c.req(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(r)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.open(ctx, method, path, ct, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e api.Error
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return &Error{Status: resp.StatusCode, Kind: e.Kind, Msg: e.Error}
	}
	return &Error{Status: resp.StatusCode, Msg: fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b)))}
}

// Health asks the daemon how it is.
func (c *Client) Health(ctx context.Context) (*api.Health, error) {
	var h api.Health
	return &h, c.do(ctx, "GET", "/v1/health", nil, &h)
}

// Runtimes lists runtimes.
func (c *Client) Runtimes(ctx context.Context) ([]api.Runtime, error) {
	var out []api.Runtime
	return out, c.do(ctx, "GET", "/v1/runtimes", nil, &out)
}

// Images lists cached images.
func (c *Client) Images(ctx context.Context) ([]api.Image, error) {
	var out []api.Image
	return out, c.do(ctx, "GET", "/v1/images", nil, &out)
}

// PullImage asks the daemon to pull an OCI image (admin only). It answers
// once the image is installed, which may take minutes for a large image:
// bound ctx accordingly.
func (c *Client) PullImage(ctx context.Context, req *api.PullImageRequest) (*api.Image, error) {
	var out api.Image
	return &out, c.do(ctx, "POST", "/v1/images/pull", req, &out)
}

// ImportImage sends a `docker save` archive or a tar of an OCI image layout
// to the daemon, which installs it (admin only).
func (c *Client) ImportImage(ctx context.Context, archive io.Reader, o api.ImportImageOptions) (*api.Image, error) {
	q := url.Values{}
	if o.Name != "" {
		q.Set("name", o.Name)
	}
	if o.Force {
		q.Set("force", "true")
	}
	if o.MaxBytes > 0 {
		q.Set("max_bytes", fmt.Sprint(o.MaxBytes))
	}
	if o.MaxFiles > 0 {
		q.Set("max_files", fmt.Sprint(o.MaxFiles))
	}
	path := "/v1/images/import"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := c.open(ctx, "POST", path, "application/x-tar", archive)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out api.Image
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("import image: decode the answer: %w", err)
	}
	return &out, nil
}

// Create creates and starts a sandbox.
func (c *Client) Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, "POST", "/v1/sandboxes", req, &sb)
}

// List lists sandboxes.
func (c *Client) List(ctx context.Context) ([]api.Sandbox, error) {
	var out []api.Sandbox
	return out, c.do(ctx, "GET", "/v1/sandboxes", nil, &out)
}

// ListLabeled lists the sandboxes that carry every one of labels.
func (c *Client) ListLabeled(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	q := url.Values{}
	for k, v := range labels {
		q.Add("label", k+"="+v)
	}
	var out []api.Sandbox
	return out, c.do(ctx, "GET", "/v1/sandboxes?"+q.Encode(), nil, &out)
}

// SetPools replaces the daemon's warm pool targets (admin).
func (c *Client) SetPools(ctx context.Context, req *api.SetPoolsRequest) (*api.Pools, error) {
	var out api.Pools
	return &out, c.do(ctx, "PUT", "/v1/pools", req, &out)
}

// Get inspects a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id), nil, &sb)
}

// Remove destroys a sandbox.
func (c *Client) Remove(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id), nil, nil)
}

// RemoveAsync asks the daemon to remove a sandbox without waiting for its
// teardown: it returns once the removal is recorded (the daemon finishes
// it, also across a restart).
func (c *Client) RemoveAsync(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id)+"?wait=false", nil, nil)
}

// Stop stops a sandbox.
func (c *Client) Stop(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/stop", nil, &sb)
}

// Pause freezes a sandbox.
func (c *Client) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/pause", nil, &sb)
}

// Hibernate saves a sandbox whole to disk and ends its VMM (microVMs);
// Resume restores it.
func (c *Client) Hibernate(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/pause?to_disk=true", nil, &sb)
}

// Resume thaws a sandbox.
func (c *Client) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/resume", nil, &sb)
}

// Exec runs a command, streaming its output; it returns the exit frame.
// stdin is attached when req.Stdin is true.
func (c *Client) Exec(ctx context.Context, id string, req *api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*api.ExecFrame, error) {
	line, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	line = append(line, '\n')
	var body io.Reader = bytes.NewReader(line)
	if req.Stdin && stdin != nil {
		body = io.MultiReader(body, stdin)
	}
	resp, err := c.open(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/exec", "application/octet-stream", body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		var f api.ExecFrame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return nil, fmt.Errorf("exec stream: %w", err)
		}
		switch f.Stream {
		case "stdout":
			if _, err := stdout.Write(f.Data); err != nil {
				return nil, err
			}
		case "stderr":
			if _, err := stderr.Write(f.Data); err != nil {
				return nil, err
			}
		case "exit":
			return &f, nil
		case "error":
			return nil, &Error{Status: 500, Kind: "internal", Msg: f.Error}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("exec stream: %w", err)
	}
	return nil, errors.New("exec stream ended without an exit frame (did the daemon stop?)")
}

// WriteFile writes a file into a sandbox.
func (c *Client) WriteFile(ctx context.Context, id, path string, mode uint32, data io.Reader) error {
	q := url.Values{"path": {path}, "mode": {fmt.Sprintf("%o", mode)}}
	resp, err := c.open(ctx, "PUT", "/v1/sandboxes/"+url.PathEscape(id)+"/files?"+q.Encode(), "application/octet-stream", data)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// ReadFile reads a file from a sandbox.
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	q := url.Values{"path": {path}}
	resp, err := c.open(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/files?"+q.Encode(), "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// Events lists audit events (sandbox "" = all of the tenant's).
func (c *Client) Events(ctx context.Context, sandbox string, after int64) ([]api.Event, error) {
	q := url.Values{}
	if sandbox != "" {
		q.Set("sandbox", sandbox)
	}
	if after > 0 {
		q.Set("after", fmt.Sprint(after))
	}
	var out []api.Event
	return out, c.do(ctx, "GET", "/v1/events?"+q.Encode(), nil, &out)
}

// CreateTenant creates a tenant (admin only).
func (c *Client) CreateTenant(ctx context.Context, req *api.CreateTenantRequest) (*api.Tenant, error) {
	var t api.Tenant
	return &t, c.do(ctx, "POST", "/v1/tenants", req, &t)
}

// Tenants lists tenants (admin only).
func (c *Client) Tenants(ctx context.Context) ([]api.Tenant, error) {
	var out []api.Tenant
	return out, c.do(ctx, "GET", "/v1/tenants", nil, &out)
}

// Pools describes the daemon's warm pools (admin only).
func (c *Client) Pools(ctx context.Context) (*api.Pools, error) {
	var out api.Pools
	return &out, c.do(ctx, "GET", "/v1/pools", nil, &out)
}

// CreateKey creates an API key for a tenant (admin only).
func (c *Client) CreateKey(ctx context.Context, tenant string) (*api.APIKey, error) {
	var k api.APIKey
	return &k, c.do(ctx, "POST", "/v1/tenants/"+url.PathEscape(tenant)+"/keys", nil, &k)
}

// Raw sends a request and returns the response (tests of malformed input).
func (c *Client) Raw(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	r, err := c.req(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return c.http.Do(r)
}

// FollowEvents streams the tenant's events (of one sandbox when sandbox is
// not "") after seq, calling fn for each until ctx ends or fn returns an error.
func (c *Client) FollowEvents(ctx context.Context, sandbox string, after int64, fn func(api.Event) error) error {
	q := url.Values{"follow": {"1"}}
	if sandbox != "" {
		q.Set("sandbox", sandbox)
	}
	if after > 0 {
		q.Set("after", fmt.Sprint(after))
	}
	resp, err := c.open(ctx, "GET", "/v1/events?"+q.Encode(), "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("event stream: %w", err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

// PutSecret stores a secret in the caller's tenant.
func (c *Client) PutSecret(ctx context.Context, req *api.PutSecretRequest) (*api.Secret, error) {
	var s api.Secret
	return &s, c.do(ctx, "POST", "/v1/secrets", req, &s)
}

// Secrets lists the caller's secrets (previews only).
func (c *Client) Secrets(ctx context.Context) ([]api.Secret, error) {
	var out []api.Secret
	return out, c.do(ctx, "GET", "/v1/secrets", nil, &out)
}

// RotateSecret replaces a secret's value.
func (c *Client) RotateSecret(ctx context.Context, name, value string) (*api.Secret, error) {
	return c.RotateSecretWith(ctx, name, &api.RotateSecretRequest{Value: value})
}

// RotateSecretWith replaces a secret's value, and its settings the request
// gives (AllowEnv).
func (c *Client) RotateSecretWith(ctx context.Context, name string, req *api.RotateSecretRequest) (*api.Secret, error) {
	var s api.Secret
	return &s, c.do(ctx, "PUT", "/v1/secrets/"+url.PathEscape(name), req, &s)
}

// DeleteSecret deletes a secret.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/secrets/"+url.PathEscape(name), nil, nil)
}

// RevokeSecret revokes a secret.
func (c *Client) RevokeSecret(ctx context.Context, name string) (*api.Secret, error) {
	var s api.Secret
	return &s, c.do(ctx, "POST", "/v1/secrets/"+url.PathEscape(name)+"/revoke", nil, &s)
}

// Unbind removes a secret binding from a running sandbox.
func (c *Client) Unbind(ctx context.Context, id, name string) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id)+"/secrets/"+url.PathEscape(name), nil, &sb)
}

// PutTool registers a tool (replace: replaces one of the same name).
func (c *Client) PutTool(ctx context.Context, t *api.Tool, replace bool) (*api.Tool, error) {
	var out api.Tool
	p := "/v1/tools"
	if replace {
		p += "?replace=true"
	}
	return &out, c.do(ctx, "POST", p, t, &out)
}

// Tools lists the caller's tools.
func (c *Client) Tools(ctx context.Context) ([]api.Tool, error) {
	var out []api.Tool
	return out, c.do(ctx, "GET", "/v1/tools", nil, &out)
}

// Tool returns one of the caller's tools.
func (c *Client) Tool(ctx context.Context, name string) (*api.Tool, error) {
	var out api.Tool
	return &out, c.do(ctx, "GET", "/v1/tools/"+url.PathEscape(name), nil, &out)
}

// DeleteTool removes a tool.
func (c *Client) DeleteTool(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/tools/"+url.PathEscape(name), nil, nil)
}

// Execute runs a tool once with input.
func (c *Client) Execute(ctx context.Context, name string, req *api.ExecuteRequest) (*api.ExecuteResult, error) {
	var out api.ExecuteResult
	return &out, c.do(ctx, "POST", "/v1/tools/"+url.PathEscape(name)+"/execute", req, &out)
}

// RequestAccess asks an operator to let a sandbox reach a host and waits
// for the decision.
func (c *Client) RequestAccess(ctx context.Context, id string, req *api.AccessRequest) (*api.AccessResult, error) {
	var out api.AccessResult
	return &out, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/access", req, &out)
}

// ListDir lists a directory in a sandbox.
func (c *Client) ListDir(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	var out []api.FileInfo
	return out, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/dir?"+url.Values{"path": {path}}.Encode(), nil, &out)
}

// Metrics returns the daemon's Prometheus metrics (admin only).
func (c *Client) Metrics(ctx context.Context) (string, error) {
	resp, err := c.open(ctx, "GET", "/metrics", "", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
