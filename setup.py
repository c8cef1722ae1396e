"""The one part of the build pyproject.toml cannot say in its stable tables: an optional C extension.

(``[tool.setuptools] ext-modules`` in pyproject.toml needs setuptools >= 74 and is still marked
experimental there; ``setup()`` with ``ext_modules`` works with every setuptools this project's
build-system allows, and pyproject.toml keeps all the rest.)

``cupy_nwt.data._libjpeg_region`` decodes only a crop's rectangle of a JPEG through the system's
libjpeg-turbo (``jpeg_crop_scanline``, ``jpeg_skip_scanlines``). It is ``optional``: where the
headers (``libjpeg-turbo8-dev`` / ``libjpeg62-turbo-dev``) or a compiler are missing, setuptools
warns and the install goes on; the package then decodes crops with simplejpeg.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cupy_nwt.data._libjpeg_region",
            sources=["cupy_nwt/data/_libjpeg_region.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
