#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl v1.20.2 from
# Debian's `kubernetes` source package, offline, with Debian's Go 1.19. No registry ships these binaries;
# Debian's orig tarball carries upstream's vendor/ tree, so nothing is fetched but Debian packages.
#
# kubectl is built too so the client matches the 1.20 server (no skew warnings) on any machine;
# Debian's kubernetes-client package would clash with other kubectl packages on /usr/bin/kubectl.
#
# Usage: build_k8s.sh OUT_DIR        (OUT_DIR/bin receives the five binaries)
# Idempotent: exits at once when all binaries are already in OUT_DIR/bin, builds only what is missing.
set -euo pipefail
OUT=${1:?usage: build_k8s.sh OUT_DIR}
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
DEB_VERSION="1.20.5+really1.20.2"
have_all() { for b in "${BINS[@]}"; do [ -x "$OUT/bin/$b" ] || return 1; done; }
if have_all; then echo "[build] cached in $OUT/bin"; exit 0; fi
[ "$(id -u)" = 0 ] || { echo "[build] needs root (apt-get)"; exit 1; }
# Two concurrent builds would trample each other's tree and GOCACHE: the second one waits.
mkdir -p "$OUT"
exec 9>"$OUT/.build.lock"
if ! flock -n 9; then echo "[build] another build is running; waiting for it"; flock 9; fi
if have_all; then echo "[build] cached in $OUT/bin"; exit 0; fi

step() { echo "[build] $(date +%T) $*"; }
export DEBIAN_FRONTEND=noninteractive
SRC_LIST=/etc/apt/sources.list.d/akri-trio-k8s-src.sources
if [ ! -f "$SRC_LIST" ]; then
  cat > "$SRC_LIST" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
TOOLS=(golang-1.19-go rsync golang-github-modern-go-reflect2-dev dpkg-dev ca-certificates)
if ! dpkg-query -W -f '${db:Status-Abbrev}\n' "${TOOLS[@]}" 2>/dev/null | grep -qv '^ii' \
   && [ "$(dpkg-query -W -f '${db:Status-Abbrev}\n' "${TOOLS[@]}" 2>/dev/null | wc -l)" = "${#TOOLS[@]}" ]; then
  step "Go 1.19 toolchain already installed"
else
  step "apt-get update + Go 1.19 toolchain"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${TOOLS[@]}" >/dev/null
fi

WORK="$OUT/src"
mkdir -p "$WORK" "$OUT/bin"
cd "$WORK"
TREE="$WORK/kubernetes-1.20.2"
if [ ! -d "$TREE/vendor" ]; then
  step "fetching Debian source package kubernetes ($DEB_VERSION)"
  apt-get source --download-only "kubernetes=${DEB_VERSION}-1.1+deb12u1" >/dev/null 2>&1 \
    || apt-get source --download-only kubernetes >/dev/null
  rm -rf "$TREE"
  tar xzf "kubernetes_${DEB_VERSION}.orig.tar.gz"
  # Vendored reflect2 1.0.1 breaks on Go >= 1.18; Debian's 1.0.2 is a drop-in fix.
  rm -rf "$TREE/vendor/github.com/modern-go/reflect2"
  mkdir -p "$TREE/vendor/github.com/modern-go/reflect2"
  cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go "$TREE/vendor/github.com/modern-go/reflect2/"
fi
cd "$TREE"
export PATH=/usr/lib/go-1.19/bin:$PATH GOPROXY=off GOFLAGS=-mod=vendor \
       KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=debian-1.20.2
unset GOFLAGS   # the upstream Makefile runs in GOPATH mode
for b in "${BINS[@]}"; do
  if [ -x "$OUT/bin/$b" ]; then continue; fi
  step "make WHAT=cmd/$b (minutes on 2 cores)"
  make WHAT="cmd/$b" >"$OUT/build-$b.log" 2>&1 || {
    echo "[build] FAILED: cmd/$b; last lines of $OUT/build-$b.log:"; tail -n 30 "$OUT/build-$b.log"; exit 1; }
  cp "_output/bin/$b" "$OUT/bin/$b.tmp" && mv "$OUT/bin/$b.tmp" "$OUT/bin/$b"
done
# Keep the protos we copy into protos/ reachable for `just protos` checks, drop the rest of the tree.
mkdir -p "$OUT/api"
cp vendor/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto "$OUT/api/deviceplugin-v1beta1.proto"
cp vendor/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto "$OUT/api/podresources-v1.proto"
step "done: $(ls "$OUT/bin" | tr '\n' ' ')"
