#!/usr/bin/env bash
# Rewrite the wrapper modules beside this file for the versions in versions.env: kubernetes-<minor>/
# for KUBERNETES and for KUBERNETES_OLDEST, etcd/ and containerd/. A Kubernetes wrapper requires
# the release and replaces every staging module by its matching v0.X.Y (the release's own go.mod
# maps them to ./staging, which a dependency cannot use); it copies the release's `go` line,
# which also sets its GODEBUG defaults. go.sum is recorded. Run by `scripts/just pin-cluster`;
# the results are committed.
#   pin.sh             every wrapper
#   pin.sh v1.34.4 ... only the Kubernetes wrappers of these releases
set -euo pipefail
. "$(dirname "$0")/common.sh"
go_env "${AKRI_TRIO_HOME:-$HOME/.cache/akri-trio}/go"
export GOFLAGS="-mod=mod -buildvcs=false"

gomod_of() {  # module@version -> the path of its go.mod in the module cache
  "$GO" mod download -json "$1" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p'
}

write_mod() {  # dir module goline require-block [replace-block]
  mkdir -p "$here/$1"
  { printf 'module akri-trio.local/%s\n\n%s\n\n' "$2" "$3"
    printf 'require %s\n' "$4"
    [ -z "${5:-}" ] || printf '\nreplace (\n%s)\n' "$5"; } > "$here/$1/go.mod"
  rm -f "$here/$1/go.sum"
  (cd "$here/$1" && "$GO" mod tidy)
}

write_tools() {  # dir: the commands a Kubernetes wrapper builds, so `go mod tidy` keeps them
  { printf '//go:build tools\n\n'
    printf '// Package tools names the commands this wrapper module builds, so `go mod tidy` keeps them.\n'
    printf 'package tools\n\nimport (\n'
    for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
      printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"
    done
    printf ')\n'; } > "$here/$1/tools.go"
}

pin_kubernetes() {  # vX.Y.Z -> kubernetes-X.Y/
  local version=$1 k kmod goline staging replaces="" m dir
  k=${version#v}
  dir=$(kubernetes_wrapper "$version")
  kmod=$(gomod_of "k8s.io/kubernetes@$version")
  goline=$(grep -m1 '^go ' "$kmod")
  staging=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$kmod")
  for m in $staging; do replaces+=$'\t'"$m => $m v0.${k#1.}"$'\n'; done
  mkdir -p "$here/$dir"
  write_tools "$dir"
  write_mod "$dir" kubernetes "$goline" "k8s.io/kubernetes $version" "$replaces"
  echo "[pin] kubernetes $version in $dir/ (${staging//$'\n'/ })"
}

if [ $# -gt 0 ]; then
  for v in "$@"; do pin_kubernetes "$v"; done
  exit 0
fi
pin_kubernetes "$KUBERNETES"
pin_kubernetes "$KUBERNETES_OLDEST"
for d in "$here"/kubernetes-*/; do  # the wrapper of a release versions.env no longer names
  d=$(basename "$d")
  if [ "$d" != "$(kubernetes_wrapper "$KUBERNETES")" ] && [ "$d" != "$(kubernetes_wrapper "$KUBERNETES_OLDEST")" ]; then
    rm -r "${here:?}/$d"; echo "[pin] removed $d/"
  fi
done
write_mod etcd etcd "$(grep -m1 '^go ' "$(gomod_of "k8s.io/kubernetes@$KUBERNETES")")" \
  "go.etcd.io/etcd/server/v3 $ETCD"
cgoline=$(grep -m1 '^go ' "$(gomod_of "github.com/containerd/containerd/v2@$CONTAINERD")")
write_mod containerd containerd "$cgoline" "github.com/containerd/containerd/v2 $CONTAINERD"
echo "[pin] etcd $ETCD, containerd $CONTAINERD"
