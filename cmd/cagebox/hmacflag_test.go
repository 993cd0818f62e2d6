package main

import (
	"reflect"
	"testing"

	"github.com/cagebox/cagebox/api"
)

func TestParseHMACFlag(t *testing.T) {
	name, c, err := parseHMACFlag("HOOK:header=X-Signature,prefix=sha256=,sign=method+path+header:X-Timestamp+body,encoding=base64,max-body=1M")
	if err != nil {
		t.Fatal(err)
	}
	want := &api.HMACSigning{Header: "X-Signature", Prefix: "sha256=", Sign: []string{"method", "path", "header:X-Timestamp", "body"}, Encoding: "base64", MaxBody: 1 << 20}
	if name != "HOOK" || !reflect.DeepEqual(c, want) {
		t.Fatalf("got %s %+v", name, c)
	}
	for _, bad := range []string{"HOOK", "HOOK:", ":header=X", "HOOK:header=X", "HOOK:sign=body", "HOOK:header=X,sign=body,colour=red", "HOOK:header=X,sign=body,junk"} {
		if _, _, err := parseHMACFlag(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
