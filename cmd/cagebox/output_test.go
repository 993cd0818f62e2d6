package main

import (
	"bytes"
	"testing"
)

type row struct {
	Name   string `json:"name"`
	Status string `json:"status"`
}

func rowCells(r row) []string { return []string{r.Name, r.Status} }

func TestWriteList(t *testing.T) {
	header := []string{"NAME", "STATUS"}
	for _, tc := range []struct {
		name   string
		asJSON bool
		items  []row
		want   string
	}{
		{"table", false, []row{{"a", "running"}, {"longer-name", "failed"}},
			"NAME         STATUS\n" +
				"a            running\n" +
				"longer-name  failed\n"},
		{"empty table", false, nil, "NAME  STATUS\n"},
		// A line break or tab in a value stays inside its cell.
		{"table with breaks", false, []row{{"a", "failed (exit 1:\nboom\tbang)"}},
			"NAME  STATUS\n" +
				"a     failed (exit 1: boom bang)\n"},
		{"json", true, []row{{"a", "running"}},
			"[\n  {\n    \"name\": \"a\",\n    \"status\": \"running\"\n  }\n]\n"},
		// A list is an array even when empty, never null.
		{"empty json", true, nil, "[]\n"},
		// JSON values are printed as they are.
		{"json with breaks", true, []row{{"a", "x\ny"}},
			"[\n  {\n    \"name\": \"a\",\n    \"status\": \"x\\ny\"\n  }\n]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeList(&b, tc.asJSON, tc.items, header, rowCells); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Errorf("got\n%q\nwant\n%q", b.String(), tc.want)
			}
		})
	}
}
