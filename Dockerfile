# nvmeof-csi image: the driver, its node-side tools, and the CSI stubs generated at build time from the
# pinned spec (Go is needed only for that step and is not kept).
FROM golang:1.22-bookworm AS go

FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends nvme-cli e2fsprogs xfsprogs util-linux mount kmod udev iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=go /usr/local/go /usr/local/go
COPY . /src
RUN PATH=/usr/local/go/bin:$PATH pip install --no-cache-dir /src \
 && rm -rf /usr/local/go /root/go /root/.cache /src
ENTRYPOINT ["nvmeof-csi"]
CMD ["serve", "--help"]
