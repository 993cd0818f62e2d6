package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/api"
)

func toolCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tool",
		Short: "Named tools: register a command once, run it with an input in a fresh sandbox (cagebox execute)",
	}
	var (
		f                                           createFlags
		desc, floor, inputFile, schemaFile, timeout string
		replace                                     bool
	)
	add := &cobra.Command{
		Use:   "add NAME [flags] -- CMD [ARGS...]",
		Short: "Register a tool: each execute runs CMD in a fresh sandbox with the input on stdin (or in --input-file)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return fmt.Errorf("give the tool's name, then -- and its command: cagebox tool add NAME -- CMD ARGS")
			}
			t := &api.Tool{Name: args[0], Argv: args[1:], Description: desc, InputFile: inputFile,
				Image: f.image, Runtime: f.runtime, RuntimeFloor: floor, Allow: f.allow, PolicyRef: f.policyRef,
				Env: f.env, Timeout: timeout, CPUs: f.cpus}
			if f.memory != "" {
				n, err := parseSize(f.memory)
				if err != nil {
					return fmt.Errorf("--memory: %w", err)
				}
				t.MemoryBytes = n
			}
			sec, err := f.secretBindings()
			if err != nil {
				return err
			}
			t.Secrets = sec
			if schemaFile != "" {
				b, err := os.ReadFile(schemaFile)
				if err != nil {
					return fmt.Errorf("--input-schema: %w", err)
				}
				if !json.Valid(b) {
					return fmt.Errorf("--input-schema: %s is not JSON", schemaFile)
				}
				t.InputSchema = b
			}
			out, err := g.client().PutTool(cmd.Context(), t, replace)
			if err != nil {
				return err
			}
			fmt.Println(out.Name)
			return nil
		},
	}
	add.Flags().StringVar(&f.image, "image", "", "guest image (default: default)")
	add.Flags().StringVar(&f.runtime, "runtime", "", "runtime name, or auto (default: the daemon's --default-runtime, else the strongest available)")
	add.Flags().StringVar(&floor, "runtime-floor", "", "isolation floor of every execute: namespaces, app-kernel or hypervisor")
	add.Flags().StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M")
	add.Flags().Float64Var(&f.cpus, "cpus", 0, "CPU limit in cores")
	add.Flags().StringVar(&timeout, "timeout", "", "longest run of one execute (default 60s, at most 1h)")
	add.Flags().StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	add.Flags().StringArrayVar(&f.allow, "allow", nil, "allow HTTP(S) to this host (repeatable; default: nothing is reachable)")
	add.Flags().StringVar(&f.policyRef, "policy-ref", "", "follow the tenant's named policy NAME")
	add.Flags().StringArrayVar(&f.secrets, "secret", nil, "bind a stored secret: NAME=vault:KEY[@HOST,...] (inline values are refused for tools)")
	add.Flags().StringVar(&desc, "description", "", "what the tool does (MCP clients show it)")
	add.Flags().StringVar(&inputFile, "input-file", "", "write the input to this absolute path in the sandbox instead of stdin")
	add.Flags().StringVar(&schemaFile, "input-schema", "", "JSON Schema file of the input (MCP clients show it)")
	add.Flags().BoolVar(&replace, "replace", false, "replace a tool of the same name")
	ls := listCmd("ls", "List your tools", cobra.NoArgs,
		func(ctx context.Context, _ []string) ([]api.Tool, error) { return g.client().Tools(ctx) },
		[]string{"NAME", "COMMAND", "RUNTIME", "IMAGE", "TIMEOUT", "CREATED"}, func(t api.Tool) []string {
			rt := t.Runtime
			if rt == "" {
				rt = "default"
			}
			if t.RuntimeFloor != "" {
				rt += " (≥ " + t.RuntimeFloor + ")"
			}
			img, to := t.Image, t.Timeout
			if img == "" {
				img = "default"
			}
			if to == "" {
				to = "60s"
			}
			return []string{t.Name, strings.Join(t.Argv, " "), rt, img, to, t.CreatedAt.Local().Format(time.DateTime)}
		})
	rm := callCmd("rm NAME", "Remove a tool", cobra.ExactArgs(1),
		func(ctx context.Context, args []string) error { return g.client().DeleteTool(ctx, args[0]) })
	cmd.AddCommand(add, ls, rm)
	return cmd
}

func executeCmd(g *globals) *cobra.Command {
	var input, inputFile string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "execute NAME [--input TEXT | --input-file FILE | < input]",
		Short: "Run a tool once: its output, its exit code as this command's, the egress decisions with --json",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := input
			switch {
			case inputFile != "":
				b, err := os.ReadFile(inputFile)
				if err != nil {
					return &exitError{code: 125, msg: fmt.Sprintf("--input-file: %v", err)}
				}
				in = string(b)
			case input == "" && stdinAttached():
				b, err := io.ReadAll(os.Stdin)
				if err != nil {
					return &exitError{code: 125, msg: fmt.Sprintf("read stdin: %v", err)}
				}
				in = string(b)
			}
			res, err := g.client().Execute(cmd.Context(), args[0], &api.ExecuteRequest{Input: in})
			if err != nil {
				return &exitError{code: 125, msg: err.Error()}
			}
			if asJSON {
				if err := printJSON(res); err != nil {
					return err
				}
			} else {
				fmt.Fprint(os.Stdout, res.Stdout)
				fmt.Fprint(os.Stderr, res.Stderr)
				if res.StdoutTruncated || res.StderrTruncated {
					fmt.Fprintln(os.Stderr, "cagebox: output was cut at the size limit")
				}
				for _, d := range res.Egress {
					if !d.Allowed {
						fmt.Fprintf(os.Stderr, "cagebox: egress denied: %s %s%s (rule %s)\n", d.Method, d.Host, d.Path, d.Rule)
					}
				}
				if res.TimedOut {
					fmt.Fprintln(os.Stderr, "cagebox: the tool ran out of time")
				}
			}
			if res.ExitCode != 0 {
				return &exitError{code: res.ExitCode}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&input, "input", "", "the input (default: stdin when it is not a terminal)")
	cmd.Flags().StringVar(&inputFile, "input-file", "", "read the input from this file")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the whole result as JSON")
	return cmd
}
