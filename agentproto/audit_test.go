package agentproto

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestAuditAssembler(t *testing.T) {
	a := NewAuditAssembler()
	feed := func(typ uint16, s string) []*AuditRecord { return a.Add(typ, []byte(s)) }
	// An exec, with a hex-encoded argument (it has a space) and a long one
	// in chunks.
	if out := feed(AuditTypeSyscall, `audit(1732490000.100:42): arch=c000003e syscall=59 success=yes exit=0 a0=5610 a1=5620 a2=5630 a3=0 items=2 ppid=1 pid=321 auid=4294967295 uid=0 comm="echo" exe="/bin/echo" key=(null)`); out != nil {
		t.Fatalf("record before EOE: %+v", out)
	}
	feed(AuditTypeExecve, `audit(1732490000.100:42): argc=4 a0="/bin/echo" a1=68692074686572 a2_len=6 a2[0]="abc" a2[1]="def" a3="x"`)
	feed(AuditTypeCwd, `audit(1732490000.100:42): cwd="/root"`)
	feed(AuditTypePath, `audit(1732490000.100:42): item=0 name="/bin/echo" inode=12 nametype=NORMAL`)
	out := feed(AuditTypeEOE, `audit(1732490000.100:42): `)
	if len(out) != 1 {
		t.Fatalf("EOE gave %d records", len(out))
	}
	r := out[0]
	if r.Syscall != 59 || r.PID != 321 || r.PPID != 1 || r.Arch != 0xc000003e || !r.Exited || !r.Success || r.Args[1] != 0x5620 || r.Cwd != "/root" ||
		!reflect.DeepEqual(r.Argv, []string{"/bin/echo", "hi ther", "abcdef", "x"}) || !reflect.DeepEqual(r.Paths, []string{"/bin/echo"}) {
		t.Fatalf("exec record %+v", r)
	}

	// A connect: the socket address in hex.
	feed(AuditTypeSyscall, `audit(1.2:43): arch=c000003e syscall=42 success=no exit=-111 a0=3 a1=7ffd a2=10 a3=0 pid=400`)
	feed(AuditTypeSockaddr, `audit(1.2:43): saddr=020001BB0A000001`)
	out = feed(AuditTypeEOE, `audit(1.2:43):`) // the kernel's EOE: nothing after the colon
	if len(out) != 1 || out[0].Syscall != 42 || out[0].Success || out[0].Exit != -111 || len(out[0].Saddr) != 8 || out[0].Saddr[4] != 10 {
		t.Fatalf("connect %+v", out)
	}

	// Hostile input: no SYSCALL record, garbage, a record of another
	// type, a forged quote, too many events open at once.
	if out := feed(AuditTypePath, `audit(1.2:44): item=0 name="/etc/shadow"`); out != nil {
		t.Fatal(out)
	}
	if out := feed(AuditTypeEOE, `audit(1.2:44): `); len(out) != 0 {
		t.Fatalf("event without SYSCALL: %+v", out)
	}
	for _, bad := range []string{"", "audit(", "audit(x): a=b", "nonsense", "audit(1.2:notanumber): syscall=59"} {
		if out := feed(AuditTypeSyscall, bad); out != nil {
			t.Fatalf("%q: %+v", bad, out)
		}
	}
	if out := feed(1327, `audit(1.2:45): proctitle=6563686F`); out != nil {
		t.Fatal(out)
	}
	var evicted int
	for i := 0; i < 200; i++ {
		evicted += len(feed(AuditTypeSyscall, "audit(1.2:"+strconv.Itoa(1000+i)+"): syscall=2 pid=5 success=yes exit=3 a0=1 a1=0 a2=0 a3=0"))
	}
	if len(a.pending) > auditMaxPending || evicted != 200-auditMaxPending {
		t.Fatalf("pending %d, evicted %d", len(a.pending), evicted)
	}
	// Bounds: 100 arguments, one of 10 KiB.
	feed(AuditTypeSyscall, `audit(1.2:50): syscall=59 success=yes exit=0 pid=9 a0=0 a1=0 a2=0 a3=0`)
	var b strings.Builder
	b.WriteString(`audit(1.2:50): argc=100 a0="` + strings.Repeat("A", 10000) + `"`)
	for i := 1; i < 100; i++ {
		b.WriteString(" a" + strconv.Itoa(i) + `="x"`)
	}
	feed(AuditTypeExecve, b.String())
	out = feed(AuditTypeEOE, `audit(1.2:50): `)
	if len(out) != 1 || len(out[0].Argv) != auditMaxArgs || len(out[0].Argv[0]) > auditMaxArgBytes || !out[0].ArgvTruncated {
		t.Fatalf("bounds: %d args, first %d bytes, truncated %v", len(out[0].Argv), len(out[0].Argv[0]), out[0].ArgvTruncated)
	}
}

func TestAuditOperation(t *testing.T) {
	for _, withSource := range []bool{true, false} {
		srv := &Server{Token: testToken, Logger: testLogger(t)}
		if withSource {
			srv.AuditSource = func(ctx context.Context, emit func(*AuditRecord) error) error {
				for i := 0; i < 3; i++ {
					if err := emit(&AuditRecord{Syscall: 59, PID: 10 + i, Argv: []string{"/bin/true"}}); err != nil {
						return err
					}
				}
				<-ctx.Done()
				return ctx.Err()
			}
		}
		a, b := net.Pipe()
		go srv.ServeConn(b)
		ctx := ctxT(t)
		c, err := NewClient(ctx, a, testToken)
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithCancel(ctx)
		var got []int
		err = c.Audit(actx, func(r *AuditRecord) {
			got = append(got, r.PID)
			if len(got) == 3 {
				cancel()
			}
		})
		cancel()
		if withSource {
			if !errors.Is(err, context.Canceled) || !reflect.DeepEqual(got, []int{10, 11, 12}) {
				t.Fatalf("audit: %v, records %v", err, got)
			}
		} else if !errors.Is(err, ErrInvalid) {
			t.Fatalf("audit without a source: %v, want ErrInvalid", err)
		}
		// The session still works.
		if _, err := c.Health(ctx); err != nil {
			t.Fatalf("health after audit: %v", err)
		}
		c.Close()
	}
}
