# akri-trio tasks. `scripts/just <recipe>` bootstraps .venv first on a fresh machine. Recipes run
# from the repository root, where Python finds the development package akri_trio_dev (not installed).
set shell := ["bash", "-euo", "pipefail", "-c"]

# list recipes
default:
    @just --list

# end-to-end demo on a real local cluster
demo:
    python -m akri_trio_dev.demo

# lint, types, and the whole test suite (real control plane and node included)
test: lint test-deps
    python -m pytest -q -p no:cacheprovider {{ if env("CI", "") != "" { "-ra" } else { "" } }}

# Replaces the running cluster (run it when no one else uses it): the oldest release (built once,
# ~20 min) with 3 nodes, `-m "node or compat"` on it (tests of features it lacks skip, naming it),
# then the newest back as it was (its node count; nothing if no cluster ran). docs/local-cluster.md
# the release check: node, deploy and DRA tests on the oldest supported Kubernetes (versions.env)
test-compat: test-deps
    #!/usr/bin/env bash
    set -euo pipefail
    cli() { python -m akri_trio_dev cluster "$@"; }
    was_running=$(cli status >/dev/null 2>&1 && echo 1 || echo 0)
    nodes=$( (eval "$(cli env 2>/dev/null || true)"; echo "${AKRI_TRIO_NODES:-}") | wc -w)
    restore() {
      cli down
      if [ "$nodes" -gt 0 ]; then cli up --version newest --nodes "$nodes";
      elif [ "$was_running" = 1 ]; then cli up --version newest; fi
    }
    cli down
    trap restore EXIT
    start=$SECONDS
    cli up --version oldest --nodes 3
    up=$((SECONDS - start))
    AKRI_TRIO_K8S_VERSION=oldest python -m pytest -q -p no:cacheprovider -ra -m "node or compat"
    echo "test-compat: up (and build) ${up}s, tests $((SECONDS - start - up))s"

# Debian packages the tests use as real peers (avahi: an independent mDNS responder; chromium:
# the browser the dashboard's page is tested in)
test-deps:
    @{ command -v avahi-daemon && command -v chromium; } >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends avahi-daemon chromium >/dev/null; }

# ruff (lint + format) and mypy --strict
lint:
    ruff check .
    ruff format --check .
    mypy

# benchmarks on the real local cluster; results with ratios are appended to bench/RESULTS.md
bench:
    python -m akri_trio_dev cluster up
    python -m bench.allocate_latency
    python -m bench.discovery_latency
    python -m bench.scale

# build the container image offline (podman + a debootstrap base) and import it into every node
image:
    python -m akri_trio_dev.cluster.image

# pin the image's Python packages: constraints.txt from a fresh venv holding only the runtime deps
lock:
    #!/usr/bin/env bash
    set -euo pipefail
    tmp=$(mktemp -d); trap 'rm -rf "$tmp" build' EXIT
    python -m venv "$tmp/venv"
    "$tmp/venv/bin/pip" install -q . 'setuptools>=77'
    { echo "# The image's Python packages, pinned (just lock). setuptools is the build backend."
      "$tmp/venv/bin/pip" freeze --all --exclude pip --exclude akri-trio; } > constraints.txt

# start the local control plane and a Ready node (builds Kubernetes, etcd, containerd once)
cluster-up:
    python -m akri_trio_dev cluster up --node

# after editing akri_trio_dev/cluster/gobuild/versions.env: rewrite the wrapper modules' go.mod/go.sum
pin-cluster:
    bash akri_trio_dev/cluster/gobuild/pin.sh

# stop everything cluster-up started and clean up
cluster-down:
    python -m akri_trio_dev cluster down

# regenerate the protobuf / purerpc / grpcio stubs from protos/
protos:
    python -m akri_trio.rpc.generate
