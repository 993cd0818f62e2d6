package link

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestLockHost(t *testing.T) {
	dir := t.TempDir()
	a, err := LockHost(dir, Config{TableName: "t1", IfPrefix: "ab"}, "/home/a")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"same table and prefix", Config{TableName: "t1", IfPrefix: "ab"}, "nftables table \"t1\""},
		{"same table", Config{TableName: "t1", IfPrefix: "cd"}, "nftables table \"t1\""},
		{"same prefix", Config{TableName: "t2", IfPrefix: "ab"}, "interface prefix \"ab\""},
	} {
		_, err := LockHost(dir, tc.cfg, "/home/b")
		if err == nil {
			t.Fatalf("%s: a second daemon got the lock", tc.name)
		}
		for _, want := range []string{tc.want, "pid " + strconv.Itoa(os.Getpid()), "home /home/a", "--net-"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", tc.name, err, want)
			}
		}
	}
	// Nothing of the failed attempts holds a lock: other names are free,
	// and once a releases, b gets them.
	c, err := LockHost(dir, Config{TableName: "t2", IfPrefix: "cd"}, "/home/c")
	if err != nil {
		t.Fatalf("a failed attempt kept a lock: %v", err)
	}
	c.Release()
	a.Release()
	b, err := LockHost(dir, Config{TableName: "t1", IfPrefix: "ab"}, "/home/b")
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	b.Release()
	// Defaults are locked by their real names.
	d, err := LockHost(dir, Config{}, "/home/d")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	if _, err := LockHost(dir, Config{TableName: DefaultTableName, IfPrefix: DefaultIfPrefix}, "/home/e"); err == nil {
		t.Fatal("defaults and their explicit names locked twice")
	}
}
