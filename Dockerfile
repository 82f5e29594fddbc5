# One image for every akri-trio role: agent (DaemonSet), controller and webhook (Deployments),
# standalone discovery handlers. The role is the first argument: `akri-trio agent`, ...
FROM python:3.11-slim-bookworm
# pyudev loads libudev.so.1 through ctypes.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libudev1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY akri_trio ./akri_trio
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
USER 0
ENTRYPOINT ["akri-trio"]
CMD ["--help"]
