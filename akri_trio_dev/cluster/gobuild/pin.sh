#!/usr/bin/env bash
# Rewrite the wrapper modules (kubernetes/, etcd/, containerd/ beside this file) for the versions
# in versions.env: require the release, replace every Kubernetes staging module by its matching
# v0.X.Y (the release's own go.mod maps them to ./staging, which a dependency cannot use), and
# record go.sum. Run by `scripts/just pin-cluster`; the results are committed.
set -euo pipefail
. "$(dirname "$0")/common.sh"
go_env "${AKRI_TRIO_HOME:-$HOME/.cache/akri-trio}/go"
export GOFLAGS="-mod=mod -buildvcs=false"

gomod_of() {  # module@version -> the path of its go.mod in the module cache
  "$GO" mod download -json "$1" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p'
}

k=${KUBERNETES#v}
kmod=$(gomod_of "k8s.io/kubernetes@$KUBERNETES")
goline=$(grep -m1 '^go ' "$kmod")
staging=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$kmod")

write_mod() {  # dir module goline require-block [replace-block]
  mkdir -p "$here/$1"
  { printf 'module akri-trio.local/%s\n\n%s\n\n' "$2" "$3"
    printf 'require %s\n' "$4"
    [ -z "${5:-}" ] || printf '\nreplace (\n%s)\n' "$5"; } > "$here/$1/go.mod"
  rm -f "$here/$1/go.sum"
  (cd "$here/$1" && "$GO" mod tidy)
}

replaces=""
for m in $staging; do replaces+=$'\t'"$m => $m v0.${k#1.}"$'\n'; done
write_mod kubernetes kubernetes "$goline" "k8s.io/kubernetes $KUBERNETES" "$replaces"
write_mod etcd etcd "$goline" "go.etcd.io/etcd/server/v3 $ETCD"
cgoline=$(grep -m1 '^go ' "$(gomod_of "github.com/containerd/containerd/v2@$CONTAINERD")")
write_mod containerd containerd "$cgoline" "github.com/containerd/containerd/v2 $CONTAINERD"
echo "[pin] kubernetes $KUBERNETES (${staging//$'\n'/ }), etcd $ETCD, containerd $CONTAINERD"
