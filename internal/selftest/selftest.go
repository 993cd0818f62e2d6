// Package selftest is the escape and exfiltration battery: cases as data
// (each says what success of the attack would mean, the script run inside a
// sandbox through the daemon's API, and a check that the attack did NOT
// succeed), a runner that makes one sandbox per runtime like any client, and
// the table of verdicts with a score per runtime (`cagebox selftest`).
package selftest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/cagebox/cagebox/api"
	"github.com/cagebox/cagebox/client"
)

// Status is a case's verdict on one runtime.
type Status string

const (
	Pass Status = "pass"
	Fail Status = "FAIL"
	NA   Status = "n/a"
)

// Verdict is a status and why.
type Verdict struct {
	Status Status `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Output is what a case's script left: its streams and exit code.
type Output struct {
	Stdout, Stderr string
	Exit           int
}

// Env is what a script may refer to: {{UPSTREAM}} (an allowed name the
// daemon can reach, "" when none), {{GATEWAY}} and {{SECRET_VAR}} (the
// environment variable holding a placeholder bound to another host).
type Env struct {
	Runtime  string
	Class    string
	Upstream string
	Gateway  string
}

// Case is one attack.
type Case struct {
	Name     string `json:"name"`
	Category string `json:"category"`
	// Attack says what success of the attack would mean.
	Attack string `json:"attack"`
	// Script runs under `sh -c` in the sandbox.
	Script string `json:"-"`
	// Needs lists tools the script needs in the guest ("python3", "curl")
	// and "upstream" (an allowed name the daemon reaches).
	Needs []string `json:"needs,omitempty"`
	// Check returns nil when the attack did NOT succeed.
	Check func(Output) error `json:"-"`
	// OwnKernel: the attack is on the kernel's syscall surface. On a
	// runtime whose guest has a kernel of its own (app-kernel: gVisor's
	// sentry; hypervisor: the VM's kernel) a call that works reaches that
	// kernel, not the host's, so it is n/a there (the reason says what
	// worked); on the shared-kernel container runtime it is a FAIL.
	OwnKernel bool `json:"own_kernel,omitempty"`
}

// Judge is Evaluate on a runtime of class class (see Case.OwnKernel).
func Judge(c Case, class string, o Output) Verdict {
	v := Evaluate(c, o)
	if v.Status == Fail && c.OwnKernel && (class == "app-kernel" || class == "hypervisor") {
		return Verdict{Status: NA, Reason: "served by the guest's own kernel (" + class + "), not the host's: " + v.Reason}
	}
	return v
}

// Marker is the check of most cases: the script prints "BLOCKED ..." for
// every attempt that failed and "ESCAPED ..." for any that worked; the
// attack is stopped only with at least one BLOCKED line and no ESCAPED one
// (no output at all is inconclusive, so a FAIL).
func Marker(o Output) error {
	for _, l := range strings.Split(o.Stdout, "\n") {
		if strings.HasPrefix(l, "ESCAPED") {
			return fmt.Errorf("%s", strings.TrimSpace(l))
		}
	}
	if !strings.Contains(o.Stdout, "BLOCKED") {
		return fmt.Errorf("inconclusive: no BLOCKED line (exit %d): %s", o.Exit, clip(o.Stdout+o.Stderr, 200))
	}
	return nil
}

// ErrNotApplicable, wrapped by a check's error, makes the verdict n/a: the
// case could not be judged here (say, the upstream does not reflect what
// it receives), which is neither a pass nor a failure.
var ErrNotApplicable = errors.New("not applicable")

// Evaluate runs a case's check on an output.
func Evaluate(c Case, o Output) Verdict {
	check := c.Check
	if check == nil {
		check = Marker
	}
	if err := check(o); err != nil {
		if errors.Is(err, ErrNotApplicable) {
			return Verdict{Status: NA, Reason: err.Error()}
		}
		return Verdict{Status: Fail, Reason: err.Error()}
	}
	return Verdict{Status: Pass}
}

// leaked reports whether an output carries a secret's real value, as is or
// in a common encoding. Every case's output is checked: whatever the case
// attacks, a real value that reaches the guest is an escape of the kind
// cagebox exists to prevent.
func leaked(o Output, values ...string) string {
	all := o.Stdout + o.Stderr
	for _, v := range values {
		if v == "" {
			continue
		}
		for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v)), base64.RawURLEncoding.EncodeToString([]byte(v)), hex.EncodeToString([]byte(v))} {
			if strings.Contains(all, form) {
				return form
			}
		}
	}
	return ""
}

// Expand fills a script's placeholders.
func Expand(script string, e Env) string {
	return strings.NewReplacer("{{UPSTREAM}}", e.Upstream, "{{GATEWAY}}", e.Gateway, "{{SECRET_VAR}}", SecretVar, "{{REFLECT_VAR}}", ReflectVar).Replace(script)
}

// SecretVar is the guest variable holding a placeholder bound only to
// BoundHost, which no sandbox of the selftest may reach. ReflectVar, given
// when there is an upstream, holds a placeholder bound to the upstream
// itself: the gateway swaps it in there, and if the upstream echoes it the
// response must reach the guest with the real value scrubbed.
const (
	SecretVar  = "CBX_SELFTEST_TOKEN"
	BoundHost  = "bound.selftest.invalid"
	ReflectVar = "CBX_SELFTEST_REFLECT"
)

// Result is one runtime's column.
type Result struct {
	Runtime  string             `json:"runtime"`
	Class    string             `json:"class,omitempty"`
	Sandbox  string             `json:"sandbox,omitempty"`
	Skipped  string             `json:"skipped,omitempty"`
	Verdicts map[string]Verdict `json:"verdicts"`
	Passed   int                `json:"passed"`
	Failed   int                `json:"failed"`
	// Applicable counts the cases that are not n/a.
	Applicable int     `json:"applicable"`
	Seconds    float64 `json:"seconds"`
}

// Report is a whole run.
type Report struct {
	Image   string   `json:"image"`
	Cases   []Case   `json:"cases"`
	Results []Result `json:"results"`
}

// Score counts a result's verdicts.
func (r *Result) Score() {
	r.Passed, r.Failed, r.Applicable = 0, 0, 0
	for _, v := range r.Verdicts {
		switch v.Status {
		case Pass:
			r.Passed++
			r.Applicable++
		case Fail:
			r.Failed++
			r.Applicable++
		}
	}
}

// OK is true when no applicable case failed anywhere.
func (rep *Report) OK() bool {
	for _, r := range rep.Results {
		if r.Failed > 0 {
			return false
		}
	}
	return true
}

// Table writes the case × runtime table, n/a and FAIL reasons, and a score
// per runtime.
func (rep *Report) Table(w io.Writer) {
	width := len("CASE")
	for _, c := range rep.Cases {
		if len(c.Name) > width {
			width = len(c.Name)
		}
	}
	fmt.Fprintf(w, "%-*s  %-12s", width, "CASE", "CATEGORY")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "  %-10s", r.Runtime)
	}
	fmt.Fprintln(w)
	type note struct{ rt, cs, st, why string }
	var notes []note
	for _, c := range rep.Cases {
		fmt.Fprintf(w, "%-*s  %-12s", width, c.Name, c.Category)
		for _, r := range rep.Results {
			v := r.Verdicts[c.Name]
			if v.Status == "" {
				v = Verdict{Status: NA, Reason: "not run"}
			}
			fmt.Fprintf(w, "  %-10s", v.Status)
			if v.Status != Pass && v.Reason != "" && r.Skipped == "" {
				notes = append(notes, note{r.Runtime, c.Name, string(v.Status), v.Reason})
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-*s  %-12s", width, "SCORE", "")
	for _, r := range rep.Results {
		s := fmt.Sprintf("%d/%d", r.Passed, r.Applicable)
		if r.Skipped != "" {
			s = "-"
		}
		fmt.Fprintf(w, "  %-10s", s)
	}
	fmt.Fprintln(w)
	for _, r := range rep.Results {
		if r.Skipped != "" {
			fmt.Fprintf(w, "\n%s: not run: %s", r.Runtime, r.Skipped)
		}
	}
	if len(notes) > 0 {
		sort.SliceStable(notes, func(i, j int) bool { return notes[i].st < notes[j].st })
		for _, n := range notes {
			fmt.Fprintf(w, "\n%s %s on %s: %s", n.st, n.cs, n.rt, n.why)
		}
	}
	fmt.Fprintln(w)
}

// JSON is the report as JSON.
func (rep *Report) JSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// Options are a run's settings.
type Options struct {
	// Runtimes to test; empty = every runtime the daemon lists.
	Runtimes []string
	// Image of the sandboxes ("default" when empty).
	Image string
	// Upstream is a name the sandboxes may reach (the daemon must resolve
	// it); cases that need one are n/a without it.
	Upstream string
	// CaseTimeout bounds one case (default 60 s).
	CaseTimeout time.Duration
	// Progress, when set, gets a line per runtime and case.
	Progress io.Writer
}

// Run makes one sandbox per runtime through the API, runs every case in it
// and removes it.
func Run(ctx context.Context, c *client.Client, cases []Case, o Options) (*Report, error) {
	if o.Image == "" {
		o.Image = "default"
	}
	if o.CaseTimeout == 0 {
		o.CaseTimeout = 60 * time.Second
	}
	rts, err := c.Runtimes(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]api.Runtime{}
	for _, r := range rts {
		byName[r.Name] = r
	}
	names := o.Runtimes
	if len(names) == 0 {
		for _, r := range rts {
			names = append(names, r.Name)
		}
	}
	rep := &Report{Image: o.Image, Cases: cases}
	for _, name := range names {
		res := Result{Runtime: name, Verdicts: map[string]Verdict{}}
		rt, known := byName[name]
		res.Class = rt.Class
		switch {
		case !known:
			res.Skipped = "the daemon has no such runtime"
		case !rt.Available:
			res.Skipped = "unavailable: " + rt.Reason
		}
		if res.Skipped != "" {
			for _, cs := range cases {
				res.Verdicts[cs.Name] = Verdict{Status: NA, Reason: res.Skipped}
			}
			rep.Results = append(rep.Results, res)
			continue
		}
		start := time.Now()
		if err := runOne(ctx, c, cases, o, &res); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		res.Seconds = time.Since(start).Round(100 * time.Millisecond).Seconds()
		res.Score()
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

func runOne(ctx context.Context, c *client.Client, cases []Case, o Options, res *Result) error {
	tok := make([]byte, 36)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	// The real values: random, made for this run, never shown.
	secret, reflected := "cbxst"+hex.EncodeToString(tok[:18]), "cbxsr"+hex.EncodeToString(tok[18:])
	req := &api.CreateSandboxRequest{
		Runtime: res.Runtime,
		Image:   o.Image,
		Timeout: "30m",
		Secrets: []api.SecretBinding{{Name: SecretVar, Value: secret, Hosts: []string{BoundHost}}},
	}
	if o.Upstream != "" {
		req.Allow = []string{o.Upstream}
		req.Secrets = append(req.Secrets, api.SecretBinding{Name: ReflectVar, Value: reflected, Hosts: []string{o.Upstream}})
	}
	sb, err := c.Create(ctx, req)
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	res.Sandbox = sb.ID
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = c.Remove(rctx, sb.ID)
	}()
	env := Env{Runtime: res.Runtime, Class: res.Class, Upstream: o.Upstream}
	if sb.Network != nil {
		env.Gateway = sb.Network.Gateway
	}
	// Which tools the image has.
	have := map[string]bool{"upstream": o.Upstream != ""}
	probe, err := execScript(ctx, c, sb.ID, "for t in python3 curl; do command -v $t >/dev/null 2>&1 && echo $t; done; true", o.CaseTimeout)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	for _, t := range strings.Fields(probe.Stdout) {
		have[t] = true
	}
	for _, cs := range cases {
		var missing, why []string
		noUpstream := false
		for _, n := range cs.Needs {
			switch {
			case have[n]:
			case n == "upstream":
				noUpstream = true
			default:
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			why = append(why, "image "+o.Image+" has no "+strings.Join(missing, ", "))
		}
		if noUpstream {
			why = append(why, "needs a reachable allowed upstream (--upstream NAME)")
		}
		if len(why) > 0 {
			res.Verdicts[cs.Name] = Verdict{Status: NA, Reason: strings.Join(why, "; ")}
			continue
		}
		out, err := execScript(ctx, c, sb.ID, Expand(cs.Script, env), o.CaseTimeout)
		var v Verdict
		switch {
		case err != nil:
			v = Verdict{Status: Fail, Reason: "exec: " + err.Error()}
		case leaked(out, secret, reflected) != "":
			v = Verdict{Status: Fail, Reason: "a secret's real value reached the guest (in its output)"}
		default:
			v = Judge(cs, res.Class, out)
		}
		res.Verdicts[cs.Name] = v
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "%s %-28s %s %s\n", res.Runtime, cs.Name, v.Status, clip(v.Reason, 160))
		}
	}
	return nil
}

func execScript(ctx context.Context, c *client.Client, id, script string, timeout time.Duration) (Output, error) {
	var so, se bytes.Buffer
	ctx, cancel := context.WithTimeout(ctx, timeout+15*time.Second)
	defer cancel()
	f, err := c.Exec(ctx, id, &api.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: timeout.String()}, nil, &so, &se)
	if err != nil {
		return Output{}, err
	}
	o := Output{Stdout: so.String(), Stderr: se.String(), Exit: -1}
	if f.ExitCode != nil {
		o.Exit = *f.ExitCode
	}
	return o, nil
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
