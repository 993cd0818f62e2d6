package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// CLI drives an OCI runtime binary (runc, crun, runsc) that keeps its state
// under Root. Its zero Flags are fine for runc and crun; runsc takes its
// configuration (platform, network) as global flags.
type CLI struct {
	Binary string
	Root   string
	// Flags are global flags put before every command, after --root.
	Flags []string
}

// Command returns the command line for one OCI runtime command.
func (c CLI) Command(ctx context.Context, args ...string) *exec.Cmd {
	full := append([]string{"--root", c.Root}, c.Flags...)
	return exec.CommandContext(ctx, c.Binary, append(full, args...)...)
}

// Run runs one command and returns its stdout; the error carries stderr.
func (c CLI) Run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := c.Command(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(c.Binary), args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Status is the runtime's view of container id: "created", "running",
// "paused", "stopped", or "" when it does not exist.
func (c CLI) Status(ctx context.Context, id string) string {
	out, err := c.Run(ctx, "state", id)
	if err != nil {
		return ""
	}
	var st struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(out, &st) != nil {
		return ""
	}
	return st.Status
}

// Stop sends SIGTERM to the container's init (cagebox-agent, which forwards
// it to its processes) and SIGKILL to everything left after grace.
func (c CLI) Stop(ctx context.Context, id string, grace time.Duration) error {
	switch c.Status(ctx, id) {
	case "", "stopped":
		return nil
	case "paused":
		if _, err := c.Run(ctx, "resume", id); err != nil {
			return err
		}
	}
	_, _ = c.Run(ctx, "kill", id, "TERM")
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if st := c.Status(ctx, id); st == "" || st == "stopped" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := c.Run(ctx, "kill", "--all", id, "KILL"); err != nil && c.Status(ctx, id) == "running" {
		return err
	}
	return nil
}

// Delete kills and deletes container id; one that does not exist is not an
// error.
func (c CLI) Delete(ctx context.Context, id string) error {
	_, err := c.Run(ctx, "delete", "--force", id)
	if err != nil && !strings.Contains(err.Error(), "does not exist") && !strings.Contains(err.Error(), "not found") {
		return err
	}
	return nil
}
