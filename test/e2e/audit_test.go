package e2e

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cagebox/cagebox/api"
)

// createAudited creates a sandbox through the CLI with extra create flags
// and returns its id.
func (e *env) createCLI(args ...string) string {
	e.t.Helper()
	r := e.cli("", append([]string{"create"}, args...)...)
	if r.code != 0 {
		e.t.Fatalf("create %q: %+v", args, r)
	}
	return strings.TrimSpace(r.stdout)
}

func (e *env) inspect(id string) api.Sandbox {
	e.t.Helper()
	r := e.cli("", "inspect", id)
	var sb api.Sandbox
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sb) != nil {
		e.t.Fatalf("inspect %s: %+v", id, r)
	}
	return sb
}

func (e *env) execOK(id string, argv ...string) string {
	e.t.Helper()
	r := e.cli("", append([]string{"exec", id, "--"}, argv...)...)
	if r.code != 0 {
		e.t.Fatalf("exec %q in %s: %+v", argv, id, r)
	}
	return r.stdout
}

// TestAudit: `cagebox create --audit` streams the guest's execs (argv),
// connects, sensitive opens and refused privileged syscalls as syscall.*
// events (`cagebox events`), on the container, gVisor and qemu runtimes; a
// sandbox without --audit has none; a flood of sensitive opens is rate-limited with
// drops counted (inspect, syscall.dropped) while the daemon keeps
// answering.
func TestAudit(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()

	if r := e.cli("", "create", "--audit", "exec,bogus"); r.code == 0 || !strings.Contains(r.stderr, `unknown audit class "bogus"`) {
		t.Fatalf("create --audit exec,bogus: %+v", r)
	}

	for _, rt := range []string{"container", "gvisor", "qemu"} {
		t.Run(rt, func(t *testing.T) {
			e.t = t
			id := e.createCLI("--runtime", rt, "--audit", "exec,net,file,priv")
			defer e.cli("", "rm", id)
			sb := e.inspect(id)
			if sb.Audit == nil || !reflect.DeepEqual(sb.Audit.Classes, []string{"exec", "net", "file", "priv"}) {
				t.Fatalf("inspect: audit %+v", sb.Audit)
			}
			if out := e.execOK(id, "sh", "-c", "/bin/echo hi"); out != "hi\n" {
				t.Fatalf("echo: %q", out)
			}
			e.waitEvent(id, "syscall.exec of /bin/echo hi", func(ev api.Event) bool {
				return ev.Kind == "syscall.exec" && strings.Contains(string(dataOf(ev)), `"argv":["/bin/echo","hi"]`)
			})
			e.execOK(id, "sh", "-c", "cat /etc/shadow; true")
			e.waitEvent(id, "syscall.open of /etc/shadow", func(ev api.Event) bool {
				return ev.Kind == "syscall.open" && strings.Contains(string(dataOf(ev)), `"path":"/etc/shadow"`)
			})
			if sb.Network != nil {
				e.execOK(id, "sh", "-c", "nc -w 1 "+sb.Network.Gateway+" 443 </dev/null; true")
				e.waitEvent(id, "syscall.connect to the gateway", func(ev api.Event) bool {
					d := string(dataOf(ev))
					return ev.Kind == "syscall.connect" && strings.Contains(d, `"address":"`+sb.Network.Gateway+`"`) && strings.Contains(d, `"port":443`)
				})
			}
			if sb.Audit.Unrecorded == nil {
				r := e.cli("", "exec", id, "--", "mount", "-t", "tmpfs", "none", "/tmp")
				if r.code == 0 {
					t.Fatal("mount succeeded in the guest")
				}
				e.waitEvent(id, "denied syscall.priv mount", func(ev api.Event) bool {
					d := string(dataOf(ev))
					return ev.Kind == "syscall.priv" && strings.Contains(d, `"syscall":"mount"`) && strings.Contains(d, `"result":"denied"`)
				})
			} else {
				t.Logf("%s: unrecorded %v: %s", rt, sb.Audit.Unrecorded, sb.Audit.Note)
			}
			if sb := e.inspect(id); sb.Audit.Recorded == 0 {
				t.Fatalf("inspect shows no records: %+v", sb.Audit)
			}
		})
	}
	e.t = t

	t.Run("off", func(t *testing.T) {
		e.t = t
		defer func() { e.t = t }()
		id := e.createCLI()
		defer e.cli("", "rm", id)
		if sb := e.inspect(id); sb.Audit != nil {
			t.Fatalf("audit shown without --audit: %+v", sb.Audit)
		}
		e.execOK(id, "sh", "-c", "/bin/echo hi; cat /etc/shadow; unshare -r true; true")
		e.waitEvent(id, "sandbox.exec", func(ev api.Event) bool { return ev.Kind == "sandbox.exec" })
		for _, ev := range e.eventsOf(id) {
			if strings.HasPrefix(string(ev.Kind), "syscall.") {
				t.Fatalf("%s event without --audit: %s", ev.Kind, dataOf(ev))
			}
		}
	})

	t.Run("flood", func(t *testing.T) {
		e.t = t
		// 5000 opens of /etc/shadow by one shell process (`true`'s
		// redirection: no fork), not 5000 execs: a loaded machine forks
		// far below the 200/s limit, so an exec flood there is no flood
		// and nothing is dropped; one process's syscalls come faster than
		// the limit whatever the load.
		id := e.createCLI("--audit", "file")
		defer e.cli("", "rm", id)
		done := make(chan result, 1)
		go func() {
			done <- e.cli("", "exec", id, "--", "sh", "-c", `i=0; while [ $i -lt 5000 ]; do true </etc/shadow; i=$((i+1)); done 2>/dev/null; echo flooded`)
		}()
		// The daemon answers meanwhile.
		for i := 0; i < 5; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := e.client().List(ctx)
			cancel()
			if err != nil {
				t.Fatalf("list during the flood: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		r := <-done
		if r.code != 0 || !strings.Contains(r.stdout, "flooded") {
			t.Fatalf("flood: %+v", r)
		}
		// `cagebox events` shows the first thousand; page through them all.
		var ev *api.Event
		deadline := time.Now().Add(30 * time.Second)
		for ev == nil && time.Now().Before(deadline) {
			for _, x := range e.allEvents(id) {
				if x.Kind == api.EventSyscallDropped {
					ev = &x
					break
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		if ev == nil {
			t.Fatal("no syscall.dropped event after the flood")
		}
		var d api.SyscallDropped
		if err := json.Unmarshal(dataOf(*ev), &d); err != nil || d.Count == 0 || d.Rate != 200 || d.Burst != 1000 {
			t.Fatalf("syscall.dropped: %s", dataOf(*ev))
		}
		sb := e.inspect(id)
		if sb.Audit.Dropped == 0 || sb.Audit.Recorded < 1000 || sb.Audit.Recorded+sb.Audit.Dropped < 5000 {
			t.Fatalf("counters after 5000 opens: %+v", sb.Audit)
		}
		t.Logf("flood of 5000 opens: %d recorded, %d dropped", sb.Audit.Recorded, sb.Audit.Dropped)
	})
}

// allEvents pages through every event of a sandbox (the API returns them
// a thousand at a time).
func (e *env) allEvents(id string) []api.Event {
	e.t.Helper()
	var all []api.Event
	var after int64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		page, err := e.client().Events(ctx, id, after)
		cancel()
		if err != nil {
			e.t.Fatalf("events: %v", err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
}
