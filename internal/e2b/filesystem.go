package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/internal/e2b/envdpb"
	"github.com/cagebox/cagebox/internal/e2b/envdpb/envdpbconnect"
	"github.com/cagebox/cagebox/internal/errdefs"
	"github.com/cagebox/cagebox/internal/sandbox"
)

// maxRead bounds one GET /files (the agent streams; the bound keeps a
// runaway read finite).
const maxRead = 1 << 30

func (s *Server) envdMux() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(envdpbconnect.NewProcessHandler(processService{s}))
	mux.Handle(envdpbconnect.NewFilesystemHandler(fsService{s}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError{Code: http.StatusNotFound,
			Message: fmt.Sprintf("%s %s is not implemented by cagebox's envd front (docs/e2b.md)", r.Method, r.URL.Path)})
	})
	return mux
}

// resolve makes a guest path absolute: relative paths are relative to the
// user's home (root's is /root, others' /home/USER).
func resolve(p, user string) (string, error) {
	if p == "" {
		return "", invalid("path: give a path in the sandbox")
	}
	if strings.ContainsRune(p, 0) {
		return "", invalid("path: %q has a NUL byte", p)
	}
	if !path.IsAbs(p) {
		home := "/root"
		if user != "" && user != "root" {
			home = "/home/" + user
		}
		p = path.Join(home, p)
	}
	return path.Clean(p), nil
}

// fsErr classifies what the agent (or a guest tool) says about a path.
func fsErr(err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, errdefs.ErrNotFound), strings.Contains(msg, "no such file or directory"), strings.Contains(msg, "No such file or directory"):
		return connect.NewError(connect.CodeNotFound, err)
	case strings.Contains(msg, "not a directory"), strings.Contains(msg, "Not a directory"), strings.Contains(msg, "is a directory"), strings.Contains(msg, "Is a directory"):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case strings.Contains(msg, "ermission denied"):
		return connect.NewError(connect.CodePermissionDenied, err)
	}
	return connectErr(err)
}

// httpCode is the HTTP status of an fsErr.
func httpCode(err error) int {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodePermissionDenied:
		return http.StatusUnauthorized
	case connect.CodeFailedPrecondition:
		return http.StatusConflict
	case connect.CodeUnavailable:
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

func writeFsErr(w http.ResponseWriter, err error) {
	code := httpCode(err)
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	writeJSON(w, code, apiError{Code: code, Message: msg})
}

// entry makes envd's EntryInfo of an agent FileInfo in directory dir.
func entry(dir string, f agentproto.FileInfo) *envdpb.EntryInfo {
	t := envdpb.FileType_FILE_TYPE_FILE
	switch {
	case f.IsDir:
		t = envdpb.FileType_FILE_TYPE_DIRECTORY
	case f.Mode&os.ModeSymlink != 0:
		t = envdpb.FileType_FILE_TYPE_SYMLINK
	}
	return &envdpb.EntryInfo{Name: f.Name, Type: t, Path: path.Join(dir, f.Name), Size: f.Size,
		Mode: uint32(f.Mode.Perm()), Permissions: f.Mode.String(), ModifiedTime: timestamppb.New(f.ModTime),
		Owner: "", Group: ""}
}

// fsService implements envd's filesystem service on the agent: listing
// and stat through its directory listing, mkdir/mv/rm as guest commands
// (argv, no shell).
type fsService struct{ s *Server }

var _ envdpbconnect.FilesystemHandler = fsService{}

func (fs fsService) stat(ctx context.Context, p string) (*envdpb.EntryInfo, error) {
	tg := targetOf(ctx)
	if p == "/" {
		return &envdpb.EntryInfo{Name: "/", Type: envdpb.FileType_FILE_TYPE_DIRECTORY, Path: "/", Mode: 0o755, Permissions: "drwxr-xr-x"}, nil
	}
	dir, name := path.Split(p)
	dir = path.Clean(dir)
	l, err := fs.s.cfg.Manager.Guest().ListDir(ctx, tg.tenant, tg.id, dir)
	if err != nil {
		return nil, fsErr(err)
	}
	for _, f := range l {
		if f.Name == name {
			return entry(dir, f), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("path %q does not exist", p))
}

// guest runs a file tool in the sandbox as user; its stderr is the error.
func (fs fsService) guest(ctx context.Context, user string, argv ...string) error {
	tg := targetOf(ctx)
	var stderr bytes.Buffer
	res, err := fs.s.cfg.Manager.Guest().Exec(ctx, tg.tenant, tg.id, &api.ExecRequest{Argv: argv, User: user, Timeout: "5m"}, nil,
		sandbox.ExecOutput{Stdout: io.Discard, Stderr: &limited{w: &stderr, n: 4096}})
	if err != nil {
		return connectErr(err)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = res.Error
		}
		return fsErr(fmt.Errorf("%s: %s", argv[0], msg))
	}
	return nil
}

type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(b []byte) (int, error) {
	if l.n > 0 {
		k := min(len(b), l.n)
		l.n -= k
		_, _ = l.w.Write(b[:k])
	}
	return len(b), nil
}

func (fs fsService) path(ctx context.Context, h http.Header, p string) (string, string, error) {
	user, err := userOf(h)
	if err != nil {
		return "", "", err
	}
	abs, err := resolve(p, user)
	if err != nil {
		return "", "", connectErr(err)
	}
	return abs, user, nil
}

func (fs fsService) Stat(ctx context.Context, req *connect.Request[envdpb.StatRequest]) (*connect.Response[envdpb.StatResponse], error) {
	p, _, err := fs.path(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := fs.stat(ctx, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.StatResponse{Entry: e}), nil
}

func (fs fsService) MakeDir(ctx context.Context, req *connect.Request[envdpb.MakeDirRequest]) (*connect.Response[envdpb.MakeDirResponse], error) {
	p, user, err := fs.path(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if e, err := fs.stat(ctx, p); err == nil {
		if e.Type == envdpb.FileType_FILE_TYPE_DIRECTORY {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %q already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q exists and is not a directory", p))
	}
	if err := fs.guest(ctx, user, "mkdir", "-p", "--", p); err != nil {
		return nil, err
	}
	e, err := fs.stat(ctx, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.MakeDirResponse{Entry: e}), nil
}

func (fs fsService) Move(ctx context.Context, req *connect.Request[envdpb.MoveRequest]) (*connect.Response[envdpb.MoveResponse], error) {
	src, user, err := fs.path(ctx, req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, _, err := fs.path(ctx, req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if _, err := fs.stat(ctx, src); err != nil {
		return nil, err
	}
	if err := fs.guest(ctx, user, "mv", "-f", "-T", "--", src, dst); err != nil {
		return nil, err
	}
	e, err := fs.stat(ctx, dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.MoveResponse{Entry: e}), nil
}

func (fs fsService) Remove(ctx context.Context, req *connect.Request[envdpb.RemoveRequest]) (*connect.Response[envdpb.RemoveResponse], error) {
	p, user, err := fs.path(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if err := fs.guest(ctx, user, "rm", "-rf", "--", p); err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.RemoveResponse{}), nil
}

func (fs fsService) ListDir(ctx context.Context, req *connect.Request[envdpb.ListDirRequest]) (*connect.Response[envdpb.ListDirResponse], error) {
	p, _, err := fs.path(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	if depth > 32 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("depth: at most 32"))
	}
	tg := targetOf(ctx)
	var out []*envdpb.EntryInfo
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		l, err := fs.s.cfg.Manager.Guest().ListDir(ctx, tg.tenant, tg.id, dir)
		if err != nil {
			return fsErr(err)
		}
		for _, f := range l {
			e := entry(dir, f)
			out = append(out, e)
			if f.IsDir && level < depth {
				if err := walk(e.Path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(p, 1); err != nil {
		return nil, err
	}
	return connect.NewResponse(&envdpb.ListDirResponse{Entries: out}), nil
}

// watchEvery is how often WatchDir lists the watched directory: the agent
// has no inotify, so a watch is a poll of its directory listing, diffed.
const watchEvery = 250 * time.Millisecond

// watchState is what a poll saw of an entry.
type watchState struct {
	size  int64
	mod   time.Time
	mode  os.FileMode
	isDir bool
}

// snapshot lists dir (recursively: every directory under it, up to 32
// levels), keyed by the path relative to dir.
func (fs fsService) snapshot(ctx context.Context, dir string, recursive bool) (map[string]watchState, error) {
	tg := targetOf(ctx)
	out := map[string]watchState{}
	var walk func(rel string, level int) error
	walk = func(rel string, level int) error {
		l, err := fs.s.cfg.Manager.Guest().ListDir(ctx, tg.tenant, tg.id, path.Join(dir, rel))
		if err != nil {
			if rel != "" {
				return nil // gone between two listings
			}
			return fsErr(err)
		}
		for _, f := range l {
			name := path.Join(rel, f.Name)
			out[name] = watchState{size: f.Size, mod: f.ModTime, mode: f.Mode, isDir: f.IsDir}
			if recursive && f.IsDir && level < 32 {
				if err := walk(name, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk("", 1)
}

// WatchDir streams changes of a directory as envd's filesystem events,
// found by polling the agent's listing every watchEvery: create, write
// (size or time changed), chmod and remove (a rename is a remove and a
// create). Changes that undo themselves between two polls are not seen.
func (fs fsService) WatchDir(ctx context.Context, req *connect.Request[envdpb.WatchDirRequest], stream *connect.ServerStream[envdpb.WatchDirResponse]) error {
	p, _, err := fs.path(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	if req.Msg.GetIncludeEntry() {
		return connect.NewError(connect.CodeUnimplemented, errors.New("includeEntry is not implemented (envd 0.6.3)"))
	}
	e, err := fs.stat(ctx, p)
	if err != nil {
		return err
	}
	if e.Type != envdpb.FileType_FILE_TYPE_DIRECTORY {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %q is not a directory", p))
	}
	recursive := req.Msg.GetRecursive()
	prev, err := fs.snapshot(ctx, p, recursive)
	if err != nil {
		return err
	}
	if err := stream.Send(&envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Start{Start: &envdpb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	send := func(name string, t envdpb.EventType) error {
		return stream.Send(&envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Filesystem{Filesystem: &envdpb.FilesystemEvent{Name: name, Type: t}}})
	}
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	keep := time.NewTicker(30 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-keep.C:
			if err := stream.Send(&envdpb.WatchDirResponse{Event: &envdpb.WatchDirResponse_Keepalive{Keepalive: &envdpb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			continue
		case <-tick.C:
		}
		cur, err := fs.snapshot(ctx, p, recursive)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		names := make([]string, 0, len(cur)+len(prev))
		for n := range cur {
			names = append(names, n)
		}
		for n := range prev {
			if _, ok := cur[n]; !ok {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			was, had := prev[n]
			now, has := cur[n]
			var err error
			switch {
			case !had:
				err = send(n, envdpb.EventType_EVENT_TYPE_CREATE)
			case !has:
				err = send(n, envdpb.EventType_EVENT_TYPE_REMOVE)
			case !now.isDir && (now.size != was.size || !now.mod.Equal(was.mod)):
				err = send(n, envdpb.EventType_EVENT_TYPE_WRITE)
			case now.mode != was.mode:
				err = send(n, envdpb.EventType_EVENT_TYPE_CHMOD)
			}
			if err != nil {
				return err
			}
		}
		prev = cur
	}
}

func (fs fsService) CreateWatcher(context.Context, *connect.Request[envdpb.CreateWatcherRequest]) (*connect.Response[envdpb.CreateWatcherResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("watchers are not implemented yet by cagebox's envd front"))
}

func (fs fsService) GetWatcherEvents(context.Context, *connect.Request[envdpb.GetWatcherEventsRequest]) (*connect.Response[envdpb.GetWatcherEventsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("watchers are not implemented yet by cagebox's envd front"))
}

func (fs fsService) RemoveWatcher(context.Context, *connect.Request[envdpb.RemoveWatcherRequest]) (*connect.Response[envdpb.RemoveWatcherResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("watchers are not implemented yet by cagebox's envd front"))
}

// lazyBody sends the 200 header with the first byte, so that a read that
// fails before any data still gets its error status.
type lazyBody struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyBody) Write(b []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/octet-stream")
		l.w.WriteHeader(http.StatusOK)
	}
	return l.w.Write(b)
}

// download: GET /files?path=…[&username=…].
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	tg := targetOf(r.Context())
	user := r.URL.Query().Get("username")
	p, err := resolve(r.URL.Query().Get("path"), user)
	if err != nil {
		writeFsErr(w, connectErr(err))
		return
	}
	body := &lazyBody{w: w}
	if err := s.cfg.Manager.Guest().ReadFile(r.Context(), tg.tenant, tg.id, p, body, maxRead); err != nil {
		if body.started {
			s.log.Warn("envd: download cut short", "sandbox", tg.id, "err", err)
			return
		}
		writeFsErr(w, fsErr(err))
		return
	}
	if !body.started {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
	}
}

// uploaded is envd's EntryInfo of an upload.
type uploaded struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload: POST /files?path=…[&username=…], a multipart form (each "file"
// part's file name is its path when no path is given) or the raw bytes
// (application/octet-stream, optionally gzip-encoded).
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	tg := targetOf(r.Context())
	q := r.URL.Query()
	user := q.Get("username")
	write := func(p string, body io.Reader) (uploaded, error) {
		abs, err := resolve(p, user)
		if err != nil {
			return uploaded{}, connectErr(err)
		}
		if err := s.cfg.Manager.Guest().WriteFile(r.Context(), tg.tenant, tg.id, abs, 0o644, body); err != nil {
			return uploaded{}, fsErr(err)
		}
		return uploaded{Path: abs, Name: path.Base(abs), Type: "file"}, nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []uploaded
	switch mt {
	case "application/octet-stream":
		if q.Get("path") == "" {
			writeFsErr(w, connectErr(invalid("path: an octet-stream upload needs ?path=")))
			return
		}
		var body io.Reader = r.Body
		switch r.Header.Get("Content-Encoding") {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				writeFsErr(w, connectErr(invalid("body: not gzip: %v", err)))
				return
			}
			defer zr.Close()
			body = zr
		default:
			writeFsErr(w, connectErr(invalid("Content-Encoding %q: send identity or gzip", r.Header.Get("Content-Encoding"))))
			return
		}
		u, err := write(q.Get("path"), body)
		if err != nil {
			writeFsErr(w, err)
			return
		}
		out = append(out, u)
	case "multipart/form-data":
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeFsErr(w, connectErr(invalid("multipart body: %v", err)))
				return
			}
			if part.FormName() != "file" {
				continue
			}
			// The file name is the whole path (Part.FileName keeps only
			// its last element).
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p := q.Get("path")
			if p == "" {
				p = dp["filename"]
			}
			u, err := write(p, part)
			if err != nil {
				writeFsErr(w, err)
				return
			}
			out = append(out, u)
		}
		if len(out) == 0 {
			writeFsErr(w, connectErr(invalid("multipart body: no \"file\" part")))
			return
		}
	default:
		writeFsErr(w, connectErr(invalid("Content-Type %q: send multipart/form-data or application/octet-stream", mt)))
		return
	}
	writeJSON(w, http.StatusOK, out)
}
