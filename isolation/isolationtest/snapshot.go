package isolationtest

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/agentproto"
	"github.com/cagebox/cagebox/isolation"
)

// snapshotScript changes a guest's files in every way a writable layer
// records: new files with their own mode and owner, a symlink, a hard
// link, a file of the image removed (a whiteout), a directory of the image
// replaced (an opaque directory), and a host-written file edited (not
// part of a snapshot: each sandbox gets its own); /tmp is part of the
// writable layer on every runtime.
const snapshotScript = `set -e
mkdir -p /work/d
echo kept > /work/d/f
chmod 0750 /work/d/f
chmod 1777 /work/d
ln -s /work/d/f /work/link
ln /work/d/f /work/hard
rm /etc/machine-id
rm -rf /usr/sbin
mkdir /usr/sbin
echo mine > /usr/sbin/mine
echo parent-edit >> /etc/hosts
echo in-tmp > /tmp/t
`

// snapshot runs for SnapshottingRuntimes whose snapshots are of the
// filesystem: a sandbox's writable layer is snapshotted while it runs (and
// it runs on after), two sandboxes start from the snapshot and see its
// files as they were — content, mode, owner, links, removals — while the
// files the host writes are their own; what one writes is not seen by the
// other; a snapshot whose files were changed afterwards is refused and
// leaves nothing.
func snapshot(t *testing.T, rt isolation.Runtime, o Options) {
	srt, ok := rt.(isolation.SnapshottingRuntime)
	if !ok {
		t.Skipf("%s sandboxes are not snapshotted", rt.Name())
	}
	memory, err := srt.Snapshots()
	if err != nil {
		t.Skipf("%s cannot snapshot here: %v", rt.Name(), err)
	}
	if memory {
		t.Skipf("%s takes memory snapshots (not covered by this case)", rt.Name())
	}
	g := Start(t, rt, o, isolation.Resources{})
	if out, serr, res := g.Exec(t, "sh", "-c", snapshotScript); res.ExitCode != 0 {
		t.Fatalf("prepare files: exit %d: %s %s", res.ExitCode, out, serr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A file of another owner (the guest's processes may lack CAP_CHOWN).
	var out bytes.Buffer
	res, err := g.Client.Exec(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo theirs > /work/d/u && chmod 0640 /work/d/u"}, User: "1000:1000"}, nil, &out, &out)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("write as 1000: %v %+v %s", err, res, out.String())
	}
	if err := g.Client.Sync(ctx); err != nil {
		t.Fatalf("sync: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	info, err := g.Sandbox.(isolation.Snapshotter).Snapshot(ctx, dir)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if info.Memory || !strings.HasPrefix(info.Digest, "sha256:") || info.Bytes <= 0 {
		t.Fatalf("snapshot info %+v: want a filesystem snapshot with a digest and a size", info)
	}
	// The snapshotted sandbox runs on, thawed, and writes.
	if out, _, res := g.Exec(t, "sh", "-c", "echo after > /work/d/after && cat /work/d/f"); res.ExitCode != 0 || out != "kept\n" {
		t.Fatalf("the snapshotted sandbox after its snapshot: %q exit %d", out, res.ExitCode)
	}
	from := func(host string) func(*isolation.Spec) {
		return func(s *isolation.Spec) {
			s.FromSnapshot, s.FromSnapshotDigest, s.Hostname = dir, info.Digest, host
		}
	}
	a := StartSpec(t, rt, o, from("copy-a"))
	b := StartSpec(t, rt, o, from("copy-b"))
	check := func(g *Guest, host string) {
		t.Helper()
		want := map[string]string{
			"cat /work/d/f":                          "kept",
			"stat -c '%a %u %g' /work/d/f":           "750 0 0",
			"stat -c '%a %u %g' /work/d/u":           "640 1000 1000",
			"readlink /work/link":                    "/work/d/f",
			"stat -c %h /work/hard":                  "2",
			"test -e /etc/machine-id || echo gone":   "gone",
			"ls /usr/sbin":                           "mine",
			"test -e /work/d/after || echo absent":   "absent",
			"cat /etc/hostname":                      host,
			"grep -c parent-edit /etc/hosts || true": "0",
			"cat /tmp/t":                             "in-tmp",
		}
		for cmd, w := range want {
			out, serr, _ := g.Exec(t, "sh", "-c", cmd)
			if strings.TrimSpace(out) != w {
				t.Errorf("%s in a sandbox started from the snapshot: %q (%s), want %q", cmd, strings.TrimSpace(out), strings.TrimSpace(serr), w)
			}
		}
	}
	check(a, "copy-a")
	check(b, "copy-b")
	// Copy-on-write: what one writes, the other does not see.
	if _, _, res := a.Exec(t, "sh", "-c", "echo changed > /work/d/f && rm /work/link"); res.ExitCode != 0 {
		t.Fatalf("write in a copy: exit %d", res.ExitCode)
	}
	if out, _, _ := b.Exec(t, "sh", "-c", "cat /work/d/f; readlink /work/link"); out != "kept\n/work/d/f\n" {
		t.Errorf("the other copy saw a copy's writes: %q", out)
	}

	// Tampered with after it was taken: refused, nothing made.
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "mine" {
			err = os.WriteFile(p, []byte("tampered\n"), 0o644)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	spec := &isolation.Spec{ID: "tsnaptamper", RootFS: o.RootFS, AgentPath: o.AgentPath, AgentToken: "0123456789abcdef0123456789abcdef",
		FromSnapshot: dir, FromSnapshotDigest: info.Digest}
	spec.StateDir = filepath.Join(stateRoot(t), spec.ID)
	sb, err := rt.Create(ctx, spec)
	if err == nil {
		_ = sb.Destroy(ctx)
		t.Fatal("a sandbox was made from a snapshot whose files changed after it was taken")
	}
	if !strings.Contains(err.Error(), "changed since it was taken") {
		t.Errorf("refusal of a tampered snapshot: %v; want it to say its files changed", err)
	}
	if _, serr := os.Stat(spec.StateDir); !os.IsNotExist(serr) {
		t.Errorf("a refused start left %s (%v)", spec.StateDir, serr)
	}
}
