# nvmeof-csi image for users with a registry at hand. The same image is built without a registry by
# `./dev image` (image/build.py: debootstrap + umoci); both install exactly image/packages.txt.
# Stage 1 builds our wheel: its CSI and kubelet stubs are generated from the pinned protos, fetched through
# the Go module proxy (Go is needed only here).
FROM golang:1.26-bookworm AS wheel
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN python3 -m venv /w && /w/bin/pip install --no-cache-dir --upgrade pip \
 && /w/bin/pip wheel --no-cache-dir --no-deps -w /dist /src

FROM debian:bookworm-slim
COPY image/packages.txt image/unused.txt image/constraints.txt /tmp/
RUN apt-get update \
 && grep -v '^#' /tmp/packages.txt | xargs apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/packages.txt
COPY --from=wheel /dist /tmp/dist
RUN python3 -m venv /opt/nvmeof-csi \
 && /opt/nvmeof-csi/bin/pip install --no-cache-dir -c /tmp/constraints.txt /tmp/dist/*.whl \
 && awk '$1 == "pip" {print $2}' /tmp/unused.txt | xargs /opt/nvmeof-csi/bin/python -m pip uninstall -q -y \
 && /opt/nvmeof-csi/bin/python -m pip uninstall -q -y setuptools pip \
 && awk '$1 == "package" {print $2}' /tmp/unused.txt | xargs dpkg --purge --force-depends \
 && awk '$1 == "path" {print "/" $2}' /tmp/unused.txt | xargs rm -rf \
 && rm -rf /tmp/dist /tmp/unused.txt /tmp/constraints.txt \
 && ln -s /opt/nvmeof-csi/bin/nvmeof-csi /opt/nvmeof-csi/bin/nvmeofctl /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/nvmeof-csi"]
CMD ["--help"]
