package vmimage

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
)

// GuestModules are the kernel modules the guest needs, by name; their
// dependencies are added by ResolveModules. In Debian's bookworm kernel all
// of these are modules (=m), not built in:
//
//   - virtio_mmio: the transport of every microvm device (found via ACPI)
//   - virtio_blk, ext4 (+ jbd2, mbcache, crc16, and crc32c through its softdep):
//     the image disk
//   - overlay: the writable layer over the read-only image
//   - virtio_console: the agent's virtio-serial port
//   - virtio_net (+ net_failover, failover): the guest's network interface
//   - vmw_vsock_virtio_transport (+ vsock): the agent over vsock (Firecracker)
//   - button, evdev: the ACPI power button, so that a host-side powerdown
//     becomes a graceful agent shutdown
//
// A module missing from a kernel is an error: the pin in kernel.go names a
// kernel known to have all of them.
var GuestModules = []string{
	"virtio_mmio", "virtio_blk", "ext4", "overlay", "virtio_console",
	"virtio_net", "vmw_vsock_virtio_transport", "button", "evdev",
}

// Module is one resolved kernel module file.
type Module struct {
	Name string // normalised: dashes become underscores
	Path string // the .ko file
}

// modInfo is what the .modinfo section of a module says about loading it.
type modInfo struct {
	depends []string // hard dependencies (module names)
	pre     []string // softdep pre: names or aliases
	aliases []string
}

// readModInfo parses the .modinfo ELF section of a kernel module: NUL
// separated key=value strings. Only uncompressed modules are supported
// (Debian's bookworm kernels set CONFIG_MODULE_COMPRESS_NONE).
func readModInfo(path string) (*modInfo, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s has no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo of %s: %w", path, err)
	}
	mi := &modInfo{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					mi.depends = append(mi.depends, normName(d))
				}
			}
		case "softdep":
			// "pre: a b post: c"
			var inPre bool
			for _, w := range strings.Fields(v) {
				switch w {
				case "pre:":
					inPre = true
				case "post:":
					inPre = false
				default:
					if inPre {
						mi.pre = append(mi.pre, w)
					}
				}
			}
		case "alias":
			mi.aliases = append(mi.aliases, v)
		}
	}
	return mi, nil
}

func normName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// moduleIndex finds modules by name (and, lazily, by alias) under a kernel's
// module directory (lib/modules/RELEASE).
type moduleIndex struct {
	byName  map[string]string // name → path
	aliases map[string]string // alias → name; nil until needed
	infos   map[string]*modInfo
}

func newModuleIndex(dir string) (*moduleIndex, error) {
	idx := &moduleIndex{byName: map[string]string{}, infos: map[string]*modInfo{}}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() || !strings.HasSuffix(p, ".ko") {
			return nil
		}
		idx.byName[normName(strings.TrimSuffix(d.Name(), ".ko"))] = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index kernel modules in %s: %w", dir, err)
	}
	if len(idx.byName) == 0 {
		return nil, fmt.Errorf("no kernel modules (*.ko) under %s", dir)
	}
	return idx, nil
}

func (idx *moduleIndex) info(name string) (*modInfo, error) {
	if mi, ok := idx.infos[name]; ok {
		return mi, nil
	}
	mi, err := readModInfo(idx.byName[name])
	if err != nil {
		return nil, err
	}
	idx.infos[name] = mi
	return mi, nil
}

// lookup resolves a module name or alias (softdeps name aliases such as
// "crypto-crc32c") to a module name.
func (idx *moduleIndex) lookup(s string) (string, bool) {
	if _, ok := idx.byName[normName(s)]; ok {
		return normName(s), true
	}
	if idx.aliases == nil {
		idx.aliases = map[string]string{}
		names := make([]string, 0, len(idx.byName))
		for n := range idx.byName {
			names = append(names, n)
		}
		sort.Strings(names) // the first module (by name) offering an alias wins
		for _, n := range names {
			mi, err := idx.info(n)
			if err != nil {
				continue
			}
			for _, a := range mi.aliases {
				if _, dup := idx.aliases[a]; !dup {
					idx.aliases[a] = n
				}
			}
		}
	}
	n, ok := idx.aliases[s]
	return n, ok
}

// ResolveModules returns the modules named in want plus everything they
// depend on (depends= and softdep pre:), in an order that loads every
// module after its dependencies. dir is a kernel's module directory
// (lib/modules/RELEASE, or any tree of .ko files). Debian's linux-image
// packages ship no modules.dep (depmod runs at install), so dependencies are
// read from each module's .modinfo section, as depmod does.
func ResolveModules(dir string, want []string) ([]Module, error) {
	idx, err := newModuleIndex(dir)
	if err != nil {
		return nil, err
	}
	return resolve(idx, dir, want)
}

func resolve(idx *moduleIndex, dir string, want []string) ([]Module, error) {
	var (
		out   []Module
		state = map[string]int{} // 1 visiting, 2 done
		visit func(name, from string, hard bool) error
	)
	visit = func(name, from string, hard bool) error {
		n, ok := idx.lookup(name)
		if !ok {
			if !hard {
				return nil // an optional softdep this kernel lacks
			}
			if from == "" {
				return fmt.Errorf("kernel module %q not found in %s", name, dir)
			}
			return fmt.Errorf("kernel module %q (needed by %s) not found in %s", name, from, dir)
		}
		switch state[n] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("kernel module dependency cycle at %s", n)
		}
		state[n] = 1
		mi, err := idx.info(n)
		if err != nil {
			return err
		}
		for _, p := range mi.pre {
			if err := visit(p, n, false); err != nil {
				return err
			}
		}
		for _, d := range mi.depends {
			if err := visit(d, n, true); err != nil {
				return err
			}
		}
		state[n] = 2
		out = append(out, Module{Name: n, Path: idx.byName[n]})
		return nil
	}
	for _, w := range want {
		if err := visit(w, "", true); err != nil {
			return nil, err
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no kernel modules requested")
	}
	return out, nil
}
