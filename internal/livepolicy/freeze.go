package livepolicy

import (
	"context"
	"fmt"
	"slices"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

// Admin is the operator's principal (the admin tenant's id). A freeze is
// owned by the principal that made it; only that principal or the admin
// lifts it, and a tenant's freeze of a scope the admin froze leaves the
// admin its owner: a tenant never undoes the operator.
const Admin = "admin"

// Actor is who freezes or thaws: Principal is Admin or a tenant's id (the
// freeze's owner), By is what events name (e.g. "api:alpha", "trigger:x").
type Actor struct {
	Principal, By string
}

// frozenSandbox is a sandbox-level freeze: the sandbox's tenant and the
// freeze's owner.
type frozenSandbox struct {
	tenant, owner string
}

// Freezes are kept in the store (store.Freeze) as well as here: Freeze
// records the freeze before it returns, Thaw deletes the records before
// it lifts anything, and Start loads them all before any sandbox is
// attached, so a daemon restart lifts no freeze and changes no owner. A
// sandbox-level freeze goes with its sandbox (Detach with remove).

// loadFreezes restores the freezes a previous daemon recorded. A record
// this daemon cannot read stops the start: guessing would thaw.
func (g *Registry) loadFreezes(ctx context.Context) error {
	fs, err := g.cfg.Store.ListFreezes(ctx)
	if err != nil {
		return fmt.Errorf("livepolicy: load freezes: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range fs {
		bad := func(why string) error {
			return fmt.Errorf("livepolicy: the freeze of %s %q in the store %s; the daemon does not start rather than lift a freeze (thaw it, or fix the freezes table, first)", f.Scope, f.Target, why)
		}
		if f.Owner == "" {
			return bad("has no owner")
		}
		switch f.Scope {
		case store.FreezeAll:
			g.frozenAll = true
		case store.FreezeTenant:
			if f.Target == "" {
				return bad("names no tenant")
			}
			g.frozenTenants[f.Target] = f.Owner
		case store.FreezeSandbox:
			if f.Target == "" || f.TenantID == "" {
				return bad("names no sandbox or tenant")
			}
			g.frozenSandboxes[f.Target] = frozenSandbox{tenant: f.TenantID, owner: f.Owner}
		default:
			return bad("has an unknown scope")
		}
	}
	if len(fs) > 0 {
		g.log.Info("restored freezes", "count", len(fs))
	}
	return nil
}

// Freeze cuts sandboxes off the network at once: by id, every sandbox of
// a tenant, or all (the admin's only). Their open connections are closed,
// DNS refuses and every request is denied (placeholders never reach a
// swap) until Thaw. The freeze records who made it; a freeze by a tenant
// of a scope the admin already froze stays the admin's. It is in force
// before Freeze returns and recorded in the store, so a daemon restart
// keeps it; an error says it could not be recorded (it is in force, but
// a restart would lift it). It returns the sandboxes affected.
func (g *Registry) Freeze(ctx context.Context, sc Scope, who Actor) ([]string, error) {
	if sc.All && who.Principal != Admin {
		return nil, fmt.Errorf("%w: freezing all sandboxes is for the admin; freeze your tenant instead", errdefs.ErrDenied)
	}
	g.fmu.Lock()
	defer g.fmu.Unlock()
	g.mu.Lock()
	var hit []*Sandbox
	var rec *store.Freeze
	switch {
	case sc.All:
		g.frozenAll = true
		rec = &store.Freeze{Scope: store.FreezeAll, Owner: Admin}
		for _, s := range g.sbs {
			hit = append(hit, s)
		}
	case sc.Tenant != "":
		o := owner(g.frozenTenants[sc.Tenant], who.Principal)
		g.frozenTenants[sc.Tenant] = o
		rec = &store.Freeze{Scope: store.FreezeTenant, Target: sc.Tenant, Owner: o}
		for _, s := range g.sbs {
			if s.Tenant == sc.Tenant {
				hit = append(hit, s)
			}
		}
	default:
		if s := g.sbs[sc.Sandbox]; s != nil {
			o := owner(g.frozenSandboxes[s.ID].owner, who.Principal)
			g.frozenSandboxes[s.ID] = frozenSandbox{tenant: s.Tenant, owner: o}
			rec = &store.Freeze{Scope: store.FreezeSandbox, Target: s.ID, TenantID: s.Tenant, Owner: o}
			hit = append(hit, s)
		}
	}
	g.mu.Unlock()
	if g.cfg.CloseConns != nil {
		for _, s := range hit {
			g.cfg.CloseConns(s.ID)
		}
	}
	ids := g.emitFreeze(sc, hit, true, who.By)
	if rec != nil {
		if err := g.cfg.Store.PutFreeze(context.WithoutCancel(ctx), rec); err != nil {
			g.log.Error("record freeze", "scope", rec.Scope, "target", rec.Target, "err", err)
			return ids, fmt.Errorf("livepolicy: frozen now, but the freeze could not be recorded, so a daemon restart would lift it (freeze again): %w", err)
		}
	}
	return ids, nil
}

// owner is who owns a freeze after p freezes a scope cur froze ("" none):
// the admin's stays the admin's.
func owner(cur, p string) string {
	if cur == Admin {
		return Admin
	}
	return p
}

// Thaw lifts freezes of the scope that who owns; the admin lifts any.
// Thawing a tenant or all also lifts the sandbox-level freezes under it
// that who owns (the admin's stay when a tenant thaws: they are listed in
// stillFrozen). A freeze of the scope, or above it, that another
// principal owns refuses the whole thaw with an error wrapping
// errdefs.ErrDenied that names its owner. The store's records go first:
// a thaw that cannot be recorded lifts nothing.
func (g *Registry) Thaw(ctx context.Context, sc Scope, who Actor) (thawed, stillFrozen []string, err error) {
	admin := who.Principal == Admin
	g.fmu.Lock()
	defer g.fmu.Unlock()
	g.mu.Lock()
	var hit []*Sandbox
	var del []*store.Freeze
	in := func(id string, f frozenSandbox) bool {
		return sc.All || (sc.Tenant != "" && f.tenant == sc.Tenant) || (sc.Sandbox != "" && id == sc.Sandbox)
	}
	switch {
	case sc.All:
		if !admin {
			g.mu.Unlock()
			return nil, nil, refuseThaw("every sandbox", Admin)
		}
		if g.frozenAll {
			del = append(del, &store.Freeze{Scope: store.FreezeAll})
		}
		for t := range g.frozenTenants {
			del = append(del, &store.Freeze{Scope: store.FreezeTenant, Target: t})
		}
		for _, s := range g.sbs {
			hit = append(hit, s)
		}
	case sc.Tenant != "":
		if err := g.mayThawLocked(sc.Tenant, "", who.Principal); err != nil {
			g.mu.Unlock()
			return nil, nil, err
		}
		if _, ok := g.frozenTenants[sc.Tenant]; ok {
			del = append(del, &store.Freeze{Scope: store.FreezeTenant, Target: sc.Tenant})
		}
		for _, s := range g.sbs {
			if s.Tenant == sc.Tenant {
				hit = append(hit, s)
			}
		}
	default:
		s := g.sbs[sc.Sandbox]
		f, frozen := g.frozenSandboxes[sc.Sandbox]
		tenant := f.tenant
		if s != nil {
			tenant = s.Tenant
			hit = append(hit, s)
		} else if !frozen {
			break
		}
		if err := g.mayThawLocked(tenant, sc.Sandbox, who.Principal); err != nil {
			g.mu.Unlock()
			return nil, nil, err
		}
		if frozen && !admin && f.owner != who.Principal {
			g.mu.Unlock()
			return nil, nil, refuseThaw("sandbox "+sc.Sandbox, f.owner)
		}
	}
	// The sandbox-level freezes under the scope that who may lift.
	var lift []string
	for id, f := range g.frozenSandboxes {
		if in(id, f) && (admin || f.owner == who.Principal) {
			lift = append(lift, id)
			del = append(del, &store.Freeze{Scope: store.FreezeSandbox, Target: id})
		}
	}
	g.mu.Unlock()
	// g.fmu held: no freeze or thaw comes between the check above and
	// the change below.
	if err := g.cfg.Store.DeleteFreezes(context.WithoutCancel(ctx), del); err != nil {
		g.log.Error("record thaw", "err", err)
		return nil, nil, fmt.Errorf("livepolicy: the thaw could not be recorded, so nothing was thawed (try again): %w", err)
	}
	var done []*Sandbox
	g.mu.Lock()
	switch {
	case sc.All:
		g.frozenAll = false
		clear(g.frozenTenants)
	case sc.Tenant != "":
		delete(g.frozenTenants, sc.Tenant)
	}
	for _, id := range lift {
		delete(g.frozenSandboxes, id)
	}
	for _, s := range hit {
		if _, ok := g.frozenSandboxes[s.ID]; ok {
			stillFrozen = append(stillFrozen, s.ID)
		} else {
			done = append(done, s)
		}
	}
	g.mu.Unlock()
	slices.Sort(stillFrozen)
	return g.emitFreeze(sc, done, false, who.By), stillFrozen, nil
}

// mayThawLocked refuses p a thaw under a freeze of everything or of
// tenant's sandboxes that another principal owns (g.mu held). sandbox
// names the target in the message when the thaw is of one sandbox.
func (g *Registry) mayThawLocked(tenant, sandbox, p string) error {
	if p == Admin {
		return nil
	}
	among := ""
	if sandbox != "" {
		among = " (sandbox " + sandbox + " among them)"
	}
	if g.frozenAll {
		return refuseThaw("every sandbox"+among, Admin)
	}
	if o := g.frozenTenants[tenant]; o != "" && o != p {
		return refuseThaw("tenant "+tenant+"'s sandboxes"+among, o)
	}
	return nil
}

// refuseThaw is the 403 of a thaw of what, which by froze.
func refuseThaw(what, by string) error {
	if by == Admin {
		return fmt.Errorf("%w: %s: frozen by the admin; only the admin can thaw it (ask your operator)", errdefs.ErrDenied, what)
	}
	return fmt.Errorf("%w: %s: frozen by tenant %s; only tenant %s or the admin can thaw it", errdefs.ErrDenied, what, by, by)
}

// emitFreeze sends each sandbox's frozen or thawed event and returns
// their ids.
func (g *Registry) emitFreeze(sc Scope, hit []*Sandbox, on bool, by string) []string {
	ids := make([]string, 0, len(hit))
	for _, s := range hit {
		var ev api.EventPayload = api.PolicyThawed{By: by, Scope: scopeName(sc)}
		if on {
			ev = api.PolicyFrozen{By: by, Scope: scopeName(sc)}
		}
		g.cfg.Emit(s.Tenant, s.ID, ev)
		ids = append(ids, s.ID)
	}
	return ids
}

// Scope names what Freeze and Thaw apply to: one sandbox, one tenant's
// sandboxes, or All.
type Scope struct {
	Sandbox, Tenant string
	All             bool
}

func scopeName(sc Scope) string {
	switch {
	case sc.All:
		return "all"
	case sc.Tenant != "":
		return "tenant:" + sc.Tenant
	}
	return "sandbox"
}

// freezeSelf freezes the sandbox on behalf of its own policy (a trigger
// that could not be applied fails closed): the tenant owns that freeze,
// as it owns the policy.
func (s *Sandbox) freezeSelf(ctx context.Context, by string) {
	_, _ = s.g.Freeze(ctx, Scope{Sandbox: s.ID}, Actor{Principal: s.Tenant, By: by})
}
