package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/mounts"
	"github.com/cagebox/cagebox/internal/policy"
	"github.com/cagebox/cagebox/internal/statedir"
)

func (g *globals) client() *client.Client {
	if g.tcp != nil {
		return g.tcp
	}
	return client.Unix(client.SocketPath(g.home))
}

// ensureDaemon starts a daemon in the background when none answers on the
// unix socket, and says so on stderr.
func (g *globals) ensureDaemon(ctx context.Context) (*client.Client, error) {
	c := g.client()
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c.Health(hctx)
	cancel()
	if err == nil || g.host != "" {
		return c, err
	}
	self, err := daemonExecutable()
	if err != nil {
		return nil, err
	}
	if err := statedir.Make(g.home); err != nil {
		return nil, fmt.Errorf("create %s: %w", g.home, err)
	}
	logPath := filepath.Join(g.home, "daemon.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open daemon log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(self, "daemon", "--home", g.home)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	fmt.Fprintf(os.Stderr, "cagebox: no daemon was running; started one (pid %d, log %s)\n", cmd.Process.Pid, logPath)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("the daemon exited at once (%v); see %s", err, logPath)
		case <-time.After(50 * time.Millisecond):
		}
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Health(hctx)
		cancel()
		if err == nil {
			return c, nil
		}
	}
	return nil, fmt.Errorf("the daemon did not answer within 20s; see %s", logPath)
}

type createFlags struct {
	runtime, image, memory, timeout, idle, disk string
	idleAction                                  string
	cpus                                        float64
	pids                                        int64
	env                                         []string
	allow                                       []string
	policyFile                                  string
	policyRef                                   string
	secrets, secretBody, secretEnv, secretSigV4 []string
	secretHMAC                                  []string
	secretHeader, secretQuery                   []string
	mounts                                      []string
	readOnlyRoot                                bool
	fromSnapshot                                string
	publish                                     []string
	audit                                       []string
	labels                                      []string
}

func (f *createFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.runtime, "runtime", "", "runtime name, or auto for the strongest available that meets the floor (default: the daemon's --default-runtime; cagebox runtimes)")
	cmd.Flags().StringVar(&f.image, "image", "default", "guest image (cagebox image ls); NAME@sha256:DIGEST runs it only if it is that exact image (its manifest digest from pull or import, or its tree digest)")
	cmd.Flags().StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M or 2G (default 512M)")
	cmd.Flags().Float64Var(&f.cpus, "cpus", 0, "CPU limit in cores, e.g. 0.5 or 2 (default 1)")
	cmd.Flags().Int64Var(&f.pids, "pids", 0, "process limit (default 512)")
	cmd.Flags().StringVar(&f.disk, "disk", "", "size of the writable layer, e.g. 1G (default 1G)")
	cmd.Flags().StringVar(&f.timeout, "timeout", "", "maximum lifetime, e.g. 10m; the daemon destroys the sandbox after it")
	cmd.Flags().StringVar(&f.idle, "idle-timeout", "", "after this long without activity, take the --idle-action, e.g. 5m")
	cmd.Flags().StringVar(&f.idleAction, "idle-action", "", "what --idle-timeout does: destroy (default), pause (frozen in memory) or hibernate (microVMs: saved to disk, memory freed); the next exec or file operation resumes a paused or hibernated one")
	cmd.Flags().StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	cmd.Flags().StringArrayVar(&f.labels, "label", nil, "tag the sandbox KEY=VALUE; `cagebox ls --label KEY=VALUE` finds it (repeatable, at most 16)")
	cmd.Flags().StringArrayVar(&f.publish, "publish", nil, "publish this guest port through the daemon's ingress: PORT or PORT:public (no token); the access token is printed once on stderr (repeatable)")
	cmd.Flags().StringArrayVar(&f.allow, "allow", nil, "allow HTTP(S) to this host, e.g. api.github.com or *.example.com (repeatable; default: nothing is reachable)")
	cmd.Flags().StringSliceVar(&f.audit, "audit", nil, "stream the guest's system calls of these classes as syscall.* events: exec, net, file, priv (or all), e.g. --audit exec,net (default: off; `cagebox events`)")
	cmd.Flags().StringVar(&f.policyFile, "policy", "", "egress policy document, YAML or JSON (see docs/policy.md)")
	cmd.Flags().StringVar(&f.policyRef, "policy-ref", "", "follow the tenant's named policy NAME (cagebox policy create); its edits apply to the sandbox")
	cmd.Flags().StringArrayVar(&f.secrets, "secret", nil, "credential binding: NAME@HOST[,HOST] takes the value from this CLI's environment variable NAME (never argv); NAME=vault:KEY[@HOST,...] uses a stored secret. The guest's $NAME holds a placeholder (repeatable)")
	cmd.Flags().StringArrayVar(&f.secretBody, "secret-in-body", nil, "also swap NAME's placeholder in request bodies (repeatable)")
	cmd.Flags().StringArrayVar(&f.secretHeader, "secret-header", nil, "NAME:HEADER: also swap NAME's placeholder in request header HEADER, e.g. API_KEY:X-Api-Key (Authorization and the secret's --inject header always; repeatable)")
	cmd.Flags().StringArrayVar(&f.secretQuery, "secret-query", nil, "NAME:PARAM: also swap NAME's placeholder in query parameter PARAM, e.g. TOKEN:access_token (repeatable)")
	cmd.Flags().StringArrayVar(&f.secretSigV4, "secret-sigv4", nil, "NAME's value is ACCESS_KEY_ID:SECRET_ACCESS_KEY: the guest gets placeholder AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the gateway re-signs its SigV4 requests with the real key (repeatable)")
	cmd.Flags().StringArrayVar(&f.secretHMAC, "secret-hmac", nil, "NAME:header=H,sign=PART+PART...[,algorithm=sha256|sha1|sha512][,encoding=hex|base64|base64url][,prefix=P][,max-body=BYTES]: NAME is an HMAC signing key; the guest signs with a placeholder key and the gateway re-signs with the real one. PARTs: method, path, query, header:NAME, body (repeatable)")
	cmd.Flags().StringArrayVar(&f.secretEnv, "secret-env", nil, "deliver NAME's REAL value into the guest's environment (weaker: for protocols the gateway cannot see; repeatable)")
	cmd.Flags().StringArrayVar(&f.mounts, "mount", nil, "mount a host path below the daemon's --mount-root (type=bind,src=HOST_PATH,dst=/code) or a volume (type=volume,src=NAME,dst=/data); read-only unless ,rw; noexec unless ,exec; always nosuid,nodev (repeatable)")
	cmd.Flags().BoolVar(&f.readOnlyRoot, "read-only-root", false, "make the image root read-only: only --mount volumes/paths given rw and a size-bounded /tmp (--disk) are writable")
	cmd.Flags().StringVar(&f.fromSnapshot, "from-snapshot", "", "start from one of your snapshots (cagebox snapshot ls): its runtime, image, limits, env, policy and secrets unless given here")
}

// secretBindings parses --secret values.
func (f *createFlags) secretBindings() ([]api.SecretBinding, error) {
	body := map[string]bool{}
	for _, n := range f.secretBody {
		body[n] = true
	}
	env := map[string]bool{}
	for _, n := range f.secretEnv {
		env[n] = true
	}
	sigv4 := map[string]bool{}
	for _, n := range f.secretSigV4 {
		sigv4[n] = true
	}
	hmacs := map[string]*api.HMACSigning{}
	for _, v := range f.secretHMAC {
		name, cfg, err := parseHMACFlag(v)
		if err != nil {
			return nil, err
		}
		hmacs[name] = cfg
	}
	places := func(flag string, vals []string) (map[string][]string, error) {
		m := map[string][]string{}
		for _, v := range vals {
			name, place, ok := strings.Cut(v, ":")
			if !ok || name == "" || place == "" {
				return nil, fmt.Errorf("%s %q: want NAME:%s", flag, v, map[string]string{"--secret-header": "HEADER (e.g. API_KEY:X-Api-Key)", "--secret-query": "PARAM (e.g. TOKEN:access_token)"}[flag])
			}
			m[name] = append(m[name], place)
		}
		return m, nil
	}
	headers, err := places("--secret-header", f.secretHeader)
	if err != nil {
		return nil, err
	}
	query, err := places("--secret-query", f.secretQuery)
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	var out []api.SecretBinding
	for _, s := range f.secrets {
		var b api.SecretBinding
		if name, ref, ok := strings.Cut(s, "=vault:"); ok {
			b.Name = name
			key, hosts, _ := strings.Cut(ref, "@")
			b.Secret = key
			if hosts != "" {
				b.Hosts = strings.Split(hosts, ",")
			}
		} else if name, hosts, ok := strings.Cut(s, "@"); ok && hosts != "" {
			b.Name, b.Hosts = name, strings.Split(hosts, ",")
			v, ok := os.LookupEnv(name)
			if !ok || v == "" {
				return nil, fmt.Errorf("--secret %s: the environment variable %s holds the value, and it is not set", s, name)
			}
			b.Value = v
		} else {
			return nil, fmt.Errorf("--secret %q: want NAME@HOST[,HOST] or NAME=vault:KEY", s)
		}
		b.Body = body[b.Name]
		b.Headers, b.Query = headers[b.Name], query[b.Name]
		if env[b.Name] {
			b.Mode = "env"
		}
		if sigv4[b.Name] {
			b.Mode = "sigv4"
		}
		if c := hmacs[b.Name]; c != nil {
			b.Mode, b.HMAC = "hmac", c
		}
		named[b.Name] = true
		out = append(out, b)
	}
	for flag, names := range map[string][]string{"--secret-in-body": f.secretBody, "--secret-env": f.secretEnv, "--secret-sigv4": f.secretSigV4} {
		for _, n := range names {
			if !named[n] {
				return nil, fmt.Errorf("%s %s: no --secret binds %s", flag, n, n)
			}
		}
	}
	for n := range hmacs {
		if !named[n] {
			return nil, fmt.Errorf("--secret-hmac %s: no --secret binds %s", n, n)
		}
	}
	for flag, m := range map[string]map[string][]string{"--secret-header": headers, "--secret-query": query} {
		for n := range m {
			if !named[n] {
				return nil, fmt.Errorf("%s %s: no --secret binds %s", flag, n, n)
			}
		}
	}
	return out, nil
}

// parseHMACFlag parses NAME:key=value,... (see --secret-hmac).
func parseHMACFlag(v string) (string, *api.HMACSigning, error) {
	name, rest, ok := strings.Cut(v, ":")
	if !ok || name == "" || rest == "" {
		return "", nil, fmt.Errorf("--secret-hmac %q: want NAME:header=H,sign=PART+PART (e.g. HOOK:header=X-Signature,prefix=sha256=,sign=method+path+header:X-Timestamp+body)", v)
	}
	c := &api.HMACSigning{}
	for _, kv := range strings.Split(rest, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return "", nil, fmt.Errorf("--secret-hmac %s: %q: want key=value", name, kv)
		}
		switch k {
		case "header":
			c.Header = val
		case "sign":
			c.Sign = strings.Split(val, "+")
		case "algorithm":
			c.Algorithm = val
		case "encoding":
			c.Encoding = val
		case "prefix":
			c.Prefix = val
		case "max-body":
			n, err := parseSize(val)
			if err != nil {
				return "", nil, fmt.Errorf("--secret-hmac %s: max-body: %w", name, err)
			}
			c.MaxBody = n
		default:
			return "", nil, fmt.Errorf("--secret-hmac %s: unknown key %q (header, sign, algorithm, encoding, prefix, max-body)", name, k)
		}
	}
	if c.Header == "" || len(c.Sign) == 0 {
		return "", nil, fmt.Errorf("--secret-hmac %s: header= and sign= are required", name)
	}
	return name, c, nil
}

func (f *createFlags) request() (*api.CreateSandboxRequest, error) {
	req := &api.CreateSandboxRequest{Runtime: f.runtime, Image: f.image, CPUs: f.cpus, PIDs: f.pids, Env: f.env}
	pub, err := parsePublish(f.publish)
	if err != nil {
		return nil, err
	}
	req.Publish = pub
	if req.Labels, err = parseLabels("--label", f.labels); err != nil {
		return nil, err
	}
	if f.memory != "" {
		n, err := parseSize(f.memory)
		if err != nil {
			return nil, fmt.Errorf("--memory: %w", err)
		}
		req.MemoryBytes = n
	}
	if f.disk != "" {
		n, err := parseSize(f.disk)
		if err != nil {
			return nil, fmt.Errorf("--disk: %w", err)
		}
		req.DiskBytes = n
	}
	if f.cpus < 0 {
		return nil, fmt.Errorf("--cpus: %v must be positive", f.cpus)
	}
	if f.pids < 0 {
		return nil, fmt.Errorf("--pids: %d must be positive", f.pids)
	}
	for _, d := range []struct{ flag, v string }{{"--timeout", f.timeout}, {"--idle-timeout", f.idle}} {
		if d.v == "" {
			continue
		}
		if v, err := time.ParseDuration(d.v); err != nil || v <= 0 {
			return nil, fmt.Errorf("%s: %q is not a duration such as 30s, 10m or 2h", d.flag, d.v)
		}
	}
	req.Timeout, req.IdleTimeout, req.IdleAction = f.timeout, f.idle, f.idleAction
	req.Allow = f.allow
	req.Audit = f.audit
	req.PolicyRef = f.policyRef
	sec, err := f.secretBindings()
	if err != nil {
		return nil, err
	}
	req.Secrets = sec
	for _, m := range f.mounts {
		sp, err := mounts.Parse(m)
		if err != nil {
			return nil, err
		}
		req.Mounts = append(req.Mounts, api.Mount{Type: sp.Type, Src: sp.Source, Dst: sp.Target, RW: sp.RW, Exec: sp.Exec})
	}
	req.ReadOnlyRoot = f.readOnlyRoot
	if f.fromSnapshot != "" {
		req.FromSnapshot = f.fromSnapshot
		if f.image == "default" {
			req.Image = "" // the snapshot's
		}
	}
	if f.policyFile != "" {
		b, err := os.ReadFile(f.policyFile)
		if err != nil {
			return nil, fmt.Errorf("--policy: %w", err)
		}
		doc, err := policy.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("--policy %s: %w", f.policyFile, err)
		}
		if req.Policy, err = json.Marshal(doc); err != nil {
			return nil, fmt.Errorf("--policy: %w", err)
		}
	}
	for _, kv := range f.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("--env: %q is not KEY=VALUE", kv)
		}
	}
	return req, nil
}

// parseSize parses 512M, 2G, 1.5GiB, 65536 (bytes).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		case 'T':
			mult, t = 1<<40, t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%q is not a size such as 512M or 2G", s)
	}
	return int64(v * float64(mult)), nil
}

// stdinAttached: pipes and files are forwarded; a terminal or /dev/null is not.
func stdinAttached() bool {
	fi, err := os.Stdin.Stat()
	if err != nil {
		return false
	}
	return fi.Mode()&os.ModeCharDevice == 0
}

// runExec runs argv and turns its result into the CLI's exit code.
func runExec(ctx context.Context, c *client.Client, id string, argv []string, env []string, cwd, user, timeout string) error {
	return runExecIn(ctx, c, id, argv, env, cwd, user, timeout, stdinAttached())
}

// runExecIn is runExec with stdin forwarded or not.
func runExecIn(ctx context.Context, c *client.Client, id string, argv []string, env []string, cwd, user, timeout string, stdin bool) error {
	req := &api.ExecRequest{Argv: argv, Env: env, Cwd: cwd, User: user, Timeout: timeout, Stdin: stdin}
	res, err := c.Exec(ctx, id, req, os.Stdin, os.Stdout, os.Stderr)
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: 130, msg: "interrupted"}
		}
		return &exitError{code: 125, msg: err.Error()}
	}
	code := 0
	if res.ExitCode != nil {
		code = *res.ExitCode
	}
	msg := ""
	switch {
	case code == 127 && res.Error != "":
		msg = fmt.Sprintf("%s: command not found in the sandbox (%s)", argv[0], res.Error)
	case res.Error != "":
		msg = res.Error
	case res.OOMKilled:
		msg = "the command was killed for exceeding the sandbox's memory limit (raise --memory)"
	case res.TimedOut:
		msg = "the command timed out and was killed"
	}
	if code == 0 && msg == "" {
		return nil
	}
	return &exitError{code: code, msg: msg}
}

func runCmd(g *globals) *cobra.Command {
	var f createFlags
	var keep bool
	var cwd, user string
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARGS...]",
		Short: "Run a command in a new sandbox and remove it afterwards",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := f.request()
			if err != nil {
				return &exitError{code: 125, msg: err.Error()}
			}
			ctx := cmd.Context()
			c, err := g.ensureDaemon(ctx)
			if err != nil {
				return &exitError{code: 125, msg: err.Error()}
			}
			sb, err := c.Create(ctx, req)
			if err != nil {
				return &exitError{code: 125, msg: err.Error()}
			}
			if !keep {
				defer func() {
					// The exit code is known: the daemon tears the sandbox
					// down off this path (crash-safe; `rm` waits, run not).
					rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					if err := c.RemoveAsync(rctx, sb.ID); err != nil {
						fmt.Fprintf(os.Stderr, "cagebox: remove %s: %v\n", sb.ID, err)
					}
				}()
			} else {
				fmt.Fprintf(os.Stderr, "cagebox: sandbox %s kept\n", sb.ID)
			}
			return runExec(ctx, c, sb.ID, args, nil, cwd, user, "")
		},
	}
	f.add(cmd)
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the sandbox after the command ends")
	cmd.Flags().StringVarP(&cwd, "workdir", "w", "", "working directory in the sandbox")
	cmd.Flags().StringVarP(&user, "user", "u", "", "user in the sandbox (name, uid or uid:gid)")
	return cmd
}

func createCmd(g *globals) *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create and start a sandbox; prints its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request()
			if err != nil {
				return err
			}
			c, err := g.ensureDaemon(cmd.Context())
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Println(sb.ID)
			for i := range sb.Ports {
				printPortAdded(sb.ID, &sb.Ports[i])
			}
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func execCmd(g *globals) *cobra.Command {
	var env []string
	var cwd, user, timeout string
	var interactive, tty bool
	cmd := &cobra.Command{
		Use:   "exec [-it] ID -- CMD [ARGS...]",
		Short: "Run a command in a running sandbox (-it: on a terminal; with no CMD, a shell)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout != "" {
				if d, err := time.ParseDuration(timeout); err != nil || d <= 0 {
					return &exitError{code: 125, msg: fmt.Sprintf("--timeout: %q is not a duration such as 30s", timeout)}
				}
			}
			if tty {
				// No command: the user's login shell in the sandbox.
				return runExecTTY(cmd.Context(), g.client(), args[0], args[1:], env, cwd, user, timeout)
			}
			if len(args) < 2 {
				return &exitError{code: 2, msg: "exec: give the command after the sandbox id: cagebox exec ID -- CMD (or -it ID for a shell)"}
			}
			if interactive {
				return runExecIn(cmd.Context(), g.client(), args[0], args[1:], env, cwd, user, timeout, true)
			}
			return runExec(cmd.Context(), g.client(), args[0], args[1:], env, cwd, user, timeout)
		},
	}
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "forward stdin even when it is a terminal")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run the command on a terminal (raw mode locally; Ctrl-C and window size go to the sandbox); stdin must be a terminal")
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	cmd.Flags().StringVarP(&cwd, "workdir", "w", "", "working directory")
	cmd.Flags().StringVarP(&user, "user", "u", "", "user (name, uid or uid:gid)")
	cmd.Flags().StringVar(&timeout, "timeout", "", "kill the command after this long, e.g. 30s")
	return cmd
}

func lsCmd(g *globals) *cobra.Command {
	var labels []string
	cmd := listCmd("ls", "List sandboxes", cobra.NoArgs, func(ctx context.Context, _ []string) ([]api.Sandbox, error) {
		sel, err := parseLabels("--label", labels)
		if err != nil {
			return nil, err
		}
		if len(sel) > 0 {
			return g.client().ListLabeled(ctx, sel)
		}
		return g.client().List(ctx)
	}, []string{"ID", "TENANT", "RUNTIME", "IMAGE", "STATUS", "CREATED", "EXPIRES"}, func(s api.Sandbox) []string {
		exp := "-"
		if s.ExpiresAt != nil {
			exp = time.Until(*s.ExpiresAt).Round(time.Second).String()
		}
		status := s.Status
		if s.Error != "" {
			status += " (" + s.Error + ")"
		}
		return []string{s.ID, s.Tenant, s.Runtime, s.Image, status, s.CreatedAt.Local().Format(time.DateTime), exp}
	})
	cmd.Flags().StringArrayVar(&labels, "label", nil, "only sandboxes labelled KEY=VALUE (repeatable: all must match)")
	return cmd
}

func inspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID",
		Short: "Show a sandbox as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.client().Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(sb)
		},
	}
}

func simpleCmd(g *globals, use, short string, fn func(context.Context, *client.Client, string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use + " ID [ID...]",
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var errs []error
			for _, id := range args {
				if err := fn(cmd.Context(), g.client(), id); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Println(id)
			}
			return errors.Join(errs...)
		},
	}
}

func stopCmd(g *globals) *cobra.Command {
	return simpleCmd(g, "stop", "Stop a sandbox's processes", func(ctx context.Context, c *client.Client, id string) error {
		_, err := c.Stop(ctx, id)
		return err
	})
}

func rmCmd(g *globals) *cobra.Command {
	return simpleCmd(g, "rm", "Destroy a sandbox and remove it", func(ctx context.Context, c *client.Client, id string) error {
		return c.Remove(ctx, id)
	})
}

func pauseCmd(g *globals) *cobra.Command {
	var toDisk bool
	cmd := simpleCmd(g, "pause", "Freeze a sandbox (in memory; --to-disk: hibernate a microVM, freeing its memory)", func(ctx context.Context, c *client.Client, id string) error {
		if toDisk {
			_, err := c.Hibernate(ctx, id)
			return err
		}
		_, err := c.Pause(ctx, id)
		return err
	})
	cmd.Flags().BoolVar(&toDisk, "to-disk", false, "hibernate: save the whole sandbox to disk and end its VMM (microVMs; resume restores it, also after a daemon restart)")
	return cmd
}

func resumeCmd(g *globals) *cobra.Command {
	return simpleCmd(g, "resume", "Thaw a paused sandbox", func(ctx context.Context, c *client.Client, id string) error {
		_, err := c.Resume(ctx, id)
		return err
	})
}

func runtimesCmd(g *globals) *cobra.Command {
	return listCmd("runtimes", "List isolation runtimes, their class and whether they run here", cobra.NoArgs, func(ctx context.Context, _ []string) ([]api.Runtime, error) {
		c := g.client()
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		_, herr := c.Health(hctx)
		cancel()
		if herr == nil || g.host != "" {
			return c.Runtimes(ctx)
		}
		// No daemon: describe this host directly.
		return localRuntimes(g.home), nil
	}, []string{"NAME", "CLASS", "AVAILABLE", "DETAIL"}, func(r api.Runtime) []string {
		avail := "yes"
		if !r.Available {
			avail = "no"
		}
		if r.Default {
			avail += " (auto)"
		}
		detail := r.Detail
		if r.Reason != "" {
			detail = r.Reason
		}
		return []string{r.Name, r.Class, avail, detail}
	})
}

func imageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage guest images"}
	cmd.AddCommand(imageHostCmds(g)...)
	cmd.AddCommand(imagePullCmd(g), imageImportCmd(g))
	return cmd
}

// imageLimitFlags are the unpack limits of pull and import.
type imageLimitFlags struct {
	maxBytes string
	maxFiles int64
}

func (f *imageLimitFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.maxBytes, "max-bytes", "", "refuse an image whose files add up to more than this, e.g. 2G (default 8G)")
	cmd.Flags().Int64Var(&f.maxFiles, "max-files", 0, "refuse an image with more files, directories and links than this (default 500000)")
}

func (f *imageLimitFlags) values() (maxBytes, maxFiles int64, err error) {
	if f.maxBytes != "" {
		if maxBytes, err = parseSize(f.maxBytes); err != nil {
			return 0, 0, &exitError{code: 2, msg: "--max-bytes: " + err.Error()}
		}
	}
	if f.maxFiles < 0 {
		return 0, 0, &exitError{code: 2, msg: "--max-files must not be negative"}
	}
	return maxBytes, f.maxFiles, nil
}

// printPulled says what was installed: NAME@DIGEST on stdout (what
// --image takes to pin it), details on stderr.
func printPulled(img *api.Image, start time.Time) {
	pin := img.ManifestDigest
	if pin == "" {
		pin = img.Digest
	}
	fmt.Printf("%s@%s\n", img.Name, pin)
	fmt.Fprintf(os.Stderr, "image %s ready in %s (%d MiB, %s; tree %s)\n", img.Name, time.Since(start).Round(time.Millisecond), img.SizeBytes>>20, img.Source, img.Digest)
}

func imagePullCmd(g *globals) *cobra.Command {
	var name string
	var force bool
	var lim imageLimitFlags
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an OCI image (a tag or @sha256: digest; linux/amd64) into the daemon's image cache",
		Long: `Pull an OCI image from a registry (anonymously) into the daemon's image cache.

REF is [REGISTRY/]REPO[:TAG][@sha256:HEX] (docker.io and latest are the
defaults). Every blob is checked against its digest; layers are unpacked so
that nothing leaves the image root (device nodes, fifos and extended
attributes are dropped). Without --name the name is the last part of the
repository and the tag (docker.io/library/alpine:3.20 -> alpine-3.20; the
tag latest is left out). It prints NAME@DIGEST, which --image takes to pin
that exact image.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			maxBytes, maxFiles, err := lim.values()
			if err != nil {
				return err
			}
			c, err := g.ensureDaemon(cmd.Context())
			if err != nil {
				return err
			}
			start := time.Now()
			img, err := c.PullImage(cmd.Context(), &api.PullImageRequest{Ref: args[0], Name: name, Force: force, MaxBytes: maxBytes, MaxFiles: maxFiles})
			if err != nil {
				return err
			}
			printPulled(img, start)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "name in the image cache (default: derived from REF)")
	cmd.Flags().BoolVar(&force, "force", false, "replace an image of that name made from something else")
	lim.add(cmd)
	return cmd
}

func imageImportCmd(g *globals) *cobra.Command {
	var name string
	var force bool
	var lim imageLimitFlags
	cmd := &cobra.Command{
		Use:   "import FILE",
		Short: "Import a `docker save` archive or a tar of an OCI image layout (FILE, or - for stdin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			maxBytes, maxFiles, err := lim.values()
			if err != nil {
				return err
			}
			var in io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			c, err := g.ensureDaemon(cmd.Context())
			if err != nil {
				return err
			}
			start := time.Now()
			img, err := c.ImportImage(cmd.Context(), in, api.ImportImageOptions{Name: name, Force: force, MaxBytes: maxBytes, MaxFiles: maxFiles})
			if err != nil {
				return err
			}
			printPulled(img, start)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "name in the image cache (default: derived from the tag the archive records)")
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing image of that name")
	lim.add(cmd)
	return cmd
}

func eventsCmd(g *globals) *cobra.Command {
	var asJSON, follow bool
	cmd := &cobra.Command{
		Use:   "events [ID]",
		Short: "Show audit events (of one sandbox); --follow streams new ones",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			enc := json.NewEncoder(os.Stdout)
			show := func(e api.Event) error {
				if asJSON {
					return enc.Encode(e)
				}
				data, _ := json.Marshal(e.Data)
				_, err := fmt.Printf("%s %-8s %-22s %s %s\n", e.Time.Local().Format(time.RFC3339), e.Tenant, e.Kind, e.Sandbox, data)
				return err
			}
			if follow {
				return g.client().FollowEvents(cmd.Context(), id, 0, show)
			}
			evs, err := g.client().Events(cmd.Context(), id, 0)
			if err != nil {
				return err
			}
			for _, e := range evs {
				if err := show(e); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming new events")
	return cmd
}

func tenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "Manage tenants and their API keys (admin)"}
	var minIso string
	var untrusted bool
	create := &cobra.Command{
		Use:  "create NAME",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := g.client().CreateTenant(cmd.Context(), &api.CreateTenantRequest{Name: args[0], MinIsolation: minIso, Untrusted: untrusted})
			if err != nil {
				return err
			}
			return printJSON(t)
		},
	}
	create.Flags().StringVar(&minIso, "min-isolation", "", "the tenant's isolation floor: namespaces, app-kernel or hypervisor")
	create.Flags().BoolVar(&untrusted, "untrusted", false, "the tenant runs untrusted code for others (multi-tenant): its floor is hypervisor")
	key := &cobra.Command{
		Use:   "key TENANT",
		Short: "Create an API key (printed once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := g.client().CreateKey(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Println(k.Key)
			return nil
		},
	}
	ls := listCmd("ls", "List tenants with their isolation floors", cobra.NoArgs,
		func(ctx context.Context, _ []string) ([]api.Tenant, error) { return g.client().Tenants(ctx) },
		[]string{"NAME", "FLOOR", "UNTRUSTED", "CREATED"}, func(t api.Tenant) []string {
			return []string{t.Name, t.Floor, fmt.Sprint(t.Untrusted), t.CreatedAt.Local().Format(time.DateTime)}
		})
	cmd.AddCommand(create, key, ls)
	return cmd
}
