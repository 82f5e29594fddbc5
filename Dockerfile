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
# binutils for `strip`, in this stage only: some wheels ship their extension modules with the
# symbol table (cryptography's 14 MB Rust module, PyYAML's 2.6 MB one); Python loads them through
# their dynamic symbols, which --strip-unneeded keeps. Libraries a wheel vendors (`*.libs/`,
# rewritten by auditwheel's patchelf) are left as they are.
RUN export DEBIAN_FRONTEND=noninteractive && apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends binutils >/dev/null \
 && python3 -m venv /opt/akri-trio
# Dependencies first, pinned by constraints.txt (`just lock`): this layer is rebuilt only when
# the pins change, not on every source edit.
COPY constraints.txt /src/
RUN --mount=type=secret,id=cacert \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert; fi \
 && /opt/akri-trio/bin/pip install -q -r /src/constraints.txt \
 && find /opt/akri-trio -name '*.so*' -type f -not -path '*.libs/*' \
         -exec strip --strip-unneeded {} +
COPY pyproject.toml README.md /src/
COPY akri_trio /src/akri_trio
# Offline: every dependency and the build backend are already in the venv. pip and setuptools
# are not needed at run time. pip compiled every module to bytecode as it installed it, so the
# image ships the .pyc files and PYTHONDONTWRITEBYTECODE=1 below only stops a process from
# trying to write where it may not. asyncua's standard address space (19 MB) is loaded only by
# an OPC UA *server*; the opcua handler is a client. zeep uses lxml's etree and builder, not its
# objectify, html or schematron modules.
RUN /opt/akri-trio/bin/pip install -q --no-deps --no-build-isolation --no-index /src \
 && /opt/akri-trio/bin/pip uninstall -y -q setuptools pip \
 && site=$(/opt/akri-trio/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && rm -rf "$site/asyncua/server/standard_address_space" "$site/aiosqlite/tests" \
           "$site/certifi/tests" "$site/lxml/includes" "$site"/lxml/objectify.* \
           "$site/lxml/html" "$site/lxml/isoschematron"

FROM ${BASE} AS runtime
# pyudev loads libudev.so.1 through ctypes; install it where the base lacks it.
RUN ldconfig -p | grep -q 'libudev\.so\.1 ' \
 || { apt-get update && apt-get install -y --no-install-recommends libudev1 \
      && rm -rf /var/lib/apt/lists/*; }
COPY --from=builder /opt/akri-trio /opt/akri-trio
# What nothing here runs: the package manager, its crypto (apt, gpgv, GnuTLS, Kerberos) and its
# per-file records, perl, the ext2 and SELinux-policy tools, iconv's charset modules, the time
# zone tree (the venv has tzdata), venv's bundled wheels and the parts of the standard library
# for tests, tools and terminals. The shell and coreutils stay, for `kubectl exec`. The last
# step proves every role and handler still imports (and with them the stripped extension
# modules they load) and libudev is still found. The paths are those of Debian's python3 (the
# local base); on another base what is not there is skipped.
RUN py=/usr/lib/python3.11 lib=/usr/lib/x86_64-linux-gnu \
 && rm -rf /usr/bin/perl* $lib/perl-base /usr/share/perl5 \
           /usr/bin/apt* /usr/lib/apt /etc/apt /var/lib/apt /var/cache/apt $lib/libapt-* \
           /usr/bin/gpgv /usr/share/keyrings /etc/cron.daily \
           $lib/libgnutls* $lib/libunistring* $lib/libgcrypt* $lib/libp11-kit* \
           $lib/libnettle* $lib/libhogweed* $lib/libidn2* $lib/libsystemd* \
           $lib/libkrb5* $lib/libgssapi* $lib/libk5crypto* $lib/libtirpc* $lib/libnsl* \
           $lib/libdb-5* $lib/gconv /usr/share/zoneinfo /usr/share/python-wheels \
           $lib/libext2fs* $lib/libe2p* $lib/libsemanage* $lib/libsepol* /usr/sbin/e2* \
           /usr/sbin/mke2fs /usr/sbin/mkfs.ext* /usr/sbin/fsck.ext* /usr/sbin/debugfs \
           /usr/sbin/tune2fs /usr/sbin/resize2fs /usr/sbin/badblocks /usr/sbin/dumpe2fs \
           /usr/bin/openssl /usr/bin/localedef /var/lib/dpkg/info \
           /usr/share/lintian /usr/share/bash-completion /usr/share/common-licenses \
           $py/test $py/lib2to3 $py/pydoc_data $py/distutils $py/ensurepip $py/idlelib \
           $py/turtledemo $py/tkinter $py/lib-dynload/_test* $py/lib-dynload/_xx* \
           $py/lib-dynload/xxlimited* $py/lib-dynload/_ctypes_test* $py/lib-dynload/_dbm* \
           $py/lib-dynload/nis.* $py/lib-dynload/_curses* $py/lib-dynload/ossaudiodev* \
 && ldconfig \
 && /opt/akri-trio/bin/python -c 'import ctypes.util, akri_trio.agent.run, akri_trio.controller.run, \
akri_trio.webhook.server, akri_trio.cli, importlib; from akri_trio.discovery.handlers import BUILTIN; \
[importlib.import_module(target.partition(":")[0]) for target in BUILTIN.values()]; \
import zeep, lxml.etree, asyncua, zeroconf, pyudev, re2, yaml._yaml, google._upb._message, \
cryptography.hazmat.bindings._rust; assert ctypes.util.find_library("udev")'

# One layer holding the trimmed tree: files deleted in a layer above a base still take space.
FROM scratch
COPY --from=runtime / /
ENV PATH=/opt/akri-trio/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Unprivileged by default; the agent's manifest asks for root (it serves the kubelet's sockets).
USER 65532:65532
ENTRYPOINT ["akri-trio"]
CMD ["--help"]
