package controller

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/isolation"
)

// resolveRuntime is the runtime a sandbox asking for runtime (a name, or
// "" / "auto") at floor gets on a node of capacity c: the name itself
// when the node offers it at the floor; for auto the node's default
// runtime when it meets the floor, else the strongest available one that
// does. "" when the node cannot run it. Pool classes name a concrete
// runtime, so creates always send one.
func resolveRuntime(c fleet.Capacity, runtime string, floor isolation.Class) string {
	ok := func(r fleet.RuntimeInfo) (isolation.Class, bool) {
		if !r.Available {
			return 0, false
		}
		cl, err := isolation.ParseClass(r.Class)
		if err != nil || cl < floor {
			return 0, false
		}
		return cl, true
	}
	if runtime != "" && runtime != "auto" {
		for _, r := range c.Runtimes {
			if _, good := ok(r); good && r.Name == runtime {
				return runtime
			}
		}
		return ""
	}
	best, bestClass := "", isolation.Class(0)
	for _, r := range c.Runtimes {
		cl, good := ok(r)
		if !good {
			continue
		}
		if r.Name == c.DefaultRuntime {
			return r.Name
		}
		if cl > bestClass {
			best, bestClass = r.Name, cl
		}
	}
	return best
}

// candidate is an eligible node with its score.
type candidate struct {
	node    Node
	runtime string
	// poolReady: the node holds a ready warm sandbox of the spec's class
	// (after the ones the controller expects taken since its report).
	poolReady bool
	free      int64
	poolClass string
}

// choose picks a node for s among live: the eligible ones are those
// whose capacity runs s's runtime at s's floor; when warm is set and
// some eligible node holds a ready warm sandbox of s's class, only those
// count. Of the eligible, it samples bestOf at random and takes the one
// with the most memory free (reported free memory minus what was placed
// there since the report). why says what no node offers when ok is false.
func choose(live []Node, s *Spec, warm bool, bestOf int, reg *registry, rng *rand.Rand) (c candidate, why string, ok bool) {
	var all, pooled []candidate
	for _, n := range live {
		if n.CapacityErr != nil {
			continue
		}
		rt := resolveRuntime(n.Capacity, s.Req.Runtime, s.Floor)
		if rt == "" {
			continue
		}
		cand := candidate{node: n, runtime: rt, poolClass: s.PoolClass(rt)}
		placedMem, placedPool := reg.sinceReport(n, cand.poolClass)
		cand.free = n.Capacity.MemoryAvailable - placedMem
		if warm && n.Capacity.PoolReady(cand.poolClass)-placedPool > 0 {
			cand.poolReady = true
			pooled = append(pooled, cand)
		}
		all = append(all, cand)
	}
	if len(pooled) > 0 {
		all = pooled
	}
	if len(all) == 0 {
		return candidate{}, noNodeWhy(live, s), false
	}
	if bestOf < 1 {
		bestOf = 1
	}
	pick := rng.Perm(len(all))
	if len(pick) > bestOf {
		pick = pick[:bestOf]
	}
	best := all[pick[0]]
	for _, i := range pick[1:] {
		if c := all[i]; c.free > best.free || (c.free == best.free && c.node.Name < best.node.Name) {
			best = c
		}
	}
	return best, "", true
}

// noNodeWhy says why no live node can run s.
func noNodeWhy(live []Node, s *Spec) string {
	rt := s.Req.Runtime
	if rt == "" {
		rt = "auto"
	}
	want := "runtime " + rt
	if s.Floor != 0 {
		want += " at isolation floor " + s.Floor.String()
	}
	if len(live) == 0 {
		return "no live cagebox node (no node lease is current): start cagebox node agents, or wait for one to renew its lease"
	}
	var offers []string
	for _, n := range live {
		if n.CapacityErr != nil {
			offers = append(offers, n.Name+": no capacity report")
			continue
		}
		var names []string
		for _, r := range n.Capacity.Runtimes {
			if r.Available {
				names = append(names, r.Name+"("+r.Class+")")
			}
		}
		sort.Strings(names)
		offers = append(offers, n.Name+": "+strings.Join(names, ","))
	}
	return fmt.Sprintf("no live node offers %s (%s): change spec.podTemplate.spec.runtimeClassName or the isolation floor, or add a node that offers it", want, strings.Join(offers, "; "))
}
