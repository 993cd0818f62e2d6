package kvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestCacheRunsOncePerKey(t *testing.T) {
	var c Cache
	var runs atomic.Int32
	probe := func(ctx context.Context) Verdict {
		runs.Add(1)
		time.Sleep(20 * time.Millisecond)
		return Verdict{Usable: true, Reason: "ok"}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v := c.Do("k", time.Second, probe); !v.Usable || v.Took <= 0 {
				t.Errorf("verdict %+v", v)
			}
		}()
	}
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("probe ran %d times for one key", n)
	}
	c.Do("other", time.Second, probe)
	if n := runs.Load(); n != 2 {
		t.Fatalf("a second key ran the probe %d times in all, want 2", n)
	}
	c.Forget()
	c.Do("k", time.Second, probe)
	if n := runs.Load(); n != 3 {
		t.Fatalf("after Forget the probe ran %d times in all, want 3", n)
	}
}

func TestCacheBoundsTheProbe(t *testing.T) {
	var c Cache
	v := c.Do("slow", 50*time.Millisecond, func(ctx context.Context) Verdict {
		<-ctx.Done()
		return Verdict{Reason: "timed out"}
	})
	if v.Usable || v.Took > 5*time.Second {
		t.Fatalf("verdict %+v", v)
	}
}

func TestQuote(t *testing.T) {
	if got := Quote("a\n  b\tc\n"); got != `"a b c"` {
		t.Fatalf("Quote = %s", got)
	}
	long := strings.Repeat("x", 1000) + "END"
	got := Quote(long)
	if !strings.HasSuffix(got, `END"`) || len(got) > 320 || !strings.HasPrefix(got, `"…`) {
		t.Fatalf("Quote of a long text = %q", got)
	}
	v := Verdict{Reason: "probe failed", Evidence: "failed to set MSR 0x10a"}
	if v.String() != `probe failed: "failed to set MSR 0x10a"` {
		t.Fatalf("String = %s", v)
	}
}

func TestOpen(t *testing.T) {
	if err := Open(filepath.Join(t.TempDir(), "kvm")); err == nil {
		t.Fatal("a missing device opened")
	}
	if err := Open("/dev/null"); err != nil {
		t.Fatal(err)
	}
}

// fakeDevice makes a character device node (/dev/null's numbers) with the
// given mode and group, and group/passwd files, and points VMMAccess at
// them.
func fakeDevice(t *testing.T, mode uint32, gid int, group, passwd string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mknod)")
	}
	dir := t.TempDir()
	dev := filepath.Join(dir, "kvm")
	if err := syscall.Mknod(dev, syscall.S_IFCHR|mode, int(1<<8|3)); err != nil {
		t.Skipf("mknod: %v", err)
	}
	if err := os.Chmod(dev, os.FileMode(mode)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dev, 0, gid); err != nil {
		t.Fatal(err)
	}
	g, p := filepath.Join(dir, "group"), filepath.Join(dir, "passwd")
	os.WriteFile(g, []byte(group), 0o644)
	os.WriteFile(p, []byte(passwd), 0o644)
	oldG, oldP := groupFile, passwdFile
	groupFile, passwdFile = g, p
	t.Cleanup(func() { groupFile, passwdFile = oldG, oldP })
	return dev
}

func statDev(t *testing.T, dev string) (uint32, uint32) {
	var st syscall.Stat_t
	if err := syscall.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777, st.Gid
}

const (
	groupsEmptyKVM  = "root:x:0:\nkvm:x:994:\nusers:x:100:alice\n"
	passwdPlain     = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:100::/home/alice:/bin/sh\n"
	groupsKVMMember = "root:x:0:\nkvm:x:994:alice\n"
	passwdKVMPrim   = "root:x:0:0:root:/root:/bin/bash\nbob:x:1001:994::/home/bob:/bin/sh\n"
)

func TestVMMAccess(t *testing.T) {
	t.Run("root only becomes kvm 0660 when kvm is empty", func(t *testing.T) {
		dev := fakeDevice(t, 0o600, 0, groupsEmptyKVM, passwdPlain)
		gid, note, err := VMMAccess(dev)
		if err != nil || gid != 994 || note == "" {
			t.Fatalf("VMMAccess = %d, %q, %v", gid, note, err)
		}
		if mode, g := statDev(t, dev); mode != 0o660 || g != 994 {
			t.Fatalf("device is %04o group %d, want 0660 group 994", mode, g)
		}
		// Again: nothing more to change.
		if gid, note, err := VMMAccess(dev); err != nil || gid != 994 || note != "" {
			t.Fatalf("second VMMAccess = %d, %q, %v", gid, note, err)
		}
	})
	t.Run("a group that already has it is used as is", func(t *testing.T) {
		dev := fakeDevice(t, 0o660, 55, groupsKVMMember, passwdPlain)
		if gid, note, err := VMMAccess(dev); err != nil || gid != 55 || note != "" {
			t.Fatalf("VMMAccess = %d, %q, %v", gid, note, err)
		}
	})
	t.Run("world read-write needs no group", func(t *testing.T) {
		dev := fakeDevice(t, 0o666, 0, groupsEmptyKVM, passwdPlain)
		if gid, _, err := VMMAccess(dev); err != nil || gid != -1 {
			t.Fatalf("VMMAccess = %d, %v", gid, err)
		}
	})
	for name, files := range map[string][2]string{
		"kvm has a listed member":     {groupsKVMMember, passwdPlain},
		"kvm is a user's primary":     {"root:x:0:\nkvm:x:994:\n", passwdKVMPrim},
		"there is no kvm group":       {"root:x:0:\n", passwdPlain},
		"the kvm group is gid 0 (!)":  {"kvm:x:0:\n", passwdPlain},
		"group root may not be given": {"root:x:0:\n", passwdPlain},
	} {
		t.Run("refused: "+name, func(t *testing.T) {
			dev := fakeDevice(t, 0o600, 0, files[0], files[1])
			gid, _, err := VMMAccess(dev)
			if !errors.Is(err, ErrNoAccess) || gid != -1 {
				t.Fatalf("VMMAccess = %d, %v; want ErrNoAccess", gid, err)
			}
			if mode, g := statDev(t, dev); mode != 0o600 || g != 0 {
				t.Fatalf("a refusal changed the device to %04o group %d", mode, g)
			}
		})
	}
	t.Run("group 0 with group bits is not handed out", func(t *testing.T) {
		dev := fakeDevice(t, 0o660, 0, "root:x:0:\n", passwdPlain)
		if gid, _, err := VMMAccess(dev); gid == 0 || err == nil {
			t.Fatalf("VMMAccess = %d, %v: root's group must never be a VMM's", gid, err)
		}
	})
}
