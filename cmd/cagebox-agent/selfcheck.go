package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cagebox/cagebox/agentproto"
)

// selfCheckTimeout bounds the agent's check of its children at start.
const selfCheckTimeout = 20 * time.Second

// selfProbeArgv runs the agent binary itself in probe mode: /proc/self/exe
// is the running binary even when its path is gone (a VM's initramfs) or
// not on PATH.
var selfProbeArgv = []string{"/proc/self/exe", probeArg}

// checkChildren starts a probe process exactly the way exec does — a
// Server with the agent's reaper and launcher, through the real protocol
// over an in-process connection, as root — and reads the confinement the
// probe reports. It returns an error naming what the probe holds unless it
// holds no capability in any set and has no_new_privs set. The probe runs
// with the default environment, not the sandbox's: nothing from the
// sandbox's configuration (LD_PRELOAD, say) can make it lie.
func checkChildren(ctx context.Context, tmpl *agentproto.Server, argv []string) error {
	ctx, cancel := context.WithTimeout(ctx, selfCheckTimeout)
	defer cancel()
	srv := &agentproto.Server{
		// The connection is an in-process pipe nothing else can reach.
		Token:        "self-check",
		BaseEnv:      agentproto.DefaultEnv,
		Logger:       tmpl.Logger,
		Reaper:       tmpl.Reaper,
		StartProcess: tmpl.StartProcess,
	}
	if srv.Logger == nil {
		srv.Logger = slog.Default()
	}
	hostEnd, agentEnd := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.ServeConn(agentEnd)
	}()
	defer func() {
		hostEnd.Close()
		<-served
	}()
	cl, err := agentproto.NewClient(ctx, hostEnd, srv.Token)
	if err != nil {
		return fmt.Errorf("check processes' capabilities: %w", err)
	}
	defer cl.Close()
	var out, errOut bytes.Buffer
	res, err := cl.Exec(ctx, &agentproto.ExecRequest{Argv: argv}, nil, &out, &errOut)
	if err != nil {
		return fmt.Errorf("check processes' capabilities: run probe: %w", err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("check processes' capabilities: probe %s exited %d: %s%s", argv[0], res.ExitCode, res.Error, strings.TrimSpace(errOut.String()))
	}
	c, err := parseConfinement(out.String())
	if err != nil {
		return fmt.Errorf("check processes' capabilities: %w", err)
	}
	return c.unconfined()
}

// parseConfinement reads what the probe printed (confinement.format).
func parseConfinement(s string) (*confinement, error) {
	var c confinement
	caps := map[string]*uint64{"CapInh": &c.Inh, "CapPrm": &c.Prm, "CapEff": &c.Eff, "CapBnd": &c.Bnd, "CapAmb": &c.Amb}
	ints := map[string]*int{"NoNewPrivs": &c.NoNewPrivs, "Seccomp": &c.Seccomp}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		k, v, ok := strings.Cut(line, ":\t")
		if !ok || seen[k] {
			return nil, fmt.Errorf("probe printed %q: want KEY:\\tVALUE, each key once", line)
		}
		seen[k] = true
		var err error
		if p := caps[k]; p != nil {
			*p, err = strconv.ParseUint(v, 16, 64)
		} else if p := ints[k]; p != nil {
			*p, err = strconv.Atoi(v)
		} else {
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			return nil, fmt.Errorf("probe printed %q: %v", line, err)
		}
	}
	if len(seen) != len(caps)+len(ints) {
		return nil, fmt.Errorf("probe printed %d of the %d fields: %q", len(seen), len(caps)+len(ints), s)
	}
	return &c, nil
}

// unconfined is nil for a process with no capability in any set and
// no_new_privs set, else an error naming what it holds (sets holding the
// same capabilities are named together).
func (c *confinement) unconfined() error {
	type group struct {
		sets []string
		mask uint64
	}
	var groups []group
	for _, f := range []struct {
		name string
		mask uint64
	}{{"CapInh", c.Inh}, {"CapPrm", c.Prm}, {"CapEff", c.Eff}, {"CapBnd", c.Bnd}, {"CapAmb", c.Amb}} {
		if f.mask == 0 {
			continue
		}
		i := slices.IndexFunc(groups, func(g group) bool { return g.mask == f.mask })
		if i < 0 {
			i = len(groups)
			groups = append(groups, group{mask: f.mask})
		}
		groups[i].sets = append(groups[i].sets, f.name)
	}
	var held []string
	for _, g := range groups {
		held = append(held, fmt.Sprintf("%s=%016x (%s)", strings.Join(g.sets, "="), g.mask, capNames(g.mask)))
	}
	if c.NoNewPrivs != 1 {
		held = append(held, "NoNewPrivs="+strconv.Itoa(c.NoNewPrivs))
	}
	if len(held) == 0 {
		return nil
	}
	return fmt.Errorf("processes the agent starts would hold %s", strings.Join(held, "; "))
}

// capabilityNames are the kernel's capability numbers (linux/capability.h,
// a stable ABI); golang.org/x/sys has the constants but no names.
var capabilityNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// capNames lists the capabilities in mask by name.
func capNames(mask uint64) string {
	var names []string
	for i := 0; i < 64; i++ {
		if mask&(1<<i) == 0 {
			continue
		}
		if i < len(capabilityNames) {
			names = append(names, capabilityNames[i])
		} else {
			names = append(names, "capability "+strconv.Itoa(i))
		}
	}
	return strings.Join(names, ", ")
}
