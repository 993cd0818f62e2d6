package isolation

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeRuntime exercises the registry and rubric only; real runtimes are
// tested by isolationtest.
type fakeRuntime struct {
	name  string
	class Class
	avail error
}

func (f *fakeRuntime) Name() string     { return f.name }
func (f *fakeRuntime) Class() Class     { return f.class }
func (f *fakeRuntime) Available() error { return f.avail }
func (f *fakeRuntime) Create(context.Context, *Spec) (Sandbox, error) {
	return nil, errors.New("fake")
}
func (f *fakeRuntime) Recover(context.Context, State) (Sandbox, error) {
	return nil, errors.New("fake")
}

func TestPick(t *testing.T) {
	mu.Lock()
	saved := registry
	registry = map[string]Runtime{}
	mu.Unlock()
	t.Cleanup(func() { mu.Lock(); registry = saved; mu.Unlock() })
	Register(&fakeRuntime{name: "ctr", class: Namespaces})
	Register(&fakeRuntime{name: "gvisor", class: AppKernel})
	Register(&fakeRuntime{name: "vm", class: Hypervisor, avail: errors.New("no /dev/kvm")})

	for _, tc := range []struct {
		name    string
		floor   Class
		want    string
		wantErr string
	}{
		{"auto", Namespaces, "gvisor", ""},
		{"", Namespaces, "gvisor", ""},
		{"auto", AppKernel, "gvisor", ""},
		{"auto", Hypervisor, "", "no runtime of class hypervisor"},
		{"ctr", Namespaces, "ctr", ""},
		{"ctr", AppKernel, "", "below the isolation floor app-kernel"},
		{"vm", Namespaces, "", "no /dev/kvm"},
		{"nope", Namespaces, "", "unknown runtime"},
	} {
		rt, err := Pick(tc.name, tc.floor)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Pick(%q, %s) = %v, want error %q", tc.name, tc.floor, err, tc.wantErr)
			}
			continue
		}
		if err != nil || rt.Name() != tc.want {
			t.Errorf("Pick(%q, %s) = %v %v, want %s", tc.name, tc.floor, rt, err, tc.want)
		}
	}
	if all := All(); all[0].Name() != "vm" || all[2].Name() != "ctr" {
		t.Errorf("All not strongest first: %v", all)
	}
}

func TestParseClass(t *testing.T) {
	for _, c := range []Class{Namespaces, AppKernel, Hypervisor} {
		got, err := ParseClass(c.String())
		if err != nil || got != c {
			t.Errorf("ParseClass(%s) = %v %v", c, got, err)
		}
	}
	if _, err := ParseClass("vm"); err == nil {
		t.Error("ParseClass accepted vm")
	}
}

func TestResourcesWithDefaults(t *testing.T) {
	def := Resources{MemoryBytes: DefaultMemoryBytes, CPUs: DefaultCPUs, PIDs: DefaultPIDs, DiskBytes: DefaultDiskBytes}
	for _, tc := range []struct{ in, want Resources }{
		{Resources{}, def},
		{Resources{MemoryBytes: -1, CPUs: -1, PIDs: -1, DiskBytes: -1}, def},
		{Resources{MemoryBytes: 256 << 20, CPUs: 0.5, PIDs: 64, DiskBytes: 8 << 20}, Resources{MemoryBytes: 256 << 20, CPUs: 0.5, PIDs: 64, DiskBytes: 8 << 20}},
		{Resources{PIDs: 7}, Resources{MemoryBytes: DefaultMemoryBytes, CPUs: DefaultCPUs, PIDs: 7, DiskBytes: DefaultDiskBytes}},
	} {
		if got := tc.in.WithDefaults(); got != tc.want {
			t.Errorf("%+v.WithDefaults() = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}
