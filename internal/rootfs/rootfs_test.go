package rootfs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSymlinksStayInsideRoot(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(outside, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	// A hostile image: absolute and relative links pointing out.
	os.Symlink(outside, filepath.Join(root, "etc", "resolv.conf"))
	os.Symlink("../../../../../../"+outside, filepath.Join(root, "etc", "hosts"))
	os.Symlink(filepath.Dir(outside), filepath.Join(root, "ssl"))

	if b, err := ReadFile(root, "/etc/resolv.conf", 100); err == nil && string(b) == "host" {
		t.Fatal("read followed a link out of the root")
	}
	if b, err := ReadFile(root, "/etc/hosts", 100); err == nil && string(b) == "host" {
		t.Fatal("read followed a relative link out of the root")
	}
	for _, rel := range []string{"etc/resolv.conf", "etc/hosts"} {
		if err := WriteFile(root, rel, []byte("guest"), 0o644); err != nil {
			t.Fatalf("write %s: %v", rel, err)
		}
	}
	// Through a directory link: resolved inside the root (where the target
	// does not exist) — an error is fine, an escape is not.
	for _, rel := range []string{"ssl/host-secret", "ssl/certs/bundle"} {
		_ = WriteFile(root, rel, []byte("guest"), 0o644)
	}
	if b, _ := os.ReadFile(outside); string(b) != "host" {
		t.Fatalf("a write escaped the root: host file now %q", b)
	}
	if b, err := ReadFile(root, "etc/resolv.conf", 100); err != nil || string(b) != "guest" {
		t.Fatalf("read back %q %v", b, err)
	}
}

// TestWriteGuest pins the files every guest gets, whichever side writes
// them (the host into a container's root, the VM init inside a VM).
func TestWriteGuest(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----\n"
	for _, tc := range []struct {
		name  string
		g     Guest
		image map[string]string // files in the image before
		want  map[string]string // files after ("" = absent)
	}{
		{
			name:  "bare",
			g:     Guest{},
			image: map[string]string{"etc/resolv.conf": "nameserver 9.9.9.9\n"},
			want: map[string]string{
				"etc/hostname":    "sandbox\n",
				"etc/hosts":       "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
				"etc/resolv.conf": "nameserver 9.9.9.9\n",
				CAPath:            "",
				SystemBundle:      "",
			},
		},
		{
			name:  "network and CA",
			g:     Guest{Hostname: "h1", Nameserver: "10.0.0.1", TrustedCAPEM: []byte(ca)},
			image: map[string]string{SystemBundle: "IMAGE ROOTS"},
			want: map[string]string{
				"etc/hostname":    "h1\n",
				"etc/hosts":       "127.0.0.1\tlocalhost h1\n::1\tlocalhost ip6-localhost ip6-loopback\n",
				"etc/resolv.conf": "nameserver 10.0.0.1\noptions ndots:0 attempts:2 timeout:2\n",
				CAPath:            ca,
				CABundlePath:      "IMAGE ROOTS\n" + ca,
				SystemBundle:      "IMAGE ROOTS\n" + ca,
			},
		},
		{
			name:  "CA without an image bundle",
			g:     Guest{TrustedCAPEM: []byte(ca)},
			want:  map[string]string{CAPath: ca, CABundlePath: ca, SystemBundle: ca},
			image: map[string]string{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, data := range tc.image {
				p = filepath.Join(root, p)
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			extra := File{Path: EnvFile, Data: EnvData([]string{"A=1", "B=two words"}), Mode: 0o400}
			if err := WriteGuest(root, tc.g, extra); err != nil {
				t.Fatal(err)
			}
			for p, want := range tc.want {
				b, err := os.ReadFile(filepath.Join(root, p))
				if want == "" {
					if err == nil {
						t.Errorf("%s written: %q", p, b)
					}
					continue
				}
				if err != nil || string(b) != want {
					t.Errorf("%s = %q (%v), want %q", p, b, err, want)
				}
			}
			fi, err := os.Stat(filepath.Join(root, EnvFile))
			if err != nil || fi.Mode().Perm() != 0o400 {
				t.Fatalf("env file: %v %v", fi, err)
			}
			if b, _ := os.ReadFile(filepath.Join(root, EnvFile)); string(b) != "A=1\nB=two words\n" {
				t.Errorf("env file %q", b)
			}
		})
	}
}

func TestWriteGuestStaysInsideRoot(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-file")
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.Symlink(outside, filepath.Join(root, "etc", "resolv.conf"))
	if err := WriteGuest(root, Guest{Nameserver: "10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(outside); err == nil {
		t.Fatal("a link in the image sent the write to the host")
	}
}
