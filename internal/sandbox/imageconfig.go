package sandbox

import (
	"strings"

	"github.com/cagebox/cagebox/internal/image"
)

// What an OCI image's config says about running it (image.Config), as
// sandboxes use it: its Env is the base of the guest's environment (the
// request's env and the secrets' placeholders override it, key by key),
// and its WorkingDir and User are the defaults of every exec that names
// no cwd or user — as `docker run` does. Entrypoint and Cmd are not used:
// a sandbox runs what each exec asks. Images built locally have no
// config, and nothing changes for them.

// guestEnv is a sandbox's base environment: the image's, then the
// request's, then the secrets' placeholders; a later KEY=VALUE replaces an
// earlier one of the same KEY, keeping the first one's position.
func guestEnv(img *image.Image, reqEnv, secretEnv []string) []string {
	var lists [][]string
	if img != nil && img.Config != nil {
		lists = append(lists, img.Config.Env)
	}
	lists = append(lists, reqEnv, secretEnv)
	var out []string
	at := map[string]int{}
	for _, l := range lists {
		for _, kv := range l {
			k, _, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				continue // ValidateEnv refuses these in requests; an image's are skipped
			}
			if i, seen := at[k]; seen {
				out[i] = kv
				continue
			}
			at[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// imageExecDefaults are the cwd and user of execs that name none.
func imageExecDefaults(img *image.Image) (cwd, user string) {
	if img == nil || img.Config == nil {
		return "", ""
	}
	return img.Config.WorkingDir, img.Config.User
}
