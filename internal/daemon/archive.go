package daemon

import (
	"fmt"
	"net/http"

	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/store"
)

func (s *Server) getArchive(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	return fmt.Errorf("%w: not yet", errdefs.ErrInvalid)
}

func (s *Server) putArchive(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	return fmt.Errorf("%w: not yet", errdefs.ErrInvalid)
}
