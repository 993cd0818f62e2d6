package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/internal/tarx"
)

// remotePath splits "ID:/path" (a sandbox path); ok is false for a local
// path (no colon, or a slash before it, as in ./a:b).
func remotePath(s string) (id, p string, ok bool) {
	id, p, found := strings.Cut(s, ":")
	if !found || id == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return id, p, true
}

func cpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp ID:/path LOCALDIR | cp LOCAL ID:/dir",
		Short: "Copy a directory tree (or a file) out of or into a sandbox, as a tar stream",
		Long: `Copy out of a sandbox: cagebox cp ID:/work ./out writes the contents of /work
under ./out (created if missing). What the sandbox sends is treated as
hostile: nothing is written outside ./out (no absolute names, no .., nothing
through a symlink), device nodes are refused, and size and entry count are
bounded. Nor does it decide modes or owners: ./out and directories already
under it keep their modes; what is created takes only the archive's
permission bits (never setuid, setgid or sticky) masked by your umask, and
is owned by the user running cagebox.

Copy into a sandbox: cagebox cp ./src ID:/work writes the contents of ./src
(or the file ./src) under /work. Symlinks are copied as links; device nodes,
FIFOs and sockets are skipped.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			srcID, srcPath, srcRemote := remotePath(args[0])
			dstID, dstPath, dstRemote := remotePath(args[1])
			switch {
			case srcRemote && dstRemote:
				return &exitError{code: 2, msg: "cp: copy between two sandboxes through a local directory (one side must be local)"}
			case !srcRemote && !dstRemote:
				return &exitError{code: 2, msg: "cp: name the sandbox side as ID:/path"}
			case srcRemote:
				if !strings.HasPrefix(srcPath, "/") {
					return &exitError{code: 2, msg: fmt.Sprintf("cp: %s: give an absolute path in the sandbox (ID:/dir)", args[0])}
				}
				body, err := g.client().ArchiveGet(ctx, srcID, srcPath)
				if err != nil {
					return err
				}
				defer body.Close()
				st, err := tarx.Extract(body, args[1], tarx.DefaultLimits)
				if err != nil {
					return fmt.Errorf("cp: extract into %s (after %d entries): %w", args[1], st.Entries, err)
				}
				return nil
			default:
				if !strings.HasPrefix(dstPath, "/") {
					return &exitError{code: 2, msg: fmt.Sprintf("cp: %s: give an absolute path in the sandbox (ID:/dir)", args[1])}
				}
				if _, err := os.Lstat(args[0]); err != nil {
					return fmt.Errorf("cp: %w", err)
				}
				pr, pw := io.Pipe()
				createErr := make(chan error, 1)
				go func() {
					err := tarx.Create(pw, args[0])
					createErr <- err
					pw.CloseWithError(err)
				}()
				err := g.client().ArchivePut(ctx, dstID, dstPath, pr)
				pr.CloseWithError(io.ErrClosedPipe)
				if cerr := <-createErr; cerr != nil && cerr != io.ErrClosedPipe {
					return fmt.Errorf("cp: read %s: %w", args[0], cerr)
				}
				return err
			}
		},
	}
}
