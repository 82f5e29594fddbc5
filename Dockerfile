# One image for every akri-trio role: `akri-trio agent` (DaemonSet), `controller` and `webhook`
# (Deployments), `discovery-handler NAME` (DaemonSets). Each manifest names its role in `args`;
# with none the image prints the roles.
#
# BASE is any Debian-family image with python3 >= 3.11 and venv support: the public Python image
# by default, or the local debootstrap base `just image` makes where no registry is reachable.
# pip reaches its index through the build; a private CA bundle can be given as the build secret
# `cacert` (`--secret id=cacert,src=/path/ca.pem`), which is mounted for that step only and ends
# up in no layer.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/akri-trio
# Dependencies first, pinned by constraints.txt (`just lock`): this layer is rebuilt only when
# the pins change, not on every source edit.
COPY constraints.txt /src/
RUN --mount=type=secret,id=cacert \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert; fi \
 && /opt/akri-trio/bin/pip install -q -r /src/constraints.txt
COPY pyproject.toml README.md /src/
COPY akri_trio /src/akri_trio
# Offline: every dependency and the build backend are already in the venv. pip and setuptools
# are not needed at run time.
RUN /opt/akri-trio/bin/pip install -q --no-deps --no-build-isolation --no-index /src \
 && /opt/akri-trio/bin/pip uninstall -y -q setuptools pip

FROM ${BASE}
# pyudev loads libudev.so.1 through ctypes; install it where the base lacks it.
RUN ldconfig -p | grep -q 'libudev\.so\.1 ' \
 || { apt-get update && apt-get install -y --no-install-recommends libudev1 \
      && rm -rf /var/lib/apt/lists/*; }
COPY --from=builder /opt/akri-trio /opt/akri-trio
ENV PATH=/opt/akri-trio/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Unprivileged by default; the agent's manifest asks for root (it serves the kubelet's sockets).
USER 65532:65532
ENTRYPOINT ["akri-trio"]
CMD ["--help"]
