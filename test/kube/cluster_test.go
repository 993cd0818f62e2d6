// Package kube runs cagebox on Kubernetes for real, on one machine: a
// control plane (kube-apiserver and etcd, started by controller-runtime's
// envtest from the binaries scripts/kube-testbin.sh builds), three node
// agents (`cagebox node`, each in its own network namespace with its own
// address and home, registering through a Lease), the fleet controller
// (`cagebox controller`) reconciling the agent-sandbox CRDs from
// deploy/crds, and an HTTPS upstream the sandboxes reach through their
// node's egress gateway. The node agents and the controller authenticate
// as the service accounts of deploy/rbac.yaml, so the RBAC we ship is
// what the test runs with.
package kube

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	rbacv1 "k8s.io/api/rbac/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/cagebox/cagebox/client"
	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/kube/fleet"
	"github.com/cagebox/cagebox/internal/kube/kubetest"
	"github.com/cagebox/cagebox/internal/syncbuf"
	"github.com/cagebox/cagebox/internal/testbin"
	"github.com/cagebox/cagebox/internal/testpki"
	"github.com/cagebox/cagebox/internal/vmimage"
)

// The test network: a bridge on the host with the control plane, the
// upstream and the controller's side; one namespace per node agent.
const (
	bridgeName = "cbkbr0"
	bridgeIP   = "10.243.0.1"
	netPrefix  = "10.243.0."
	fleetNS    = fleet.DefaultNamespace
	domain     = "fleet.test"
	upHost     = "api.upstream.test"
	otherHost  = "other.upstream.test"
)

var binDir string

// testScheme is the controller's scheme plus RBAC (the test applies
// deploy/rbac.yaml).
var testScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(sandboxv1beta1.AddToScheme(s))
	utilruntime.Must(extv1beta1.AddToScheme(s))
	return s
}()

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	if os.Geteuid() != 0 {
		fmt.Println("kube: skipped, needs root (network namespaces, sandboxes)")
		os.Exit(0)
	}
	if _, why := kubetest.Assets(); why != "" {
		if os.Getenv("CAGEBOX_REQUIRE_KUBE") == "1" {
			fmt.Println("kube: CAGEBOX_REQUIRE_KUBE=1 but " + why)
			os.Exit(1)
		}
		fmt.Println("kube: skipped, " + why)
		os.Exit(0)
	}
	dir, err := testbin.Build()
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// run runs a host command and fails the test on error.
func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// quiet runs a cleanup command, ignoring errors.
func quiet(name string, args ...string) { _ = exec.Command(name, args...).Run() }

// node is one node agent.
type node struct {
	name, netns, addr, home string
	endpoint, ingress       string
	env                     []string
	args                    []string
	mu                      sync.Mutex
	cmd                     *exec.Cmd
	log                     syncbuf.Buffer
	done                    <-chan struct{}
}

// cluster is the whole fleet of one test.
type cluster struct {
	t         testing.TB
	dir       string
	env       *envtest.Environment
	cfg       *rest.Config
	k         ctrlclient.Client // cluster admin
	keyFile   string
	key       string
	pki       *testpki.PKI
	caFile    string
	nodes     []*node
	ctrlLog   syncbuf.Buffer
	ingress   string // the controller's fleet ingress address
	router    string // the controller's sandbox router (--router-listen)
	up        *upstream
	nodeKubes map[string]string // kubeconfig file per identity
}

// newCluster starts the control plane, the network, n node agents and the
// controller. Everything is undone by t.Cleanup, also on failure.
func newCluster(t testing.TB, n int, nodeArgs ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), nodeKubes: map[string]string{}}
	c.network(n)
	c.controlPlane()
	c.applyManifests()
	c.credentials()
	c.up = newUpstream(t, c.pki, upHost, otherHost)
	for i := 1; i <= n; i++ {
		c.startNode(i, nodeArgs...)
	}
	c.startController()
	c.waitNodes(n)
	return c
}

// network makes the bridge and one namespace per node, each with a veth
// into the bridge and its own address.
func (c *cluster) network(n int) {
	t := c.t
	cleanupNet := func() {
		for i := 1; i <= 9; i++ {
			quiet("ip", "netns", "del", fmt.Sprintf("cbk-n%d", i))
			quiet("ip", "link", "del", fmt.Sprintf("cbkv%d", i))
		}
		quiet("ip", "link", "del", bridgeName)
	}
	cleanupNet() // a run killed mid-way may have left them
	t.Cleanup(cleanupNet)
	run(t, "ip", "link", "add", bridgeName, "type", "bridge")
	run(t, "ip", "addr", "add", bridgeIP+"/24", "dev", bridgeName)
	run(t, "ip", "link", "set", bridgeName, "up")
	for i := 1; i <= n; i++ {
		ns, hv := fmt.Sprintf("cbk-n%d", i), fmt.Sprintf("cbkv%d", i)
		run(t, "ip", "netns", "add", ns)
		run(t, "ip", "link", "add", hv, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run(t, "ip", "link", "set", hv, "master", bridgeName)
		run(t, "ip", "link", "set", hv, "up")
		run(t, "ip", "-n", ns, "addr", "add", fmt.Sprintf("%s%d/24", netPrefix, 10+i), "dev", "eth0")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
		run(t, "ip", "-n", ns, "route", "add", "default", "via", bridgeIP)
	}
}

// freePortOn picks a free TCP port on addr.
func freePortOn(t testing.TB, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func (c *cluster) controlPlane() {
	t := c.t
	start := time.Now()
	c.env, c.cfg = kubetest.Env(t, func(e *envtest.Environment) {
		e.Scheme = testScheme
		// The apiserver listens on the bridge, where the node agents
		// reach it (its serving certificate names that address too).
		api := e.ControlPlane.GetAPIServer()
		api.SecureServing.ListenAddr.Address = bridgeIP
		api.SecureServing.ListenAddr.Port = freePortOn(t, bridgeIP)
	})
	t.Logf("control plane with the CRDs ready in %v", time.Since(start).Round(time.Millisecond))
	k, err := ctrlclient.New(c.cfg, ctrlclient.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	c.k = k
}

// applyManifests creates the namespace and the RBAC of deploy/ (the
// identities the node agents and the controller run as).
func (c *cluster) applyManifests() {
	t := c.t
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fleetNS}}
	if err := c.k.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, o := range decodeManifest(t, "../../deploy/rbac.yaml") {
		if err := c.k.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("rbac %T %s: %v", o, o.GetName(), err)
		}
	}
}

// decodeManifest reads a multi-document YAML file of RBAC objects (the
// ServiceAccounts in it are skipped: envtest authenticates the accounts'
// user names by client certificate instead of their tokens).
func decodeManifest(t testing.TB, file string) []ctrlclient.Object {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(clientgoscheme.Scheme)
	var out []ctrlclient.Object
	rd := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := rd.Read()
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 || strings.TrimSpace(strings.ReplaceAll(string(doc), "---", "")) == "" {
			continue
		}
		obj, _, err := codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			continue
		case *rbacv1.Role, *rbacv1.RoleBinding, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			out = append(out, o.(ctrlclient.Object))
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no RBAC objects", file)
	}
	return out
}

// kubeconfig writes a kubeconfig for the service account sa (a client
// certificate for system:serviceaccount:NS:SA, which RBAC matches as that
// account).
func (c *cluster) kubeconfig(sa string) string {
	t := c.t
	if f, ok := c.nodeKubes[sa]; ok {
		return f
	}
	u, err := c.env.AddUser(envtest.User{Name: "system:serviceaccount:" + fleetNS + ":" + sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + fleetNS}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(c.dir, sa+".kubeconfig")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c.nodeKubes[sa] = f
	return f
}

// credentials makes the fleet admin key and the CA of the node APIs.
func (c *cluster) credentials() {
	t := c.t
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	c.key = "cbk_fleet_" + hex.EncodeToString(b)
	c.keyFile = filepath.Join(c.dir, "admin.key")
	if err := os.WriteFile(c.keyFile, []byte(c.key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pki, err := testpki.New(2*time.Hour, "cagebox fleet test")
	if err != nil {
		t.Fatal(err)
	}
	c.pki = pki
	c.caFile = filepath.Join(c.dir, "node-ca.pem")
	if err := os.WriteFile(c.caFile, pki.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
}

// startNode starts node agent i in its namespace.
func (c *cluster) startNode(i int, extra ...string) {
	t := c.t
	n := &node{name: fmt.Sprintf("n%d", i), netns: fmt.Sprintf("cbk-n%d", i), addr: fmt.Sprintf("%s%d", netPrefix, 10+i)}
	home, err := os.MkdirTemp("", "cbxk")
	if err != nil {
		t.Fatal(err)
	}
	n.home = home
	c.images(home)
	certPEM, keyPEM, err := c.pki.IssuePEM(2*time.Hour, []string{"*." + domain, domain}, []net.IP{net.ParseIP(n.addr)})
	if err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(home, "node.crt"), filepath.Join(home, "node.key")
	if err := os.WriteFile(cert, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	n.endpoint = "https://" + n.addr + ":7443"
	n.ingress = n.addr + ":8443"
	n.args = append([]string{
		"--net=/run/netns/" + n.netns, "--",
		filepath.Join(binDir, "cagebox"), "--home", home, "node",
		"--agent", filepath.Join(binDir, "cagebox-agent"),
		"--default-runtime", kubeRuntime(),
		"--kubeconfig", c.kubeconfig("cagebox-node"),
		"--node-name", n.name, "--namespace", fleetNS,
		"--listen", n.addr + ":7443", "--tls-cert", cert, "--tls-key", key,
		"--advertise-url", n.endpoint,
		"--ingress", n.ingress, "--ingress-domain", domain, "--ingress-cert", cert, "--ingress-key", key,
		"--advertise-ingress", n.ingress,
		"--admin-key-file", c.keyFile,
		"--lease-duration", "4s",
	}, c.up.daemonArgs(upHost, otherHost)...)
	n.args = append(n.args, extra...)
	// Each node owns its nftables table, interface prefix and link pool
	// (the locks under /run/cagebox are host-wide, whatever the netns).
	n.env = append(os.Environ(),
		fmt.Sprintf("CAGEBOX_NET_TABLE=cagebox_k%d", i),
		fmt.Sprintf("CAGEBOX_NET_IFPREFIX=ck%d", i),
		fmt.Sprintf("CAGEBOX_LINK_POOL=10.24%d.0.0/16", 3+i), // 10.244–10.246 (10.243 is the bridge)
	)
	c.nodes = append(c.nodes, n)
	n.start(t)
	t.Cleanup(func() {
		n.stop(syscall.SIGTERM)
		if t.Failed() || os.Getenv("CAGEBOX_KUBE_LOGS") != "" {
			t.Logf("node %s log:\n%s", n.name, n.logText())
		}
		c.sweepNode(n)
		os.RemoveAll(home)
	})
}

// kubeRuntime is the runtime the nodes' sandboxes use by default
// (CAGEBOX_E2E_RUNTIME, default container).
func kubeRuntime() string {
	if r := os.Getenv("CAGEBOX_E2E_RUNTIME"); r != "" {
		return r
	}
	return "container"
}

// images gives a node home the busybox image and the shared Debian one.
func (c *cluster) images(home string) {
	t := c.t
	cache := &image.Cache{Dir: filepath.Join(home, "images")}
	if _, err := cache.BuildBusybox(context.Background(), "busybox"); err != nil {
		t.Fatal(err)
	}
	shared := os.Getenv("CAGEBOX_TEST_IMAGES")
	if shared == "" {
		t.Skip("CAGEBOX_TEST_IMAGES is not set (scripts/test.sh sets it after building the Debian image)")
	}
	if _, err := (&image.Cache{Dir: shared}).Get("default"); err != nil {
		t.Skipf("no Debian image in %s: %v", shared, err)
	}
	if err := os.Symlink(filepath.Join(shared, "default"), filepath.Join(home, "images", "default")); err != nil {
		t.Fatal(err)
	}
	if vm := vmimage.TestCacheDir(); fileExists(filepath.Join(vm, "kernel")) {
		if err := os.Symlink(vm, filepath.Join(home, "vm")); err != nil {
			t.Fatal(err)
		}
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func (n *node) start(t testing.TB) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cmd := exec.Command("nsenter", n.args...)
	cmd.Env = n.env
	cmd.Stdout, cmd.Stderr = &n.log, &n.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.cmd = cmd
	n.done = waitDone(cmd)
}

func (n *node) logText() string { return n.log.String() }

// waitDone reaps cmd in the background; the channel closes when it ends.
func waitDone(cmd *exec.Cmd) <-chan struct{} {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return done
}

// stopProcess signals a started process and waits for it (SIGKILL after
// 15 s).
func stopProcess(cmd *exec.Cmd, done <-chan struct{}, sig syscall.Signal) {
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// stop signals the node agent and waits (SIGKILL after 15 s).
func (n *node) stop(sig syscall.Signal) {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.cmd = nil
	n.mu.Unlock()
	if cmd != nil {
		stopProcess(cmd, done, sig)
	}
}

// api is an admin client of the node's API, as the controller holds.
func (c *cluster) api(n *node) *client.Client {
	cl, err := client.NewTCP(n.endpoint, c.key, client.Options{CACertFile: c.caFile})
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// sweepNode removes whatever sandboxes a node still has (after a failed
// test), through a fresh daemon on its home, so no sandbox outlives the
// test.
func (c *cluster) sweepNode(n *node) {
	args := []string{"--net=/run/netns/" + n.netns, "--", filepath.Join(binDir, "cagebox"), "--home", n.home, "daemon",
		"--agent", filepath.Join(binDir, "cagebox-agent")}
	cmd := exec.Command("nsenter", args...)
	cmd.Env = n.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return
	}
	done := waitDone(cmd)
	defer stopProcess(cmd, done, syscall.SIGTERM)
	u := client.Unix(filepath.Join(n.home, "cagebox.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		if _, err := u.Health(ctx); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if l, err := u.List(ctx); err == nil {
		for _, s := range l {
			_ = u.Remove(ctx, s.ID)
		}
	}
}

func (c *cluster) startController(extra ...string) {
	t := c.t
	c.ingress = "127.0.0.1:" + freePortOn(t, "127.0.0.1")
	c.router = "127.0.0.1:" + freePortOn(t, "127.0.0.1")
	args := append([]string{"controller",
		"--kubeconfig", c.kubeconfig("cagebox-controller"),
		"--namespace", fleetNS,
		"--node-key-file", c.keyFile, "--node-ca", c.caFile,
		"--ingress", c.ingress, "--ingress-domain", domain,
		"--resync", "1s",
		"--router-listen", c.router,
		"--image-map", "us-central1-docker.pkg.dev/k8s-staging-images/agent-sandbox/python-runtime-sandbox=default",
	}, extra...)
	cmd := exec.Command(filepath.Join(binDir, "cagebox"), args...)
	cmd.Stdout, cmd.Stderr = &c.ctrlLog, &c.ctrlLog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := waitDone(cmd)
	t.Cleanup(func() {
		stopProcess(cmd, done, syscall.SIGTERM)
		if t.Failed() || os.Getenv("CAGEBOX_KUBE_LOGS") != "" {
			t.Logf("controller log:\n%s", c.ctrlLog.String())
		}
	})
}

// waitNodes waits until n node leases are live.
func (c *cluster) waitNodes(n int) {
	t := c.t
	deadline := time.Now().Add(60 * time.Second)
	for {
		var l coordinationv1.LeaseList
		err := c.k.List(context.Background(), &l, ctrlclient.InNamespace(fleetNS), ctrlclient.HasLabels{fleet.NodeLabel})
		live := 0
		if err == nil {
			for _, ls := range l.Items {
				// Live, and past the first report (which may come before
				// the runtimes are probed).
				if capa, err := fleet.ParseCapacity(ls.Annotations[fleet.AnnCapacity]); err == nil && ls.Spec.RenewTime != nil && capa.Offers(kubeRuntime(), 0) {
					live++
				}
			}
		}
		if live >= n {
			return
		}
		if time.Now().After(deadline) {
			for _, nd := range c.nodes {
				t.Logf("node %s log:\n%s", nd.name, nd.logText())
			}
			t.Fatalf("%d of %d node leases live after 60 s (list: %v)", live, n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// upstream is an HTTPS server on the bridge that records what it got.
type upstream struct {
	mu     sync.Mutex
	seen   []string
	port   int
	caFile string
}

func newUpstream(t testing.TB, pki *testpki.PKI, names ...string) *upstream {
	t.Helper()
	certPEM, keyPEM, err := pki.IssuePEM(time.Hour, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{}
	ln, err := tls.Listen("tcp", bridgeIP+":0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, fmt.Sprintf("%s %s %s auth=%s", r.Method, r.Host, r.URL.Path, r.Header.Get("Authorization")))
		u.mu.Unlock()
		fmt.Fprintf(w, "hello from upstream %s %s\n", r.Host, r.URL.Path)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	u.port = ln.Addr().(*net.TCPAddr).Port
	u.caFile = filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(u.caFile, pki.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u *upstream) daemonArgs(names ...string) []string {
	args := []string{"--upstream-ca", u.caFile}
	for _, n := range names {
		args = append(args, "--resolve", fmt.Sprintf("%s:443=%s:%d", n, bridgeIP, u.port))
	}
	return args
}

func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}
