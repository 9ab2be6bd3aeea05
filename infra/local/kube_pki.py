"""The local control plane's certificates: a cluster CA and what it signs (the API server's
serving certificate; the admin's, the real node's kubelet's, kube-proxy's and the cluster
DNS's client certificates), a separate front-proxy CA, and the service-account key pair."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from infra.local.kube_dns import USER as DNS_USER
from schemas.errors import ServiceError

REAL_NODE = "openforge-node-0"  # the real node's name (its kubelet's certificate names it)


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise ServiceError("openssl not found on PATH: install it (apt-get install openssl)")
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ServiceError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


def _sign(pki: Path, name: str, subject: str, ext: str, ca: str = "ca") -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=pki)  # fmt: skip
    (pki / f"{name}.ext").write_text(ext + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "30",
             "-extfile", f"{name}.ext", cwd=pki)  # fmt: skip


def make_pki(pki: Path) -> None:
    """A cluster CA with an apiserver and an admin certificate, the real node's kubelet,
    kube-proxy and cluster DNS certificates, a separate front-proxy CA (the aggregation layer's,
    which must not be the client CA), and a service-account key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    for ca, cn in (("ca", "openforge-local-ca"), ("front-proxy-ca", "front-proxy-ca")):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
                 "-out", f"{ca}.crt", "-days", "30", "-subj", f"/CN={cn}", cwd=pki)  # fmt: skip
    sans = ",".join(
        ["IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes"]
        + [f"DNS:kubernetes.default{s}" for s in ("", ".svc", ".svc.cluster.local")]
    )
    _sign(pki, "apiserver", "/CN=kube-apiserver",
          f"subjectAltName={sans}\nextendedKeyUsage=serverAuth")  # fmt: skip
    _sign(pki, "admin", "/O=system:masters/CN=admin", "extendedKeyUsage=clientAuth")
    # The real node's own credentials: its kubelet as the Node authorizer's node (and under
    # NodeRestriction), kube-proxy as the user the bootstrap RBAC's system:node-proxier binds.
    _sign(pki, "node-0", f"/O=system:nodes/CN=system:node:{REAL_NODE}",
          "extendedKeyUsage=clientAuth")  # fmt: skip
    _sign(pki, "kube-proxy", "/CN=system:kube-proxy", "extendedKeyUsage=clientAuth")
    _sign(pki, "cluster-dns", f"/CN={DNS_USER}", "extendedKeyUsage=clientAuth")  # its own RBAC
    _sign(pki, "front-proxy-client", "/CN=front-proxy-client", "extendedKeyUsage=clientAuth",
          ca="front-proxy-ca")  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
