package daemon

import (
	"debug/elf"
	"fmt"
	"strings"
)

// checkAgentBinary refuses an agent binary that is not a static ELF
// executable. A dynamically linked agent (go build's default where a C
// compiler is found) needs a libc in every guest image, and in such a build
// the agent cannot drop capabilities on all its threads.
func checkAgentBinary(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("cagebox-agent binary %s: %w (build it with `make build`, or pass --agent)", path, err)
	}
	defer f.Close()
	var why []string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp := "an interpreter"
			if b := make([]byte, min(p.Filesz, 256)); len(b) > 0 {
				if n, _ := p.ReadAt(b, 0); n > 0 {
					interp = strings.TrimRight(string(b[:n]), "\x00")
				}
			}
			why = append(why, "it asks for "+interp)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("cagebox-agent binary %s: read its dynamic section: %w", path, err)
	}
	if len(libs) > 0 {
		why = append(why, "it needs "+strings.Join(libs, ", "))
	}
	if len(why) > 0 {
		return fmt.Errorf("cagebox-agent binary %s is dynamically linked (%s): the agent must be static; build it with `CGO_ENABLED=0 go build -o cagebox-agent ./cmd/cagebox-agent` or `make build`", path, strings.Join(why, "; "))
	}
	return nil
}
