"""A real Kubernetes on loopback, one node or several, for tests and local development.

Akri only means something against a real API server and a real kubelet, and no registry ships
those binaries, so this package builds them (and etcd and containerd) from Go modules at the
versions pinned in gobuild/versions.env, and runs etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and, with `--node`, containerd plus a kubelet with offline images. Pure modules
(layout, flags, configs, pki, oci, cleanup) decide; runner.py and procs.py act; cli.py is
`python -m akri_trio_dev cluster up|down|status|env|node`.
"""
