package daemon

import (
	"net/http"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/store"
)

// Named volumes (package sandbox, volumes.go): tenant-scoped.

// createVolume: POST /v1/volumes makes an empty volume.
func (s *Server) createVolume(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.CreateVolumeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	v, err := s.mgr.Volumes().CreateVolume(r.Context(), t, &req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, v)
	return nil
}

// listVolumes: GET /v1/volumes lists the tenant's volumes and the
// sandboxes that mount them.
func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	l, err := s.mgr.Volumes().ListVolumes(r.Context(), t.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

// removeVolume: DELETE /v1/volumes/{name} deletes a volume and its data
// (409 while a sandbox mounts it).
func (s *Server) removeVolume(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	if err := s.mgr.Volumes().RemoveVolume(r.Context(), t.ID, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
