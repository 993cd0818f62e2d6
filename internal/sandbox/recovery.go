package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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

// Recover is the one recovery path after a daemon restart, for every
// sandbox the store has a row of: it re-attaches to every sandbox the
// store says is running or paused, cleans up (and marks failed) those
// that are gone or were being created, finishes removals, and destroys
// the pooled sandboxes (rows of no tenant) a stopped daemon left. Call it
// after the gateway's Init, before Pools.Start.
func (m *Manager) Recover(ctx context.Context) error {
	pooled, err := m.cfg.Store.ListUnownedSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("list pooled sandboxes: %w", err)
	}
	for _, r := range pooled {
		m.recoverPooled(ctx, r)
	}
	m.recoverLegacyPool(ctx)
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
				if creds, err = m.secrets.bindings(r.TenantID, sr.Secrets); err == nil {
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
		// Who paused it is in its record (the operator's pause stays the
		// operator's); a record from before that was kept, of a sandbox
		// whose idle action is pause, is taken as paused by its idle
		// timeout: the next call wakes it.
		paused := r.Status == StatusPaused || r.Status == StatusHibernated
		by := ""
		if paused {
			by = sr.PausedBy
			if by == "" && (sr.IdleAction == IdlePause || sr.IdleAction == IdleHibernate) {
				by = pausedIdle
			}
		}
		e := &entry{id: r.ID, tenant: r.TenantID, sb: sb, token: sr.AgentToken, paused: paused, pausedBy: by, execCwd: sr.ExecCwd, execUser: sr.ExecUser}
		m.live[r.ID] = e
		m.mu.Unlock()
		m.sysAudit.recover(r, sr.Audit, e)
		m.Emit(r.TenantID, r.ID, api.SandboxReattached{})
		log.Info("re-attached sandbox after restart", "status", r.Status)
	}
	// After the sandboxes: which snapshots they hold is known now.
	return m.snapshots.recoverSnapshots(ctx)
}

// recoverPooled destroys a pooled sandbox a stopped daemon left and
// deletes its row; one its runtime cannot destroy keeps its row, for the
// next start to try again.
func (m *Manager) recoverPooled(ctx context.Context, r *store.Sandbox) {
	var sr specRecord
	_ = json.Unmarshal(r.Spec, &sr)
	if sb := m.sandboxFromRecord(ctx, r); sb != nil {
		if err := sb.Destroy(ctx); err != nil {
			m.log.Error("destroy a pooled sandbox left by a stopped daemon", "sandbox", r.ID, "err", err)
			return
		}
	}
	m.cleanupOrphanDir(r)
	m.detach(r.ID)
	m.imageRefs.release(r.ID)
	if err := m.cfg.Store.DeleteSandbox(ctx, r.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.log.Error("delete a pooled sandbox's row", "sandbox", r.ID, "err", err)
		return
	}
	m.log.Info("destroyed a pooled sandbox left by a stopped daemon", "sandbox", r.ID, "class", sr.Pool)
}

// Before pooled sandboxes were store rows, each had a record file below
// StateDir/pool. A daemon started over a state directory of that layout
// destroys the sandboxes those files name, once (recoverLegacyPool).

// legacyPoolRecord is such a file.
type legacyPoolRecord struct {
	ID       string           `json:"id"`
	Class    string           `json:"class"`
	StateDir string           `json:"state_dir"`
	State    *isolation.State `json:"state,omitempty"`
}

// LegacyPoolIDs lists the sandboxes the pool record files of an older
// daemon name (the daemon passes them to the gateway's Init as its own,
// so their links are removed; Recover destroys the rest).
func LegacyPoolIDs(stateDir string) []string {
	ents, _ := os.ReadDir(filepath.Join(stateDir, "pool"))
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(id, ".") {
			ids = append(ids, id)
		}
	}
	return ids
}

// recoverLegacyPool destroys the pooled sandboxes an older daemon's
// record files name, then removes the files and their directory. A
// sandbox the store has a row of was claimed before that daemon stopped:
// it is Recover's like any other.
func (m *Manager) recoverLegacyPool(ctx context.Context) {
	dir := filepath.Join(m.cfg.StateDir, "pool")
	for _, id := range LegacyPoolIDs(m.cfg.StateDir) {
		file := filepath.Join(dir, id+".json")
		b, err := os.ReadFile(file)
		var r legacyPoolRecord
		if err != nil || json.Unmarshal(b, &r) != nil || r.ID != id {
			m.log.Warn("unreadable pool record; removing it", "file", file)
			_ = os.Remove(file)
			continue
		}
		if _, err := m.cfg.Store.GetSandbox(ctx, "", id); err == nil {
			_ = os.Remove(file)
			continue
		}
		if r.State != nil {
			if rt, ok := isolation.Lookup(r.State.Runtime); ok {
				if sb, err := rt.Recover(ctx, *r.State); sb != nil {
					if err := sb.Destroy(ctx); err != nil {
						m.log.Error("destroy a pooled sandbox left by an older daemon", "sandbox", id, "err", err)
						continue
					}
				} else if err != nil && !errors.Is(err, isolation.ErrGone) {
					m.log.Warn("pooled sandbox left by an older daemon", "sandbox", id, "err", err)
				}
			}
		}
		if r.StateDir != "" {
			unmountBelow(r.StateDir)
			_ = os.RemoveAll(r.StateDir)
		}
		m.detach(id)
		m.imageRefs.release(id)
		_ = os.Remove(file)
		m.log.Info("destroyed a pooled sandbox left by an older daemon", "sandbox", id, "class", r.Class)
	}
	// Only what a crash mid-write left (.ID.tmp) can remain: the layout
	// is gone.
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") && strings.HasSuffix(e.Name(), ".tmp") {
				_ = os.Remove(filepath.Join(dir, e.Name()))
			}
		}
		_ = os.Remove(dir)
	}
}
