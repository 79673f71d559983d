"""Build hook: generate protobuf/gRPC stubs (never committed) before the package is built or installed."""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithProtos(build_py):
    """``build_py`` that first fetches, verifies and compiles the protos into ``nvmeof_csi/gen``."""

    def run(self) -> None:
        sys.path.insert(0, str(HERE / "proto"))
        import protogen

        protogen.generate(HERE)
        if self.packages is not None and "nvmeof_csi.gen" not in self.packages:
            self.packages.append("nvmeof_csi.gen")  # created just now, after package discovery
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
