// Command cagebox-agent is the PID 1 of every cagebox sandbox guest. It
// serves the host's agentproto connections (exec, files, health) over a unix
// socket, an inherited file descriptor or a character device, reaps orphaned
// processes, and forwards SIGTERM/SIGINT to the processes it started before
// exiting.
//
// It must stay small and static (CGO_ENABLED=0): a test guards that it links
// nothing but the standard library, golang.org/x/sys, yamux and agentproto.
//
// Usage:
//
//	cagebox-agent --listen unix:/run/cagebox/agent.sock --token-file /run/cagebox/token
//
// Every flag can also be given in the environment (CAGEBOX_AGENT_LISTEN,
// CAGEBOX_AGENT_TOKEN_FILE, CAGEBOX_AGENT_ENV_FILE, CAGEBOX_AGENT_GRACE,
// CAGEBOX_AGENT_LOG_LEVEL); processes started by the agent never see the
// agent's own environment.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cagebox/cagebox/agentproto"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == probeArg {
		os.Exit(probeConfinement(os.Stdout, os.Stderr))
	}
	switch {
	case isVMInit():
		os.Exit(vmInit())
	case len(os.Args) > 1 && os.Args[1] == vmAgentArg:
		os.Exit(vmAgentStage(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:], os.Stderr))
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("cagebox-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", envOr("CAGEBOX_AGENT_LISTEN", ""), "where to serve: unix:PATH, fd:N, dev:PATH or vsock:PORT")
	tokenFile := fs.String("token-file", envOr("CAGEBOX_AGENT_TOKEN_FILE", ""), "file holding the connection token; removed once read")
	envFile := fs.String("env-file", envOr("CAGEBOX_AGENT_ENV_FILE", ""), "base environment for processes, KEY=VALUE lines (default: PATH, HOME=/root, LANG=C.UTF-8)")
	graceStr := fs.String("grace", envOr("CAGEBOX_AGENT_GRACE", "10s"), "on SIGTERM, how long processes get to exit before they are killed")
	awaitClaim := fs.Bool("await-claim", envOr("CAGEBOX_AGENT_AWAIT_CLAIM", "") == "1", "run nothing until the host claims the agent for a sandbox (pools, VM templates); capabilities are dropped at the claim")
	claimKeepsCaps := fs.Bool("claim-keeps-caps", false, "with --await-claim: keep capabilities until the claim, as a VM guest's agent does to apply its network, entropy and clock")
	auditFD := fs.Int("audit-fd", -1, "VM guests: the audit netlink socket the init set up, whose records the agent streams to the host")
	logLevel := fs.String("log-level", envOr("CAGEBOX_AGENT_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "cagebox-agent: bad --log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	grace, err := time.ParseDuration(*graceStr)
	if err != nil || grace < 0 {
		log.Error("bad --grace", "value", *graceStr)
		return 2
	}
	if *listen == "" || *tokenFile == "" {
		log.Error("--listen and --token-file are required")
		return 2
	}
	l, err := parseListen(*listen)
	if err != nil {
		log.Error("bad --listen", "err", err)
		return 2
	}

	// Read the token before dropping capabilities: removing the file may
	// need them.
	token, err := readToken(*tokenFile, log)
	if err != nil {
		log.Error("read token", "err", err)
		return 1
	}
	env := agentproto.DefaultEnv
	if *envFile != "" {
		fileEnv, err := readEnvFile(*envFile)
		if err != nil {
			log.Error("read env file", "err", err)
			return 1
		}
		// The file's entries override the defaults; PATH etc. stay set
		// unless the file sets them.
		env = agentproto.MergeEnv(agentproto.DefaultEnv, fileEnv)
	}

	// Capabilities are dropped on all threads where the build allows it
	// (static), and always on the thread that starts processes. Whether
	// that worked is not taken on trust: a probe process started the way
	// exec starts them must hold nothing, or the agent runs nothing.
	var dropErr, launchErr error
	prewarmThreads(spareThreads)
	// A VM guest's agent that awaits its claim keeps its capabilities
	// until then: it applies the claim's network, entropy and clock with
	// them. It runs nothing before the claim. A container's needs none
	// (the host owns its network and kernel) and drops them now, as at an
	// ordinary start, so its claim only writes files.
	//
	// The launcher's thread, which starts every process, is confined now
	// and checked below like any agent's; where the drop waits for the
	// claim it keeps CAP_SETPCAP (with an empty bounding set, no
	// inheritable or ambient capabilities and NOROOT locked, what it
	// starts gets no capability from it): the claim's drop on all threads
	// (AllThreadsSyscall) needs every thread, the launcher's too, to
	// succeed at each step alike, or the Go runtime takes the process for
	// corrupted and aborts. The claim then takes CAP_SETPCAP from the
	// launcher with the rest, and what its children get is what the check
	// saw. (A VM template is saved with the check done, so a restore's
	// claim does not pay for it.)
	deferDrop := *awaitClaim && (claimPlatform != nil || *claimKeepsCaps)
	var launcherExtra uint64
	if deferDrop {
		launcherExtra = capSetPCap
	}
	if !faultKeepCaps && !deferDrop {
		dropErr = dropCapabilities()
	}
	if !faultKeepCaps && deferDrop {
		// All but the last step now, so the claim's is short.
		dropErr = predropCapabilities()
	}
	launch, launchErr := newLauncher(!faultKeepCaps, launcherExtra)
	reaper, err := startReaper(log)
	if err != nil {
		log.Warn("no reaper; orphans will not be reaped", "err", err)
	}
	srv := &agentproto.Server{Token: token, BaseEnv: env, Logger: log, Reaper: reaper, StartProcess: launch.startProcess, AwaitClaim: *awaitClaim}
	if *auditFD >= 0 {
		srv.AuditSource = startAuditReader(*auditFD, log)
	}
	if err := checkChildren(context.Background(), srv, selfProbeArgv); err != nil {
		if launchErr != nil {
			err = fmt.Errorf("%w (dropping them failed: %v)", err, launchErr)
		}
		srv.Refused = err.Error()
		log.Error("refusing to run processes", "err", err)
	} else if dropErr != nil {
		// In a cgo build AllThreadsSyscall is unavailable (ENOTSUP).
		log.Warn("the agent's own threads keep capabilities (a static build, CGO_ENABLED=0, drops them); the processes it starts hold none", "err", dropErr)
	} else {
		log.Debug("processes start with no capabilities")
	}
	if *awaitClaim && srv.Refused == "" {
		srv.OnClaim = func(cl *agentproto.Claim) error {
			if claimPlatform != nil {
				if err := claimPlatform(cl); err != nil {
					return err
				}
			}
			if err := applyClaimFiles("/", cl); err != nil {
				return err
			}
			if !deferDrop {
				log.Info("claimed", "claim", cl.String())
				return nil
			}
			if !faultKeepCaps {
				if err := dropCapabilities(); err != nil {
					log.Warn("the agent's own threads keep capabilities (a static build, CGO_ENABLED=0, drops them); the processes it starts hold none", "err", err)
				}
			}
			log.Info("claimed", "claim", cl.String())
			return nil
		}
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sigs := make(chan os.Signal, 4)
	// Handle (rather than ignore) the signals that would otherwise end the
	// agent: an ignored signal stays ignored in the processes it starts.
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	serveErr := make(chan error, 1)
	go func() { serveErr <- l.serve(ctx, srv, log) }()
	log.Info("agent started", "version", agentproto.Version, "pid", os.Getpid(), "listen", *listen)

	for {
		select {
		case err := <-serveErr:
			if err != nil {
				log.Error("serve", "err", err)
				return 1
			}
			// A one-shot connection ended; PID 1 must stay up until told
			// to stop.
			serveErr = nil
		case sig := <-sigs:
			s := sig.(syscall.Signal)
			if s != syscall.SIGTERM && s != syscall.SIGINT {
				log.Debug("ignoring signal", "signal", s)
				continue
			}
			log.Info("shutting down", "signal", s, "procs", srv.Procs(), "grace", grace)
			stop()
			gctx, cancel := context.WithTimeout(context.Background(), grace)
			err := srv.Shutdown(gctx, s)
			cancel()
			if err != nil {
				log.Warn("processes killed after grace period", "grace", grace)
			}
			return 0
		}
	}
}

// readToken reads the token and removes the file so that processes in the
// guest cannot read it later. The token is never logged.
func readToken(path string, log *slog.Logger) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if err := os.Remove(path); err != nil {
		log.Warn("could not remove token file", "path", path, "err", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return token, nil
}

// readEnvFile reads KEY=VALUE lines; blank lines and # comments are skipped.
func readEnvFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := []string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		// Values are kept byte for byte (no trimming): the host wrote them.
		line := sc.Text()
		if strings.TrimSpace(line) == "" || line[0] == '#' {
			continue
		}
		if k, _, ok := strings.Cut(line, "="); !ok || k == "" {
			return nil, fmt.Errorf("%s:%d: want KEY=VALUE", path, n)
		}
		env = append(env, line)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return env, nil
}
