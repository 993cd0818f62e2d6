package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestSecretPlaceFlags(t *testing.T) {
	t.Setenv("API_KEY", "sk-test-value-000000000000")
	f := &createFlags{
		secrets:      []string{"API_KEY@api.example.com"},
		secretHeader: []string{"API_KEY:X-Api-Key", "API_KEY:X-Other"},
		secretQuery:  []string{"API_KEY:access_token"},
	}
	bs, err := f.secretBindings()
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 || !reflect.DeepEqual(bs[0].Headers, []string{"X-Api-Key", "X-Other"}) || !reflect.DeepEqual(bs[0].Query, []string{"access_token"}) {
		t.Fatalf("%+v", bs)
	}
	for _, c := range []struct {
		f    createFlags
		want string
	}{
		{createFlags{secrets: []string{"API_KEY@x"}, secretHeader: []string{"X-Api-Key"}}, "want NAME:HEADER"},
		{createFlags{secrets: []string{"API_KEY@x"}, secretQuery: []string{"API_KEY:"}}, "want NAME:PARAM"},
		{createFlags{secrets: []string{"API_KEY@x"}, secretQuery: []string{"OTHER:q"}}, "no --secret binds OTHER"},
	} {
		if _, err := c.f.secretBindings(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.f, err, c.want)
		}
	}
}
