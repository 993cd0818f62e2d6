package daemon

import (
	"net/http"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/store"
)

// createSnapshot: POST /v1/sandboxes/{id}/snapshots saves a running
// sandbox for new sandboxes to start from (201 Snapshot).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.CreateSnapshotRequest
	if err := decodeOptional(r, &req); err != nil {
		return err
	}
	sn, err := s.mgr.Snapshots().Create(r.Context(), scope(t), r.PathValue("id"), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, sn)
	return nil
}

// listSnapshots: GET /v1/snapshots (the tenant's; the admin's: all).
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	l, err := s.mgr.Snapshots().List(r.Context(), scope(t))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

// getSnapshot: GET /v1/snapshots/{name}.
func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	sn, err := s.mgr.Snapshots().Get(r.Context(), scope(t), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sn)
	return nil
}

// removeSnapshot: DELETE /v1/snapshots/{name} (409 while a sandbox
// started from it exists).
func (s *Server) removeSnapshot(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	if err := s.mgr.Snapshots().Remove(r.Context(), scope(t), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkSandbox: POST /v1/sandboxes/{id}/fork makes copies of a running
// sandbox (201 ForkResponse).
func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.ForkRequest
	if err := decodeOptional(r, &req); err != nil {
		return err
	}
	res, err := s.mgr.Snapshots().Fork(r.Context(), scope(t), r.PathValue("id"), &req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, res)
	return nil
}
