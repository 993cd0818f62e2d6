package qemu

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/cagebox/cagebox/isolation"
	"github.com/cagebox/cagebox/isolation/internal/runlog"
)

// restoreFiles are what a restore from a template hands QEMU: its RAM
// (a descriptor of the template's sealed memfd) and its device state.
type restoreFiles struct {
	ram, state *os.File
}

func (f *restoreFiles) close() {
	if f.ram != nil {
		f.ram.Close()
	}
	if f.state != nil {
		f.state.Close()
	}
}

// openTemplate opens the template m for a restore (loading its RAM on
// first use).
func (rt *Runtime) openTemplate(m *templateMeta) (_ *restoreFiles, err error) {
	ram, err := rt.templateRAM(m)
	if err != nil {
		return nil, err
	}
	f := &restoreFiles{}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if f.ram, err = dupFile(ram); err != nil {
		return nil, err
	}
	if f.state, err = os.Open(rt.tpl.path(m.Digest, "state")); err != nil {
		return nil, fmt.Errorf("template device state: %w", err)
	}
	return f, nil
}

// planRestore turns a cold boot's plan (p, vc) into a restore from the
// template m (files from openTemplate, which p now owns): the template's
// kernel command line and NIC address (the claim gives the guest the
// sandbox's), guest RAM mapped privately from the template's sealed
// memfd, and QEMU waiting for the template's device state on an
// inherited descriptor.
func (rt *Runtime) planRestore(s *Sandbox, p *pending, vc *vmConfig, m *templateMeta, f *restoreFiles) {
	vc.RAMFD = 3 + len(p.files)
	p.files = append(p.files, f.ram)
	stateFD := 3 + len(p.files)
	p.files = append(p.files, f.state)
	f.ram, f.state = nil, nil
	vc.Append, vc.Incoming = m.Cmdline, true
	s.sd.Restored = &restoredState{Template: m.Digest}
	if vc.Net {
		s.sd.Restored.MAC, vc.MAC = vc.MAC, m.TemplateMAC
	}
	p.restore = &restorePlan{template: m.Digest, stateFD: stateFD, ignoreShared: true}
}

// restore loads the template's device state into the QEMU that Start
// started (waiting with -incoming defer) and resumes the guest: it stands
// where the template stopped, its agent waiting for its claim.
func (s *Sandbox) restore(ctx context.Context, r *restorePlan, exited <-chan struct{}) error {
	t0 := time.Now()
	if r.ignoreShared {
		if err := s.qmp(ctx, "migrate-set-capabilities", ignoreShared, nil); err != nil {
			return fmt.Errorf("qemu: restore: %w", err)
		}
	}
	if err := s.qmp(ctx, "migrate-incoming", map[string]any{"uri": "fd:" + strconv.Itoa(r.stateFD)}, nil); err != nil {
		return fmt.Errorf("qemu: restore: %w", err)
	}
	for {
		var st qmpStatus
		err := s.qmp(ctx, "query-status", nil, &st)
		if err != nil {
			// QEMU may be on its way out: give its exit a moment to
			// show, for the better error.
			select {
			case <-exited:
			case <-time.After(time.Second):
			}
		}
		select {
		case <-exited:
			if r.template == "" {
				return fmt.Errorf("qemu: restore of the saved sandbox failed: %s", runlog.Tail(s.sd.path("console.log"), 2048))
			}
			// QEMU exits when it cannot load the state: the template is
			// unusable (a QEMU or machine change its digest missed).
			if derr := s.rt.dropTemplate(r.template); derr != nil {
				s.log.Warn("remove unusable qemu template", "template", r.template, "err", derr)
			}
			return fmt.Errorf("qemu: restore from template %s failed (template removed; the next sandbox cold-boots): %s",
				r.template, runlog.Tail(s.sd.path("console.log"), 2048))
		default:
		}
		if err != nil {
			return fmt.Errorf("qemu: restore: %w", err)
		}
		if st.Status != "inmigrate" {
			if !st.Running {
				if err := s.qmp(ctx, "cont", nil, nil); err != nil {
					return fmt.Errorf("qemu: resume restored vm: %w", err)
				}
			}
			s.log.Debug("restored from template", "template", r.template, "took", time.Since(t0).Round(time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: restore: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// ClaimInfo implements isolation.Claimable: a sandbox restored from a
// template answers to the template's token until it is claimed, and
// configures its own network from the claim (with GuestNet: it has a
// link), taking the sandbox's MAC. A cold-booted sandbox has nothing to
// claim beyond its spec.
func (s *Sandbox) ClaimInfo() isolation.ClaimInfo {
	if s.sd.Restored == nil {
		return isolation.ClaimInfo{}
	}
	tok, err := os.ReadFile(s.sd.path(templateTokenFile))
	if err != nil {
		s.log.Warn("restored sandbox without its template token", "err", err)
		return isolation.ClaimInfo{}
	}
	return isolation.ClaimInfo{Token: string(tok), GuestNet: s.sd.Net != nil, MAC: s.sd.Restored.MAC}
}

// Restored reports whether the sandbox was restored from a template (and
// which), rather than cold-booted.
func (s *Sandbox) Restored() (template string, ok bool) {
	if s.sd.Restored == nil {
		return "", false
	}
	return s.sd.Restored.Template, true
}
