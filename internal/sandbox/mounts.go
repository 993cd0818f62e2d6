package sandbox

import (
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// unmountBelow unmounts every mount at or below dir, deepest first.
func unmountBelow(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if unix.Unmount(p, 0) != nil {
			_ = unix.Unmount(p, unix.MNT_DETACH)
		}
	}
}
