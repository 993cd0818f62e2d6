package sandbox

import (
	"reflect"
	"testing"

	"github.com/cagebox/cagebox/internal/image"
)

func TestGuestEnv(t *testing.T) {
	img := &image.Image{Config: &image.Config{Env: []string{"PATH=/usr/local/bin:/bin", "LANG=C.UTF-8", "FOO=image", "bad", "=x"}, WorkingDir: "/app", User: "node"}}
	got := guestEnv(img, []string{"FOO=req", "NEW=1"}, []string{"TOKEN=cbx_placeholder", "LANG=secret-wins"})
	want := []string{"PATH=/usr/local/bin:/bin", "LANG=secret-wins", "FOO=req", "NEW=1", "TOKEN=cbx_placeholder"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("guestEnv = %q, want %q", got, want)
	}
	if got := guestEnv(&image.Image{}, []string{"A=1"}, nil); !reflect.DeepEqual(got, []string{"A=1"}) {
		t.Errorf("no config: %q", got)
	}
	if got := guestEnv(nil, nil, nil); len(got) != 0 {
		t.Errorf("nothing: %q", got)
	}
	if cwd, user := imageExecDefaults(img); cwd != "/app" || user != "node" {
		t.Errorf("defaults = %q %q", cwd, user)
	}
	if cwd, user := imageExecDefaults(&image.Image{}); cwd != "" || user != "" {
		t.Errorf("defaults without config = %q %q", cwd, user)
	}
}
