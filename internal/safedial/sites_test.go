package safedial

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// outbound are the places in the module that make an HTTP or WebSocket
// client connection, each with why it may: a tenant-supplied URL must go
// through this package's Dialer. A new place fails TestOutboundSites until
// it is added here — deciding whether a tenant names its destination.
var outbound = map[string]string{
	"internal/safedial/client.go":  "the guarded client itself (Dialer.HTTPClient)",
	"internal/egress/egress.go":    "egress upstreams: the transport dials through Proxy.guard, a safedial.Dialer",
	"internal/ingress/ingress.go":  "inbound: dials a guest's published port over its own link, never a URL a tenant names",
	"internal/relay/websocket.go":  "a tenant's relay URL: dials with WebSocketConfig.HTTPClient, the daemon's tenantClient",
	"internal/relay/discord.go":    "the Discord gateway and the resume URL it hands out: DiscordConfig.HTTPClient, the daemon's tenantClient",
	"client/client.go":             "the CLI and SDK client of the daemon's own API",
	"internal/image/oci.go":        "OCI registry pulls: POST /v1/images/pull is the admin's (Admin: true), not a tenant's",
	"isolation/firecracker/api.go": "Firecracker's API over its unix socket",
	"client/pty.go":                "the CLI's terminal WebSocket to the daemon's own API",
}

var outboundRe = regexp.MustCompile(`http\.Client\{|http\.Transport\{|websocket\.Dial\(|http\.DefaultClient|http\.DefaultTransport|http\.(Get|Post|PostForm|Head)\(`)

// TestOutboundSites enumerates the code that opens client connections
// toward URLs (relays, approval webhooks, anything later) and checks each
// against the list above, so none can bypass the guarded dialer unseen.
// The daemon's wiring of the tenant client into relays and approval
// webhooks is checked by the daemon's TestTenantClientRefusesPrivate and
// livepolicy's TestWebhookSSRF.
func TestOutboundSites(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "testdata",
				rel == "bench", rel == "test", rel == "sdk", strings.HasPrefix(rel, "internal/kube"), rel == "internal/testbin":
				return filepath.SkipDir // benchmarks, tests' harnesses, the fleet's client-go
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if outboundRe.Match(b) {
			found = append(found, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		if _, ok := outbound[f]; !ok {
			t.Errorf("%s opens client connections and is not in the list of outbound sites: dial tenants' URLs through safedial.Dialer (HTTPClient), then add it with the reason", f)
		}
	}
	for f := range outbound {
		if !slices.Contains(found, f) {
			t.Errorf("%s is listed but opens no client connection: drop it from the list", f)
		}
	}
	// The livepolicy default client for approval webhooks is the guarded one.
	lp, err := os.ReadFile(filepath.Join(root, "internal", "livepolicy", "livepolicy.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(lp), "cfg.WebhookClient = safedial.New(") {
		t.Error("livepolicy's default approval-webhook client is not safedial's")
	}
}
