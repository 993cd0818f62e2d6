"""Starts a real cagebox daemon for the SDK's tests: the binaries of
`make build` (bin/cagebox, bin/cagebox-agent; CAGEBOX_BIN_DIR overrides), a
temporary --home with busybox images named busybox and default, the
container runtime, a TCP listener on loopback, and a local HTTP upstream
that sandboxes reach as http://api.sdk.test/ through the daemon's --resolve.
The TCP listener serves HTTPS with a certificate of a CA the test makes
(openssl); clients trust it with ca_cert (CAGEBOX_CA_CERT).
"""

import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import cagebox  # noqa: E402

UPSTREAM_HOST = "api.sdk.test"


def repo_root():
    d = HERE
    while d != "/":
        if os.path.exists(os.path.join(d, "go.mod")):
            return d
        d = os.path.dirname(d)
    raise RuntimeError("no go.mod above " + HERE)


def bin_dir():
    return os.environ.get("CAGEBOX_BIN_DIR") or os.path.join(repo_root(), "bin")


def skip_reason():
    """Why the daemon tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (the daemon makes namespaces, mounts, cgroups and nftables rules)"
    if not shutil.which("openssl"):
        return "openssl is not installed (the tests make the daemon's TLS certificate with it)"
    for b in ("cagebox", "cagebox-agent"):
        if not os.access(os.path.join(bin_dir(), b), os.X_OK):
            return f"{os.path.join(bin_dir(), b)} is missing: run `make build` at the repository root"
    return None


def make_pki(d):
    """A throw-away CA and a server certificate for 127.0.0.1 signed by it
    (openssl): the daemon's TCP listener serves HTTPS with them."""
    ca_key, ca, key, csr, cert = (os.path.join(d, n) for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = os.path.join(d, "server.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")

    def ssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", ca_key,
        "-out", ca, "-days", "2", "-subj", "/CN=cagebox sdk test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr,
        "-subj", "/CN=127.0.0.1")
    ssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
        "-extfile", ext)
    return ca, cert, key


def oci_layout_tar(rootfs, env=("PATH=/bin:/usr/bin", "FROM_IMPORT=1")):
    """An OCI image layout, as a tar (what `cagebox image import` takes), of
    one gzipped layer holding the tree at rootfs."""
    import gzip
    import hashlib
    import io
    import json
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        t.add(rootfs, arcname=".")
    layer_tar = raw.getvalue()
    layer = gzip.compress(layer_tar, mtime=0)

    def digest(b):
        return "sha256:" + hashlib.sha256(b).hexdigest()

    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": list(env)},
                         "rootfs": {"type": "layers", "diff_ids": [digest(layer_tar)]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(layer), "size": len(layer)}],
    }).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest)}]}).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for name, data in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", index),
                           ("blobs/sha256/" + digest(manifest)[7:], manifest), ("blobs/sha256/" + digest(config)[7:], config),
                           ("blobs/sha256/" + digest(layer)[7:], layer)]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    return out.getvalue()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"upstream says hello to {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Daemon:
    """One daemon in a temporary home; stop() removes what it made."""

    def __init__(self):
        self.bin = bin_dir()
        self.home = tempfile.mkdtemp(prefix="cbsdkpy")
        self.log_path = os.path.join(self.home, "daemon.log")
        self.env = dict(os.environ)
        # Our own nftables table, interface prefix and link pool: no clash
        # with another daemon on this host (values in the environment win).
        self.env.setdefault("CAGEBOX_NET_TABLE", "cagebox_sdkpy")
        self.env.setdefault("CAGEBOX_NET_IFPREFIX", "cbk")
        self.env.setdefault("CAGEBOX_LINK_POOL", "10.249.0.0/17")
        for k in ("CAGEBOX_HOST", "CAGEBOX_API_KEY", "CAGEBOX_CA_CERT"):
            self.env.pop(k, None)
        self.proc = None
        self.upstream = None

    def cli(self, *args):
        return subprocess.run([os.path.join(self.bin, "cagebox"), "--home", self.home, *args], env=self.env,
                              capture_output=True, text=True, timeout=120, check=True)

    def start(self):
        # Busybox images (well under a second) under both names, so
        # requests naming no image get "default".
        self.cli("image", "build", "busybox", "--vm", "no")
        images = os.path.join(self.home, "images")
        shutil.copytree(os.path.join(images, "busybox"), os.path.join(images, "default"), symlinks=True)
        meta = os.path.join(images, "default", "image.json")
        with open(meta) as f:
            m = f.read().replace('"name": "busybox"', '"name": "default"', 1)
        with open(meta, "w") as f:
            f.write(m)

        # Host files sandboxes may bind-mount (outside the daemon's home).
        self.mount_root = tempfile.mkdtemp(prefix="cbx-sdk-mnt")
        os.makedirs(os.path.join(self.mount_root, "code"))
        with open(os.path.join(self.mount_root, "code", "main.py"), "w") as f:
            f.write("print('hello')\n")

        self.upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
        threading.Thread(target=self.upstream.serve_forever, daemon=True).start()
        up_port = self.upstream.server_address[1]

        # The TCP listener serves HTTPS with a CA of the test's own.
        self.ca, cert, key = make_pki(tempfile.mkdtemp(prefix="pki", dir=self.home))
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [os.path.join(self.bin, "cagebox"), "--home", self.home, "daemon",
             "--agent", os.path.join(self.bin, "cagebox-agent"), "--default-runtime", "container",
             "--listen", f"127.0.0.1:{self.port}", "--tls-cert", cert, "--tls-key", key, "--resolve", f"{UPSTREAM_HOST}:80=127.0.0.1:{up_port}",
             "--mount-root", self.mount_root,
             "--ingress", f"127.0.0.1:{free_port()}", "--ingress-domain", "sdk.test",
             "--relay-discord-url", "wss://gateway.discord.gg:9/", "--resolve", "gateway.discord.gg:9=127.0.0.1:9"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.client = cagebox.Cagebox(home=self.home, timeout=120)
        deadline = time.time() + 30
        while True:
            try:
                self.client.health()
                return
            except cagebox.ConnectionFailed:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("daemon did not come up:\n" + self.log()) from None
                time.sleep(0.05)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-20000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                for sb in self.client.sandboxes():
                    try:
                        sb.remove()
                    except cagebox.CageboxError:
                        pass
            except cagebox.CageboxError:
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.upstream is not None:
            self.upstream.shutdown()
        shutil.rmtree(self.home, ignore_errors=True)
        if getattr(self, "mount_root", None):
            shutil.rmtree(self.mount_root, ignore_errors=True)
