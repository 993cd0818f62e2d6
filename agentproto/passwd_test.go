package agentproto

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const testPasswd = `root:x:0:0:root:/root:/bin/bash
# a comment

daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
broken line
bad:x:notanumber:1::/:/bin/sh
neg:x:4294967295:1::/:/bin/sh
alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash
bob:x:1001:100::/home/bob:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
`

const testGroup = `root:x:0:
users:x:100:alice
alice:x:1000:
docker:x:999:alice, bob
wheel:x:10:bob,alice
nogroup:x:65534:
junk
`

func TestParsePasswd(t *testing.T) {
	users, err := parsePasswd(strings.NewReader(testPasswd))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range users {
		names = append(names, u.Name)
	}
	if want := []string{"root", "daemon", "alice", "bob", "nobody"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("users %v, want %v", names, want)
	}
	if users[2] != (passwdEntry{Name: "alice", UID: 1000, GID: 1000, Home: "/home/alice", Shell: "/bin/bash"}) {
		t.Fatalf("alice = %+v", users[2])
	}
	groups, err := parseGroup(strings.NewReader(testGroup))
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 6 || !reflect.DeepEqual(groups[3].Members, []string{"alice", "bob"}) {
		t.Fatalf("groups %+v", groups)
	}
}

func TestResolveUser(t *testing.T) {
	users, _ := parsePasswd(strings.NewReader(testPasswd))
	groups, _ := parseGroup(strings.NewReader(testGroup))
	tests := []struct {
		spec    string
		want    *userInfo
		wantErr string
	}{
		{spec: "root", want: &userInfo{Name: "root", UID: 0, GID: 0, Home: "/root", Shell: "/bin/bash"}},
		{spec: "0", want: &userInfo{Name: "root", UID: 0, GID: 0, Home: "/root", Shell: "/bin/bash"}},
		{spec: "alice", want: &userInfo{Name: "alice", UID: 1000, GID: 1000, Groups: []uint32{100, 999, 10}, Home: "/home/alice", Shell: "/bin/bash"}},
		{spec: "1000", want: &userInfo{Name: "alice", UID: 1000, GID: 1000, Groups: []uint32{100, 999, 10}, Home: "/home/alice", Shell: "/bin/bash"}},
		{spec: "bob", want: &userInfo{Name: "bob", UID: 1001, GID: 100, Groups: []uint32{999, 10}, Home: "/home/bob", Shell: "/bin/sh"}},
		{spec: "alice:docker", want: &userInfo{Name: "alice", UID: 1000, GID: 999, Groups: []uint32{100, 999, 10}, Home: "/home/alice", Shell: "/bin/bash"}},
		{spec: "1000:5", want: &userInfo{Name: "alice", UID: 1000, GID: 5, Groups: []uint32{100, 999, 10}, Home: "/home/alice", Shell: "/bin/bash"}},
		{spec: "4242", want: &userInfo{UID: 4242, GID: 4242}},
		{spec: "4242:4343", want: &userInfo{UID: 4242, GID: 4343}},
		{spec: "mallory", wantErr: "unknown user"},
		{spec: "alice:nogroup-x", wantErr: "unknown group"},
		{spec: ":1", wantErr: "bad user"},
		{spec: "1:", wantErr: "bad user"},
		{spec: "99999999999", wantErr: "bad user"},
		{spec: "4294967295", wantErr: "bad user"},
	}
	for _, tt := range tests {
		got, err := resolveUser(tt.spec, users, groups)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: err %v, want %q", tt.spec, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%q = %+v, %v, want %+v", tt.spec, got, err, tt.want)
		}
	}
}

func TestLookupUserFiles(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "passwd"), []byte(testPasswd), 0o644)
	old := etcDir
	etcDir = dir
	defer func() { etcDir = old }()
	u, err := lookupUser("bob") // no group file: no supplementary groups
	if err != nil || u.UID != 1001 || u.GID != 100 || len(u.Groups) != 0 {
		t.Fatalf("bob = %+v %v", u, err)
	}
	if _, err := lookupUser("nobody-here"); err == nil {
		t.Fatal("found a user that does not exist")
	}
}

func TestMergeEnv(t *testing.T) {
	got := MergeEnv([]string{"A=1", "B=2", "junk"}, []string{"HOME=/h"}, []string{"B=3", "C=", "A=4=5"})
	want := []string{"A=4=5", "B=3", "HOME=/h", "C="}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("mergeEnv = %q, want %q", got, want)
	}
}
