"""The README's demo: a real local cluster, Akri's CRDs, and a debugEcho Configuration.

Runs as `scripts/just demo` (or `python -m akri_trio.demo`). Each step prints what it does, and
the last shows the result the way a user would look at it: with kubectl.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "k8s" / "examples" / "debug-echo.yaml"


def _step(title: str) -> None:
    print(f"\n==> {title}", flush=True)


def _cluster(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "akri_trio", "cluster", *args], stdout=subprocess.PIPE, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"akri-trio cluster {' '.join(args)} failed ({proc.returncode})")
    return proc.stdout


def main() -> int:
    _step("starting a real local Kubernetes (etcd, apiserver, controller-manager, scheduler)")
    print(_cluster("up"), end="")
    env = dict(line.split("=", 1) for line in _cluster("env").splitlines() if "=" in line)
    kubectl_env = {**os.environ, "KUBECONFIG": env["KUBECONFIG"]}

    def kubectl(*args: str) -> None:
        print(f"$ kubectl {' '.join(args)}", flush=True)
        subprocess.run([env["KUBECTL"], *args], env=kubectl_env, check=True)

    _step("installing the akri.sh/v0 CRDs")
    kubectl("apply", "-f", str(REPO / "k8s" / "crds"))
    kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/configurations.akri.sh",
        "crd/instances.akri.sh",
    )
    _step("applying a debugEcho Configuration")
    kubectl("apply", "-f", str(EXAMPLE))
    kubectl("get", "akric")
    print(f"\nThe cluster keeps running; use it with:  export KUBECONFIG={env['KUBECONFIG']}")
    print("Stop it with:  scripts/just cluster-down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
