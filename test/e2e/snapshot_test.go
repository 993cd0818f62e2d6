package e2e

import (
	"context"
	"strings"
	"testing"
)

// TestSnapshotAndFork drives snapshots and forks through the real CLI on
// the e2e runtime: a sandbox with an inline secret writes files; `cagebox
// snapshot create` saves it; `cagebox create --from-snapshot` and `cagebox
// fork --count 2` start sandboxes that see its files, each with a fresh
// placeholder of its own that the gateway swaps for the real value at the
// bound host; the snapshot is listed in use and its removal refused until
// those sandboxes are gone; a fork's snapshot goes with its last copy.
func TestSnapshotAndFork(t *testing.T) {
	e := newDebianEnv(t) // curl
	up := newUpstream(t, "api.example.test")
	e.startDaemon(up.daemonArgs("api.example.test")...)
	const real = "ghp_SnapshotRealValueNeverInTheGuest0001"
	tokEnv := []string{"GITHUB_TOKEN=" + real}
	r := e.cliEnv(tokEnv, "", "create", "--allow", "api.example.test", "--secret", "GITHUB_TOKEN@api.example.test")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	parent := strings.TrimSpace(r.stdout)
	sh := func(id, script string) result {
		t.Helper()
		return e.cli("", "exec", id, "--", "sh", "-c", script)
	}
	if r := sh(parent, "mkdir -p /work && echo prepared > /work/state && rm /etc/machine-id"); r.code != 0 {
		t.Fatalf("prepare: %+v", r)
	}
	placeholders := map[string]bool{sh(parent, `printf %s "$GITHUB_TOKEN"`).stdout: true}

	if r := e.cli("", "snapshot", "create", parent, "--name", "prepared"); r.code != 0 || strings.TrimSpace(r.stdout) != "prepared" {
		t.Fatalf("snapshot create: %+v", r)
	}
	// The parent runs on.
	if r := sh(parent, "cat /work/state"); r.stdout != "prepared\n" {
		t.Fatalf("the parent after its snapshot: %+v", r)
	}
	r = e.cli("", "create", "--from-snapshot", "prepared")
	if r.code != 0 {
		t.Fatalf("create --from-snapshot: %+v", r)
	}
	started := strings.TrimSpace(r.stdout)
	r = e.cli("", "fork", parent, "--count", "2")
	forks := strings.Fields(r.stdout)
	if r.code != 0 || len(forks) != 2 {
		t.Fatalf("fork --count 2: %+v", r)
	}
	for _, id := range append([]string{started}, forks...) {
		if r := sh(id, "cat /work/state; test -e /etc/machine-id || echo gone"); r.stdout != "prepared\ngone\n" {
			t.Errorf("%s started from the snapshot: %+v; want its files", id, r)
		}
		ph := sh(id, `printf %s "$GITHUB_TOKEN"`).stdout
		if ph == "" || ph == real || placeholders[ph] {
			t.Errorf("%s's GITHUB_TOKEN = %q: want a placeholder of its own (not the real value, not another sandbox's)", id, ph)
		}
		placeholders[ph] = true
		if r := sh(id, `curl -sS -H "Authorization: token $GITHUB_TOKEN" https://api.example.test/`+id); r.code != 0 || !strings.Contains(r.stdout, "hello from upstream") {
			t.Errorf("%s's request to the bound host: %+v", id, r)
		}
	}
	for _, id := range append([]string{started}, forks...) {
		got := false
		for _, req := range up.requests() {
			if strings.Contains(req, "/"+id) {
				got = strings.Contains(req, "auth=token "+real)
			}
		}
		if !got {
			t.Errorf("the bound host did not get the real value from %s: %q", id, up.requests())
		}
	}
	ctx := context.Background()
	sn, err := e.client().Snapshot(ctx, "prepared")
	if err != nil || sn.InUse != 1 || sn.Digest == "" || sn.SizeBytes <= 0 {
		t.Fatalf("snapshot prepared: %+v %v; want in use by 1, with digest and size", sn, err)
	}
	if r := e.cli("", "snapshot", "rm", "prepared"); r.code == 0 || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("snapshot rm while in use: %+v; want a refusal", r)
	}
	if r := e.cli("", "snapshot", "ls"); r.code != 0 || !strings.Contains(r.stdout, "prepared") || !strings.Contains(r.stdout, "(fork)") {
		t.Fatalf("snapshot ls: %+v; want prepared and the fork's", r)
	}
	for _, id := range append([]string{started}, forks...) {
		if r := e.cli("", "rm", id); r.code != 0 {
			t.Fatalf("rm %s: %+v", id, r)
		}
	}
	if r := e.cli("", "snapshot", "rm", "prepared"); r.code != 0 {
		t.Fatalf("snapshot rm once unused: %+v", r)
	}
	l, err := e.client().Snapshots(ctx)
	if err != nil || len(l) != 0 {
		t.Fatalf("snapshots after removing them and the fork's copies: %+v %v; want none", l, err)
	}
}
