#!/usr/bin/env bash
# Builds a local Kubernetes control plane from Go modules into DIR/bin (called by scripts/setup k8s):
# etcd (a wrapper module around etcdmain.Main), kube-apiserver, kube-controller-manager,
# kube-scheduler and the kubelet (a wrapper module with `tool` lines: `go install
# k8s.io/kubernetes/...@v` is refused because of its replace directives), kwok, and the pause
# program of a real node's pod sandboxes, kube-router (the node's NetworkPolicy agent) and
# kube-proxy (its Service routing), and CoreDNS (its cluster DNS). Copies kwok's stage
# definitions to DIR/kwok-stages.
# Versions come from the environment (infra/versions.env); GOMODCACHE/GOCACHE from the caller.
# PARTS (after DIR; default all): etcd kube kwok node registry services dns. `node` (the kubelet,
# pause, kube-router) alone upgrades a control plane built before the real node existed; `registry`
# (an OCI image registry, CNCF distribution, for `openforge tasks build --push`) one built before
# it; `services` (kube-proxy) one built before the node routed Services; `dns` (CoreDNS) one
# built before the node had a cluster DNS.
set -euo pipefail
DIR=$1; shift
PARTS=${*:-etcd kube kwok node registry services dns}
want() { [[ " $PARTS " == *" $1 "* ]]; }
# (a caller that predates the registry pin does not pass it: read it from the pins)
: "${REGISTRY_VERSION:=$(sed -n 's/^REGISTRY_VERSION=//p' "$(dirname "$0")/../versions.env")}"
: "${COREDNS_VERSION:=$(sed -n 's/^COREDNS_VERSION=//p' "$(dirname "$0")/../versions.env")}"
: "${K8S_VERSION:?}" "${ETCD_VERSION:?}" "${KWOK_VERSION:?}" "${KUBE_ROUTER_VERSION:?}" "${REGISTRY_VERSION:?}" "${COREDNS_VERSION:?}"
BIN=$DIR/bin SRC=$DIR/src
export GOMAXPROCS=${GOMAXPROCS:-2} GOFLAGS="${GOFLAGS:-} -p=1"
NICE="nice -n 19"
log() { echo "[$(date +%T)] $*"; }
mkdir -p "$BIN" "$SRC/etcd" "$SRC/kube" "$DIR/kwok-stages"

if want etcd; then
log "etcd $ETCD_VERSION"
cd "$SRC/etcd"
cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
printf 'module localetcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
$NICE go mod tidy
$NICE go build -trimpath -ldflags='-s -w' -o "$BIN/etcd" .
fi

if want kube || want node || want services; then
log "kube-apiserver, kube-controller-manager, kube-scheduler v$K8S_VERSION"
cd "$SRC/kube"
SV=v0.${K8S_VERSION#1.}
MOD=$(cat "$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')")
{
  printf 'module localkube\n\ngo %s\n\n' "$(echo "$MOD" | awk '$1=="go"{print $2}')"
  echo "$MOD" | awk '$1=="godebug"'
  printf '\nrequire k8s.io/kubernetes v%s\n\ntool (\n' "$K8S_VERSION"
  for t in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do printf '\tk8s.io/kubernetes/cmd/%s\n' $t; done
  printf ')\n\nreplace (\n'
  # every staging module k8s.io/kubernetes requires as v0.0.0, at the matching v0.x release
  # (k8s.io/sample-* are only in its replace block and are not served: left out)
  echo "$MOD" | awk '/^replace \(/{f=1;next} f&&/^\)/{f=0} f&&/=>/{print $1}' | while read -r m; do
    if echo "$MOD" | grep -qE "^\s+$m v0\.0\.0"; then printf '\t%s => %s %s\n' "$m" "$m" "$SV"; fi
  done
  printf ')\n'
} > go.mod
$NICE go mod tidy
minor=${K8S_VERSION#1.}; minor=${minor%%.*}; X=""
for k in gitVersion=v$K8S_VERSION gitMajor=1 gitMinor=$minor gitTreeState=clean; do
  X="$X -X k8s.io/component-base/version.$k -X k8s.io/client-go/pkg/version.$k"
done
want kube && built="kube-scheduler kube-controller-manager kube-apiserver" || built=""
want node && built="$built kubelet"
want services && built="$built kube-proxy"
for b in $built; do
  $NICE go build -trimpath -ldflags="-s -w $X" -o "$BIN/$b" "k8s.io/kubernetes/cmd/$b"
  log "built $b"
done
fi

if want node; then
  # The pod sandbox's process (the "pause" container): no image registry is reachable, so the
  # node's sandbox image is made locally from this static program (infra/local/kube_node.py).
  log "pause"
  mkdir -p "$SRC/pause"; cd "$SRC/pause"
  cat > main.go <<'GO'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

// Holds the pod's namespaces until it is told to stop; reaps nothing (no shared PID namespace).
func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
GO
  printf 'module localpause\n\ngo 1.26.0\n' > go.mod
  CGO_ENABLED=0 $NICE go build -trimpath -ldflags='-s -w' -o "$BIN/pause" .
  # The NetworkPolicy agent: kube-router, its firewall only (no routing, no service proxy)
  log "kube-router $KUBE_ROUTER_VERSION"
  GOBIN=$BIN $NICE go install -trimpath -ldflags='-s -w' \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
  touch "$BIN/.kube-router-$KUBE_ROUTER_VERSION"
fi

if want registry; then
log "registry (distribution) $REGISTRY_VERSION"
GOBIN=$BIN CGO_ENABLED=0 $NICE go install -trimpath -ldflags='-s -w' \
  "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
touch "$BIN/.registry-$REGISTRY_VERSION"
fi

if want dns; then
# The cluster DNS: CoreDNS with only the plugins the node's Corefile uses (infra/local/kube_dns.py),
# the way CoreDNS documents a build of chosen plugins (its directive list set before main).
log "coredns $COREDNS_VERSION"
mkdir -p "$SRC/dns"; cd "$SRC/dns"
cat > main.go <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	"github.com/coredns/coredns/coremain"
)

func init() {
	dnsserver.Directives = []string{"bind", "health", "ready", "errors", "log", "kubernetes", "forward"}
}

func main() { coremain.Run() }
GO
printf 'module localdns\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" > go.mod
$NICE go mod tidy
CGO_ENABLED=0 $NICE go build -trimpath -ldflags='-s -w' -o "$BIN/coredns" .
touch "$BIN/.coredns-$COREDNS_VERSION"
fi

if want kwok; then
log "kwok $KWOK_VERSION"
GOBIN=$BIN $NICE go install -trimpath -ldflags='-s -w' "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
STAGES=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')/kustomize/stage
cp -r "$STAGES"/. "$DIR/kwok-stages/"
chmod -R u+w "$DIR/kwok-stages"
fi
ls -la "$BIN"
log "done"
