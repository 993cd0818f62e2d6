package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/credentials"
	"github.com/cagebox/cagebox/internal/gateway"
	"github.com/cagebox/cagebox/internal/store"
	"github.com/cagebox/cagebox/isolation"
)

// sandboxFromRecord rebuilds a runtime handle for a sandbox this daemon is
// not attached to (stopped, or found after a restart), so it can be destroyed.
func (m *Manager) sandboxFromRecord(ctx context.Context, r *store.Sandbox) isolation.Sandbox {
	if len(r.State) == 0 {
		return nil
	}
	var st isolation.State
	if json.Unmarshal(r.State, &st) != nil {
		return nil
	}
	rt, ok := isolation.Lookup(st.Runtime)
	if !ok {
		return nil
	}
	sb, err := rt.Recover(ctx, st)
	if err != nil {
		// Recover of a sandbox that no longer runs cleans up and says gone.
		return nil
	}
	return sb
}

// cleanupOrphanDir removes what a sandbox that never recorded its runtime
// state left: mounts below its state dir, then the dir.
func (m *Manager) cleanupOrphanDir(r *store.Sandbox) {
	var sr specRecord
	if json.Unmarshal(r.Spec, &sr) != nil || sr.StateDir == "" {
		return
	}
	unmountBelow(sr.StateDir)
	_ = os.RemoveAll(sr.StateDir)
}

// Recover re-attaches to every sandbox the store says is running or
// paused, and cleans up (and marks failed) those that are gone.
func (m *Manager) Recover(ctx context.Context) error {
	rs, err := m.cfg.Store.ListSandboxes(ctx, "")
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	for _, r := range rs {
		switch r.Status {
		case StatusRunning, StatusPaused, StatusCreating, StatusHibernated:
		case StatusRemoving:
			// Accepted for removal before the daemon stopped: finish it.
			m.finishRemoval(r)
			continue
		default:
			continue
		}
		log := m.log.With("sandbox", r.ID)
		var sr specRecord
		_ = json.Unmarshal(r.Spec, &sr)
		var st isolation.State
		sb := isolation.Sandbox(nil)
		var rerr error
		if r.Status != StatusCreating && len(r.State) > 0 && json.Unmarshal(r.State, &st) == nil {
			if rt, ok := isolation.Lookup(st.Runtime); ok {
				sb, rerr = rt.Recover(ctx, st)
			} else {
				rerr = fmt.Errorf("runtime %q is not registered", st.Runtime)
			}
		} else if r.Status == StatusCreating {
			rerr = errors.New("the daemon stopped while the sandbox was being created")
			if s := m.sandboxFromRecord(ctx, r); s != nil {
				_ = s.Destroy(ctx)
			}
		}
		if sb != nil && rerr != nil {
			// A runtime that returns its sandbox with an error (ErrGone)
			// still gets it cleaned up; it is never taken for running.
			_ = sb.Destroy(ctx)
			sb = nil
		}
		if sb == nil {
			if rerr == nil {
				rerr = errors.New("no runtime state recorded")
			}
			m.cleanupOrphanDir(r)
			m.detach(r.ID)
			r.Status = StatusFailed
			r.Error = "lost after a daemon restart and cleaned up: " + rerr.Error()
			r.UpdatedAt = m.cfg.Now().UTC()
			_ = m.cfg.Store.UpdateSandbox(ctx, r)
			m.Emit(r.TenantID, r.ID, api.SandboxLost{Error: rerr.Error()})
			log.Warn("sandbox lost after restart", "err", rerr)
			continue
		}
		if gw := m.cfg.Gateway; gw != nil {
			// The live policy's newest generation is in the store; the
			// create-time document is the fallback for older sandboxes.
			att, err := gw.Attach(ctx, r.ID, r.TenantID, sr.Policy, sr.PolicyRef, gateway.AttachResume)
			if err == nil {
				var creds *credentials.Bindings
				if creds, err = m.credentialBindings(r.TenantID, sr.Secrets); err == nil {
					att.Credentials.Install(creds)
				}
			}
			if err != nil {
				// Without its gateway the sandbox would have no policy
				// point: destroy it rather than run it unconfined.
				log.Error("re-attach network failed; destroying the sandbox", "err", err)
				_ = sb.Destroy(ctx)
				m.detach(r.ID)
				r.Status, r.Error = StatusFailed, "network could not be re-attached after a daemon restart: "+err.Error()
				r.UpdatedAt = m.cfg.Now().UTC()
				_ = m.cfg.Store.UpdateSandbox(ctx, r)
				continue
			}
		}
		m.mu.Lock()
		// A paused sandbox whose idle action is pause is taken as paused by
		// its idle timeout: the next call wakes it.
		paused := r.Status == StatusPaused || r.Status == StatusHibernated
		e := &entry{id: r.ID, tenant: r.TenantID, sb: sb, token: sr.AgentToken, paused: paused, execCwd: sr.ExecCwd, execUser: sr.ExecUser,
			idlePaused: paused && (sr.IdleAction == IdlePause || sr.IdleAction == IdleHibernate)}
		m.live[r.ID] = e
		m.mu.Unlock()
		m.recoverAudit(r, sr.Audit, e)
		m.Emit(r.TenantID, r.ID, api.SandboxReattached{})
		log.Info("re-attached sandbox after restart", "status", r.Status)
	}
	return nil
}
