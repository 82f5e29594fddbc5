# Sourced by build.sh and pin.sh: the pinned versions, and a Go environment that depends on
# nothing the machine sets except how to reach the module proxy (GOPROXY, GOSUMDB, GOINSECURE...).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

kubernetes_wrapper() {  # v1.34.4 -> kubernetes-1.34: one wrapper module per minor release
  local v=${1#v}
  echo "kubernetes-${v%.*}"
}

go_env() {
  local cache=$1
  GO=${AKRI_TRIO_GO:-$(command -v go || true)}
  [ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; }
  [ -n "$GO" ] || { echo "[build] needs a Go toolchain >= 1.21 on PATH (it fetches $GO_TOOLCHAIN itself)"; return 1; }
  unset GOROOT GOPATH GOBIN GOEXPERIMENT GOARCH GOOS GO111MODULE
  export GOTOOLCHAIN=$GO_TOOLCHAIN GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off \
         GOMODCACHE="$cache/mod" GOCACHE="$cache/build"
}
