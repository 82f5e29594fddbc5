#!/usr/bin/env bash
# Build one component of the local test cluster from Go modules, at a version pinned in
# versions.env, with its wrapper module beside this file (its go.sum pins every dependency):
#   kubernetes  kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
#               (KUBERNETES or KUBERNETES_OLDEST, from kubernetes-<minor>/)
#   etcd        etcd
#   containerd  containerd containerd-shim-runc-v2 ctr
# No registry ships these binaries; the Go module proxy ships their source.
#
# Usage: build.sh COMPONENT OUT_DIR CACHE_DIR [VERSION]
#   OUT_DIR/bin receives the binaries; CACHE_DIR holds the module and build caches; VERSION
#   (default: the component's newest pinned one) must be one a wrapper module pins.
# Idempotent: exits at once when every binary is in OUT_DIR/bin. Two builds of one OUT_DIR
# serialise on a lock.
set -euo pipefail
COMPONENT=${1:?usage: build.sh COMPONENT OUT_DIR CACHE_DIR}
OUT=${2:?usage: build.sh COMPONENT OUT_DIR CACHE_DIR}
CACHE=${3:?usage: build.sh COMPONENT OUT_DIR CACHE_DIR}
. "$(dirname "$0")/common.sh"
VERSION=${4:-}

version_x() {  # the -X flags that make a binary report its release
  local v=$1 pkg flags="" minor
  minor=${v#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=$v -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

case $COMPONENT in
  kubernetes)
    VERSION=${VERSION:-$KUBERNETES}; MODULE=k8s.io/kubernetes; WRAPPER=$(kubernetes_wrapper "$VERSION")
    BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
    PKGS=(); for b in "${BINS[@]}"; do PKGS+=("k8s.io/kubernetes/cmd/$b"); done
    LDFLAGS="-s -w $(version_x "$VERSION")"; TAGS=""; export CGO_ENABLED=0 ;;
  etcd)
    VERSION=${VERSION:-$ETCD}; MODULE=go.etcd.io/etcd/server/v3; WRAPPER=etcd
    BINS=(etcd); PKGS=(go.etcd.io/etcd/server/v3)
    LDFLAGS="-s -w"; TAGS=""; export CGO_ENABLED=0 ;;
  containerd)
    VERSION=${VERSION:-$CONTAINERD}; MODULE=github.com/containerd/containerd/v2; WRAPPER=containerd
    BINS=(containerd containerd-shim-runc-v2 ctr)
    PKGS=(); for b in "${BINS[@]}"; do PKGS+=("github.com/containerd/containerd/v2/cmd/$b"); done
    LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=$VERSION"
    LDFLAGS+=" -X github.com/containerd/containerd/v2/version.Revision=$VERSION"
    TAGS="no_btrfs"; export CGO_ENABLED=0 ;;
  *) echo "[build] unknown component $COMPONENT"; exit 2 ;;
esac

# The wrapper must pin exactly this version (a release not in versions.env has none).
if ! grep -qx "require $MODULE $VERSION" "$here/$WRAPPER/go.mod" 2>/dev/null; then
  echo "[build] no wrapper module pins $MODULE $VERSION (versions.env and scripts/just pin-cluster)"
  exit 2
fi

have_all() { for b in "${BINS[@]}"; do [ -x "$OUT/bin/$b" ] || return 1; done; }
if have_all; then exit 0; fi
mkdir -p "$OUT" "$CACHE"
exec 9>"$OUT/.build.lock"
if ! flock -n 9; then echo "[build] another build of $OUT is running; waiting for it"; flock 9; fi
if have_all; then exit 0; fi

go_env "$CACHE"
say() { echo "[build] $(date +%T) $*"; }
say "$COMPONENT $VERSION: go build ${BINS[*]} with $GO_TOOLCHAIN (downloads modules on a new machine)"
tmp="$OUT/bin.tmp"
rm -rf "$tmp"; mkdir -p "$tmp"
# One go build per binary, each announced as "step N/TOTAL: NAME" (the runner shows progress and
# an ETA from these lines); later steps reuse what the first compiled, through the build cache.
for i in "${!PKGS[@]}"; do
  say "step $((i + 1))/${#PKGS[@]}: ${BINS[$i]}"
  (cd "$here/$WRAPPER" && "$GO" build -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" -o "$tmp/" "${PKGS[$i]}")
done
# etcd's main package is its module root, go.etcd.io/etcd/server/v3: go build names the binary
# "server" (a major-version suffix is skipped).
if [ "$COMPONENT" = etcd ]; then mv "$tmp/server" "$tmp/etcd"; fi
mkdir -p "$OUT/bin"
for b in "${BINS[@]}"; do mv "$tmp/$b" "$OUT/bin/$b"; done
rmdir "$tmp"
say "$COMPONENT: done ($(du -sh "$OUT/bin" | cut -f1))"
