//go:build linux

package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// TestSetPools: a manager started with no pool targets fills the classes
// PUT /v1/pools sets, serves creates from them, refuses bad targets
// without changing anything, and destroys the pooled sandboxes of a class
// that is dropped (sandbox, pool record).
func TestSetPools(t *testing.T) {
	testRuntime.use(createPlan{})
	m, _, _ := newCreateManager(t, "")
	if _, err := m.pools.Set(&api.SetPoolsRequest{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("before StartPool: %v", err)
	}
	if err := m.pools.Start(); err != nil {
		t.Fatal(err)
	}
	p, err := m.pools.Set(&api.SetPoolsRequest{Targets: []api.PoolTarget{{Runtime: createRuntimeName, Image: "default", Size: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Pools) != 1 || p.Pools[0].Target != 2 || p.Pools[0].Class != createRuntimeName+":default" {
		t.Fatalf("answer %+v", p.Pools)
	}
	waitUntil(t, "two pooled sandboxes", func() bool { return poolStatus(m).Ready == 2 })

	for _, tc := range []struct {
		name string
		t    api.PoolTarget
		want string
	}{
		{"unknown runtime", api.PoolTarget{Runtime: "nope", Image: "default", Size: 1}, `no runtime "nope"`},
		{"unknown image", api.PoolTarget{Runtime: createRuntimeName, Image: "missing", Size: 1}, "missing"},
		{"size", api.PoolTarget{Runtime: createRuntimeName, Image: "default", Size: 257}, "out of range"},
		{"negative", api.PoolTarget{Runtime: createRuntimeName, Image: "default", Size: -1}, "out of range"},
		{"memory", api.PoolTarget{Runtime: createRuntimeName, Image: "default", Size: 1, MemoryBytes: 1 << 20}, "below the minimum"},
		{"blank", api.PoolTarget{Size: 1}, "give runtime and image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.pools.Set(&api.SetPoolsRequest{Targets: []api.PoolTarget{tc.t}})
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid saying %q", err, tc.want)
			}
		})
	}
	dup := api.PoolTarget{Runtime: createRuntimeName, Image: "default", Size: 1}
	if _, err := m.pools.Set(&api.SetPoolsRequest{Targets: []api.PoolTarget{dup, dup}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a class twice: %v", err)
	}
	if st := poolStatus(m); st.Target != 2 || st.Ready != 2 {
		t.Fatalf("refused targets changed the pool: %+v", st)
	}

	// A create of the class is a pool hit.
	made := testRuntime.sandboxes()
	sb, err := m.Create(context.Background(), &store.Tenant{ID: "t1"}, createRequest())
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != made[0].id && sb.ID != made[1].id {
		t.Fatalf("create %s was not served from the pool", sb.ID)
	}
	waitUntil(t, "a refill", func() bool { return poolStatus(m).Ready == 2 })

	// Dropping the class destroys its ready sandboxes and their records.
	p, err = m.pools.Set(&api.SetPoolsRequest{Targets: []api.PoolTarget{}})
	if err != nil || len(p.Pools) != 0 {
		t.Fatalf("empty targets: %+v, %v", p, err)
	}
	waitUntil(t, "pooled sandboxes destroyed", func() bool {
		rs, err := m.cfg.Store.ListUnownedSandboxes(context.Background())
		return err == nil && len(rs) == 0
	})
	for _, s := range testRuntime.sandboxes() {
		destroyed, _, _ := s.released()
		if s.id == sb.ID {
			if destroyed {
				t.Fatal("the claimed sandbox was destroyed")
			}
			continue
		}
		if !destroyed {
			t.Errorf("pooled sandbox %s left alive", s.id)
		}
	}
}
