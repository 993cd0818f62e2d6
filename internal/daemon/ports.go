package daemon

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

func pathPort(r *http.Request) (int, error) {
	p, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("%w: port %q: want a TCP port 1-65535", errdefs.ErrInvalid, r.PathValue("port"))
	}
	return p, nil
}

func (s *Server) addPort(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.PortSpec
	if err := decode(r, &req); err != nil {
		return err
	}
	p, err := s.mgr.Ports().AddPort(r.Context(), scope(t), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, p)
	return nil
}

func (s *Server) listPorts(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	l, err := s.mgr.Ports().ListPorts(r.Context(), scope(t), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (s *Server) removePort(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	port, err := pathPort(r)
	if err != nil {
		return err
	}
	if err := s.mgr.Ports().RemovePort(r.Context(), scope(t), r.PathValue("id"), port); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) portURL(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	port, err := pathPort(r)
	if err != nil {
		return err
	}
	var req api.PortURLRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			return err
		}
	}
	u, err := s.mgr.Ports().PortURL(r.Context(), scope(t), r.PathValue("id"), port, req.TTL)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, u)
	return nil
}
