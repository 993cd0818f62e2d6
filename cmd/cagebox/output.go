package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// printJSON prints v on stdout as indented JSON.
func printJSON(v any) error { return writeJSON(os.Stdout, v) }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printList prints the result of a list command on stdout: with asJSON
// the items as a JSON array (an empty one when there are none), else a
// table of header and one row per item, columns aligned.
func printList[T any](asJSON bool, items []T, header []string, row func(T) []string) error {
	return writeList(os.Stdout, asJSON, items, header, row)
}

func writeList[T any](w io.Writer, asJSON bool, items []T, header []string, row func(T) []string) error {
	if asJSON {
		if items == nil {
			items = []T{}
		}
		return writeJSON(w, items)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, it := range items {
		cells := row(it)
		for i, c := range cells {
			// A tab or line break in a value (an error message) would
			// break the table's columns or rows.
			cells[i] = cellSpace.Replace(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

var cellSpace = strings.NewReplacer("\t", " ", "\r\n", " ", "\n", " ", "\r", " ")

// listCmd is a command that fetches a list (list is called with the
// command's context and arguments) and prints it with printList: a table
// of header and one row per item, or JSON with --json.
func listCmd[T any](use, short string, args cobra.PositionalArgs, list func(ctx context.Context, args []string) ([]T, error), header []string, row func(T) []string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  args,
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := list(cmd.Context(), args)
			if err != nil {
				return err
			}
			return printList(asJSON, l, header, row)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// callCmd is a command that makes one call and prints nothing when it
// succeeds (rm and the like).
func callCmd(use, short string, args cobra.PositionalArgs, call func(ctx context.Context, args []string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  args,
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd.Context(), args)
		},
	}
}
