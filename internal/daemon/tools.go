package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/livepolicy"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
)

// Named tools (package sandbox, tools.go).

// putTool: POST /v1/tools registers a tool; ?replace=true replaces one of
// the same name.
func (s *Server) putTool(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var tool api.Tool
	if err := decode(r, &tool); err != nil {
		return err
	}
	out, err := s.mgr.Tools().PutTool(r.Context(), t, &tool, r.URL.Query().Get("replace") == "true")
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listTools(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	l, err := s.mgr.Tools().ListTools(r.Context(), t.ID)
	if err != nil {
		return err
	}
	writeJSON(w, 200, l)
	return nil
}

func (s *Server) getTool(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	tool, err := s.mgr.Tools().GetTool(r.Context(), t.ID, r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, tool)
	return nil
}

func (s *Server) deleteTool(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	if err := s.mgr.Tools().DeleteTool(r.Context(), t.ID, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// executeTool: POST /v1/tools/{name}/execute runs the tool once and
// answers with its result (the input may be up to sandbox.MaxToolInput).
func (s *Server) executeTool(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.ExecuteRequest
	body := http.MaxBytesReader(nil, r.Body, sandbox.MaxToolInput+64<<10)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return fmt.Errorf("%w: input over %d bytes: give a smaller input or pass a file the tool fetches", errdefs.ErrInvalid, sandbox.MaxToolInput)
		case errors.Is(err, io.EOF):
			return fmt.Errorf("%w: empty body: send {\"input\": \"…\"}", errdefs.ErrInvalid)
		}
		return fmt.Errorf("%w: invalid JSON: %v", errdefs.ErrInvalid, err)
	}
	res, err := s.mgr.Tools().Execute(r.Context(), t, r.PathValue("name"), &req)
	if err != nil {
		return err
	}
	writeJSON(w, 200, res)
	return nil
}

// requestAccess: POST /v1/sandboxes/{id}/access waits for an operator's
// decision on the host (at most the request's timeout, default 10m).
func (s *Server) requestAccess(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var req api.AccessRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	wait, err := accessWait(req.Timeout)
	if err != nil {
		return err
	}
	res, err := s.mgr.RequestAccess(r.Context(), scope(t), r.PathValue("id"), req.Host, req.Reason, wait)
	if err != nil {
		return err
	}
	writeJSON(w, 200, res)
	return nil
}

// accessWait reads an access request's timeout ("" = the longest).
func accessWait(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > livepolicy.MaxAccessWait {
		return 0, fmt.Errorf("%w: timeout: %q is not a duration up to %s", errdefs.ErrInvalid, s, livepolicy.MaxAccessWait)
	}
	return d, nil
}
