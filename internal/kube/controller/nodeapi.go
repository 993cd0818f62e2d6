package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// NodeAPI is what the controller needs from a node agent's API. The real
// one is the node's TCP API (client.NewTCP with the fleet admin key);
// the tests use an in-memory one.
type NodeAPI interface {
	Create(ctx context.Context, req *api.CreateSandboxRequest) (*api.Sandbox, error)
	ListLabeled(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	Get(ctx context.Context, id string) (*api.Sandbox, error)
	Remove(ctx context.Context, id string) error
	SetPools(ctx context.Context, req *api.SetPoolsRequest) (*api.Pools, error)
	Pools(ctx context.Context) (*api.Pools, error)
	PullImage(ctx context.Context, req *api.PullImageRequest) (*api.Image, error)
}

var _ NodeAPI = (*client.Client)(nil)

// Dialer returns the API of the node whose lease announces endpoint.
type Dialer func(endpoint string) (NodeAPI, error)

// TCPDialer dials node endpoints with the fleet admin key and trusts
// caFile (besides the system roots) for their certificates; it keeps one
// client per endpoint.
func TCPDialer(key, caFile string) Dialer {
	var (
		// mu guards clients.
		mu      sync.Mutex
		clients = map[string]NodeAPI{}
	)
	return func(endpoint string) (NodeAPI, error) {
		mu.Lock()
		defer mu.Unlock()
		if c, ok := clients[endpoint]; ok {
			return c, nil
		}
		c, err := client.NewTCP(endpoint, key, client.Options{CACertFile: caFile})
		if err != nil {
			return nil, fmt.Errorf("node endpoint: %w", err)
		}
		clients[endpoint] = c
		return c, nil
	}
}

// ReadKeyFile reads the fleet admin key (a random string of 32 or more
// characters; surrounding whitespace is dropped).
func ReadKeyFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("node key: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if len(key) < 32 {
		return "", fmt.Errorf("node key %s: %d characters, want a random string of at least 32 (the fleet admin key the nodes' --admin-key-file holds)", path, len(key))
	}
	return key, nil
}

// nodeErrKind is the kind of a node API error answer (api.Error.Kind:
// "invalid", "denied", "not_found", …); "" for a transport failure.
func nodeErrKind(err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

// isNotFound reports whether a node answered that a sandbox is not there.
func isNotFound(err error) bool { return client.IsNotFound(err) || nodeErrKind(err) == "not_found" }
