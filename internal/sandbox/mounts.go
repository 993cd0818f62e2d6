package sandbox

import "github.com/cagebox/cagebox/internal/mounts"

// unmountBelow unmounts every mount at or below dir, deepest first (in the
// calling thread's mount namespace: mounts.MountInfo).
func unmountBelow(dir string) { mounts.UnmountBelow(dir) }
