"""The secrets one connect needs, fetched and placed before the first path connects: the DH-HMAC-CHAP keys of an
``auth`` volume (written with each connect) and the NVMe/TCP TLS PSK of a ``tls: psk`` volume (put in this
kernel's ``.nvme`` keyring under the identity of this host and the volume's subsystem, where the kernel and the
TLS handshake daemon find it; ``nvmeof/tlspsk.py``).

Contract: :meth:`ConnectKeys.for_volume` returns empty :class:`HostKeys` for a volume with neither; else it raises
``FailedPrecondition`` (the node feature's gap: the kernel option or the missing ``tlshd``, with the fix) when
this node cannot do what the volume asks, or when it has no way to fetch its keys, or when the agent issued none;
it never logs a key.
"""

from __future__ import annotations

from collections.abc import Callable

from nvmeof_csi.errors import FailedPrecondition
from nvmeof_csi.host.keyring import NvmeKeyring, handshake_daemon_running
from nvmeof_csi.initiator.fabrics import FabricsDevice
from nvmeof_csi.initiator.features import NodeFeatures, features_of
from nvmeof_csi.nvmeof.context import VolumeContext
from nvmeof_csi.nvmeof.dhchap import HostKeys
from nvmeof_csi.nvmeof.tlspsk import identity, parse_psk
from nvmeof_csi.service.contracts import VolumeRef


class ConnectKeys:
    """``features`` answers whether this node can do ``dhchap`` and ``tls`` (:class:`NodeFeatures`, the same check
    that staging, health and ``nvmeofctl doctor`` use); without one it is built from ``fabrics`` (what this kernel's
    ``/dev/nvme-fabrics`` offers) and ``handshake_daemon``."""

    def __init__(
        self,
        fabrics: FabricsDevice,
        host_nqn: str,
        host_keys: Callable[[VolumeRef], HostKeys] | None,
        keyring: NvmeKeyring | None = None,
        handshake_daemon: Callable[[], bool] = handshake_daemon_running,
        features: NodeFeatures | None = None,
    ) -> None:
        self._host = host_nqn
        self._host_keys = host_keys
        self._keyring = keyring or NvmeKeyring()
        self._features = features or NodeFeatures(
            authenticates=fabrics.authenticates,
            tls_capable=lambda: "tls" in fabrics.options(),
            handshake_daemon=handshake_daemon,
        )

    def for_volume(self, ref: VolumeRef, ctx: VolumeContext) -> HostKeys:
        wanted = sorted(features_of(ctx) & {"dhchap", "tls"})
        if not wanted:
            return HostKeys()
        gaps = [gap for gap in map(self._features.gap, wanted) if gap is not None]
        if gaps:
            raise FailedPrecondition(f"volume {ref.uuid} cannot be staged on this node: {'; '.join(map(str, gaps))}")
        if ctx.tls != "none":
            self._keyring.serial()  # FailedPrecondition naming the kernel option when the kernel has no .nvme
        if self._host_keys is None:
            raise FailedPrecondition(
                f"volume {ref.uuid} uses auth {ctx.auth!r} / tls {ctx.tls!r}; this node fetches its keys from the "
                "volume's agent, and it has no fabric map (--fabric-map) to reach one"
            )
        keys = self._host_keys(ref)
        if ctx.auth != "none" and not keys.key:
            raise FailedPrecondition(f"volume {ref.uuid}: its agent issued no DH-HMAC-CHAP key to this host")
        if ctx.tls != "none":
            if not keys.tls_psk:
                raise FailedPrecondition(f"volume {ref.uuid}: its agent issued no TLS PSK to this host")
            self._keyring.put_psk(identity(self._host, ctx.nqn), parse_psk(keys.tls_psk))
        return keys
