package e2b

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/internal/errdefs"
)

func TestIDs(t *testing.T) {
	for _, tc := range []struct{ cagebox, e2b string }{
		{"sb-0123456789abcdef", "sb0123456789abcdef"},
	} {
		if got := ToE2BID(tc.cagebox); got != tc.e2b {
			t.Errorf("ToE2BID(%q) = %q, want %q", tc.cagebox, got, tc.e2b)
		}
		if got := FromE2BID(tc.e2b); got != tc.cagebox {
			t.Errorf("FromE2BID(%q) = %q, want %q", tc.e2b, got, tc.cagebox)
		}
	}
	for _, bad := range []string{"", "sb-0123456789abcdef", "sb0123456789ABCDEF", "sb0123456789abcde", "xx0123456789abcdef", "sb0123456789abcdef0"} {
		if got := FromE2BID(bad); got != "" {
			t.Errorf("FromE2BID(%q) = %q, want none", bad, got)
		}
	}
}

func TestHostRoute(t *testing.T) {
	for _, tc := range []struct {
		host, domain, port, id string
		ok                     bool
	}{
		{"49983-sb0123456789abcdef.sb.example", "sb.example", "49983", "sb0123456789abcdef", true},
		{"49983-sb0123456789abcdef.sb.example:3000", "sb.example", "49983", "sb0123456789abcdef", true},
		{"49983-sb0123456789abcdef.other.example", "sb.example", "", "", false},
		{"sb.example", "sb.example", "", "", false},
		{"49983-x.sb.example", "", "", "", false},
	} {
		port, id, ok := hostRoute(tc.host, tc.domain)
		if port != tc.port || id != tc.id || ok != tc.ok {
			t.Errorf("hostRoute(%q, %q) = %q, %q, %v", tc.host, tc.domain, port, id, ok)
		}
	}
}

func TestAccessToken(t *testing.T) {
	s := New(Config{Key: []byte("k1")})
	defer s.Close()
	a, b := s.AccessToken("sb-0000000000000001"), s.AccessToken("sb-0000000000000002")
	if a == b || !s.tokenOK("sb-0000000000000001", a) || s.tokenOK("sb-0000000000000002", a) || s.tokenOK("sb-0000000000000001", "") {
		t.Fatal("access tokens must be per sandbox")
	}
	o := New(Config{Key: []byte("k2")})
	defer o.Close()
	if o.tokenOK("sb-0000000000000001", a) {
		t.Fatal("another host key accepted the token")
	}
}

func TestTrafficToken(t *testing.T) {
	s := New(Config{Key: []byte("k1")})
	defer s.Close()
	id := "sb-0000000000000001"
	a := s.TrafficToken(id)
	if a == s.AccessToken(id) || a == s.TrafficToken("sb-0000000000000002") || !s.trafficOK(id, a) || s.trafficOK("sb-0000000000000002", a) || s.trafficOK(id, s.AccessToken(id)) || s.trafficOK(id, "") {
		t.Fatal("traffic tokens must be per sandbox and not the envd token")
	}
}

func TestCreateRequestPublicTraffic(t *testing.T) {
	for body, public := range map[string]bool{`{"allowPublicTraffic":true}`: true, `{"allowPublicTraffic":false}`: false, `{}`: false} {
		r, err := createRequest(&newSandbox{TemplateID: "base", Network: []byte(body)})
		if err != nil || (r.Labels[labelPublic] == "true") != public {
			t.Errorf("%s: %+v, %v", body, r, err)
		}
	}
}

func TestCreateRequest(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	yes := true
	r, err := createRequest(&newSandbox{TemplateID: "base", Timeout: i(300), Metadata: map[string]string{"run": "r1"}, EnvVars: map[string]string{"B": "2", "A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Image != "default" || r.Timeout != (300*time.Second).String() || r.Labels[labelMeta+"run"] != "r1" || r.Labels[labelTemplate] != "base" || strings.Join(r.Env, ",") != "A=1,B=2" {
		t.Fatalf("createRequest: %+v", r)
	}
	r, err = createRequest(&newSandbox{TemplateID: "base", EnvVars: map[string]string{"GH": "vault:GITHUB_TOKEN", "X": "1"}})
	if err != nil || len(r.Secrets) != 1 || r.Secrets[0].Name != "GH" || r.Secrets[0].Secret != "GITHUB_TOKEN" || strings.Join(r.Env, ",") != "X=1" {
		t.Fatalf("createRequest with a vault: value: %+v, %v", r, err)
	}
	// allow_internet_access (2.45 sends true by default) changes nothing.
	if r, err := createRequest(&newSandbox{TemplateID: "base", AllowInternetAccess: &yes}); err != nil || r.Policy != nil || r.Allow != nil {
		t.Fatalf("allow_internet_access: %+v, %v", r, err)
	}
	// IMAGE:RUNTIME picks the runtime (the manager checks the floor).
	r, err = createRequest(&newSandbox{TemplateID: "base:gvisor"})
	if err != nil || r.Image != "default" || r.Runtime != "gvisor" || r.Labels[labelTemplate] != "base" || r.Labels[labelRuntime] != "gvisor" {
		t.Fatalf("createRequest base:gvisor: %+v, %v", r, err)
	}
	r, err = createRequest(&newSandbox{TemplateID: "busybox"})
	if err != nil || r.Image != "busybox" || r.Runtime != "" || r.Timeout != defaultTimeout.String() {
		t.Fatalf("createRequest without timeout: %+v, %v", r, err)
	}
	for name, n := range map[string]*newSandbox{
		"no template":    {},
		"no runtime":     {TemplateID: "base:"},
		"no image":       {TemplateID: ":gvisor"},
		"zero timeout":   {TemplateID: "base", Timeout: i(0)},
		"allowOut IP":    {TemplateID: "base", Network: []byte(`{"allowOut":["1.1.1.1"]}`)},
		"allowOut CIDR":  {TemplateID: "base", Network: []byte(`{"allowOut":["0.0.0.0/0"]}`)},
		"allowOut IPv6":  {TemplateID: "base", Network: []byte(`{"allowOut":["2001:db8::/32"]}`)},
		"allowOut bad":   {TemplateID: "base", Network: []byte(`{"allowOut":["not a host"]}`)},
		"denyOut name":   {TemplateID: "base", Network: []byte(`{"denyOut":["example.com"]}`)},
		"network rules":  {TemplateID: "base", Network: []byte(`{"allowOut":["a.example"],"rules":{"a.example":[{}]}}`)},
		"egressProxy":    {TemplateID: "base", Network: []byte(`{"egressProxy":{"address":"p:1080"}}`)},
		"network shape":  {TemplateID: "base", Network: []byte(`{"allowOut":"a.example"}`)},
		"autoPause":      {TemplateID: "base", AutoPause: &yes},
		"mcp":            {TemplateID: "base", MCP: []byte(`{}`)},
		"metadata value": {TemplateID: "base", Metadata: map[string]string{"k": "has space"}},
		"metadata key":   {TemplateID: "base", Metadata: map[string]string{"k y": "v"}},
	} {
		if _, err := createRequest(n); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	// allowOut names are allow rules; denyOut addresses (E2B's "deny
	// the rest") are what the sandbox has anyway.
	r, err = createRequest(&newSandbox{TemplateID: "base", AllowInternetAccess: &yes,
		Network: []byte(`{"allowOut":["api.example.test","*.pkg.example"],"denyOut":["0.0.0.0/0","10.0.0.0/8","8.8.8.8"]}`)})
	if err != nil || strings.Join(r.Allow, ",") != "api.example.test,*.pkg.example" || r.Policy != nil {
		t.Fatalf("network: %+v, %v", r, err)
	}
	// Without allowOut nothing is open.
	if r, err := createRequest(&newSandbox{TemplateID: "base", Network: []byte(`{"denyOut":["0.0.0.0/0"]}`)}); err != nil || len(r.Allow) != 0 || r.Policy != nil {
		t.Fatalf("denyOut only: %+v, %v", r, err)
	}
	// null fields are absent ones
	if _, err := createRequest(&newSandbox{TemplateID: "base", Network: []byte("null")}); err != nil {
		t.Errorf("network null: %v", err)
	}
}

func TestCursor(t *testing.T) {
	c := cursor{created: 1700000000123456789, id: "sb-0123456789abcdef"}
	got, err := parseCursor(c.String())
	if err != nil || *got != c {
		t.Fatalf("parseCursor(String()) = %+v, %v", got, err)
	}
	for _, bad := range []string{"x", "MTIz", c.String() + "x"} {
		if _, err := parseCursor(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("parseCursor(%q): %v", bad, err)
		}
	}
	older := cursor{created: c.created - 1, id: "sb-0000000000000000"}
	if !c.before(older) || older.before(c) {
		t.Error("newest first")
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct{ p, user, want string }{
		{"/tmp/x", "", "/tmp/x"},
		{"a.txt", "", "/root/a.txt"},
		{"a.txt", "root", "/root/a.txt"},
		{"a.txt", "user", "/home/user/a.txt"},
		{"/tmp/../etc/x", "", "/etc/x"},
	} {
		if got, err := resolve(tc.p, tc.user); err != nil || got != tc.want {
			t.Errorf("resolve(%q, %q) = %q, %v; want %q", tc.p, tc.user, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "a\x00b"} {
		if _, err := resolve(bad, ""); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("resolve(%q): %v", bad, err)
		}
	}
}
