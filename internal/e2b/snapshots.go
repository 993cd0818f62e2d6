package e2b

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/store"
)

// Snapshots and forks, as the SDK's Sandbox.createSnapshot,
// Sandbox.listSnapshots, Sandbox.deleteSnapshot and Sandbox.fork call
// them, onto the manager's snapshots (internal/sandbox/snapshots.go): a
// snapshot's E2B id is its cagebox name, which Sandbox.create takes as a
// template (templateOrSnapshot). E2B's fork reports each copy apart; the
// manager makes all of them or none, so an answer has only sandboxes, and
// a failure is the request's error.

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func infoOf(sn *api.Snapshot) snapshotInfo {
	return snapshotInfo{SnapshotID: sn.Name, Names: []string{sn.Name}}
}

// snapshotName is an E2B snapshot id or name as cagebox names it: E2B's
// ":default" tag (the only one cagebox has) is dropped.
func snapshotName(s string) string { return strings.TrimSuffix(s, ":default") }

// createSnapshot: POST /sandboxes/{id}/snapshots {"name": …}.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var body struct {
		Name string `json:"name"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
		return invalid("body: want {\"name\": …} or {}: %v", err)
	}
	sb, err := s.lookup(r, t)
	if err != nil {
		return err
	}
	sn, err := s.cfg.Manager.Snapshots().Create(r.Context(), t.ID, sb.ID, snapshotName(body.Name))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, infoOf(sn))
	return nil
}

// listSnapshots: GET /snapshots?sandboxID=…&name=…&limit=…&nextToken=…,
// by name, paged with X-Next-Token. A fork's snapshots are cagebox's own
// (removed with their copies) and are not listed.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return invalid("limit: %q is not a number from 1 to 1000", v)
		}
		limit = n
	}
	after := ""
	if v := q.Get("nextToken"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil {
			return invalid("nextToken: %q is not a token this front gave", v)
		}
		after = string(b)
	}
	bySandbox := ""
	if v := q.Get("sandboxID"); v != "" {
		if bySandbox = FromE2BID(v); bySandbox == "" {
			bySandbox = "\x00" // no sandbox of ours: nothing matches
		}
	}
	l, err := s.cfg.Manager.Snapshots().List(r.Context(), t.ID)
	if err != nil {
		return err
	}
	out := []snapshotInfo{}
	for _, sn := range l {
		switch {
		case sn.Fork, sn.Name <= after,
			bySandbox != "" && sn.Sandbox != bySandbox,
			q.Get("name") != "" && sn.Name != snapshotName(q.Get("name")):
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(out[len(out)-1].SnapshotID)))
			break
		}
		out = append(out, infoOf(sn))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTemplate: DELETE /templates/{id}, which the SDK's deleteSnapshot
// calls: a snapshot of the tenant is removed (409 while a sandbox started
// from it exists); anything else is 404 (cagebox's templates are images,
// managed with `cagebox image`).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	name := snapshotName(r.PathValue("id"))
	if err := s.cfg.Manager.Snapshots().Remove(r.Context(), t.ID, name); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("%w: no snapshot %q (templates other than snapshots are cagebox images: `cagebox image`)", errdefs.ErrNotFound, r.PathValue("id"))
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkResult is E2B's SandboxForkResult.
type forkResult struct {
	Sandbox *sandboxResp `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// fork: POST /sandboxes/{id}/fork {"count": N, "timeout": SECONDS}: the
// copies carry the sandbox's template and metadata (its e2b.* labels).
func (s *Server) fork(w http.ResponseWriter, r *http.Request, t *store.Tenant) error {
	var body struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
		return invalid("body: want {\"count\": N, \"timeout\": SECONDS}: %v", err)
	}
	sb, err := s.lookup(r, t)
	if err != nil {
		return err
	}
	req := &api.ForkRequest{Count: 1, Timeout: defaultTimeout.String(), Labels: map[string]string{}}
	if body.Count != nil {
		if *body.Count < 1 || *body.Count > sandbox.MaxForkCount {
			return invalid("count: %d; cagebox forks 1 to %d copies at once", *body.Count, sandbox.MaxForkCount)
		}
		req.Count = *body.Count
	}
	if body.Timeout != nil {
		if *body.Timeout <= 0 || *body.Timeout > maxTimeout {
			return invalid("timeout: %d is not a number of seconds between 1 and %d", *body.Timeout, maxTimeout)
		}
		req.Timeout = (time.Duration(*body.Timeout) * time.Second).String()
	}
	for k, v := range sb.Labels {
		if k == labelTemplate || k == labelRuntime || k == labelPublic || strings.HasPrefix(k, labelMeta) {
			req.Labels[k] = v
		}
	}
	res, err := s.cfg.Manager.Snapshots().Fork(r.Context(), t.ID, sb.ID, req)
	if err != nil {
		return err
	}
	out := make([]forkResult, 0, len(res.Sandboxes))
	for i := range res.Sandboxes {
		sr := s.sandboxResp(&res.Sandboxes[i])
		out = append(out, forkResult{Sandbox: &sr})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
