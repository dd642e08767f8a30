"""The compiled hot path of the leaf link (``gateway/wire/_framing.pyx``), built by Cython when the
package is installed; everything else is in pyproject.toml. Where no C compiler is at hand the
install still succeeds and the gateway runs the Python implementation (``gateway.wire.framing``),
as aiohttp does with its parser; ``JETLAKE_NO_EXTENSIONS`` selects it at run time too."""

from __future__ import annotations

import os

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """A failed compile is a warning, not a failed install (the Python path serves)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any compiler failure
            self.warn(f"jetlake: the compiled hot path was not built ({exc}); the Python one serves")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # any compiler failure
            self.warn(f"jetlake: {ext.name} was not built ({exc}); the Python one serves")


extensions = (
    []
    if os.environ.get("JETLAKE_NO_EXTENSIONS")
    else cythonize(
        [Extension("gateway.wire._framing", ["gateway/wire/_framing.pyx"])],
        compiler_directives={"language_level": "3"},
    )
)

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
