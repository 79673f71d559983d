# nvmeof-csi image for users with a registry at hand. The same image is built without a registry by
# `./dev image` (image/build.py: debootstrap + umoci); both install exactly image/packages.txt.
# Base images are pinned by digest, and only by digest: pass both (the build refuses a tag alone), e.g.
#   docker build --build-arg GO_IMAGE=golang:1.26-bookworm@sha256:<digest> \
#                --build-arg BASE_IMAGE=debian:bookworm-slim@sha256:<digest> -t <registry>/nvmeof-csi:0.1.0 .
# (`docker buildx imagetools inspect debian:bookworm-slim` prints a tag's current digest.)
ARG GO_IMAGE
ARG BASE_IMAGE
# Stage 1 builds our wheel: its CSI and kubelet stubs are generated from the pinned protos, fetched through
# the Go module proxy (Go is needed only here).
FROM ${GO_IMAGE} AS wheel
ARG GO_IMAGE
ARG BASE_IMAGE
RUN for ref in "$GO_IMAGE" "$BASE_IMAGE"; do case "$ref" in *@sha256:????????????????????????????????????????????????????????????????) ;; \
      *) echo "base image '$ref' is not pinned by digest (NAME@sha256:<64 hex>)" >&2; exit 1 ;; esac; done
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN python3 -m venv /w && /w/bin/pip install --no-cache-dir --upgrade pip \
 && /w/bin/pip wheel --no-cache-dir --no-deps -w /dist /src

FROM ${BASE_IMAGE}
ARG KTLS_UTILS_VERSION=1.0.0-1
COPY image/packages.txt image/unused.txt image/constraints.txt /tmp/
# tlshd (NVMe/TCP TLS handshakes) from Debian trixie's ktls-utils: it runs on bookworm's libraries (image/base.py)
RUN apt-get update \
 && grep -v '^#' /tmp/packages.txt | xargs apt-get install -y --no-install-recommends \
 && echo 'deb http://deb.debian.org/debian trixie main' > /etc/apt/sources.list.d/trixie.list \
 && apt-get update && cd /tmp && apt-get download "ktls-utils=${KTLS_UTILS_VERSION}" \
 && dpkg-deb -x /tmp/ktls-utils_*.deb /tmp/ktls && cp /tmp/ktls/usr/sbin/tlshd /usr/sbin/tlshd \
 && printf '[debug]\nloglevel=2\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n[authenticate.client]\n[authenticate.server]\n' > /etc/tlshd.conf \
 && rm -rf /etc/apt/sources.list.d/trixie.list /tmp/ktls /tmp/ktls-utils_*.deb /var/lib/apt/lists/* /tmp/packages.txt
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
