"""Builds the optional fused nearest-row kernel; without a C compiler the SDK uses numpy's BLAS."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "lac.client._nearest_kernel",
            sources=["lac/client/_nearest_kernel.c"],
            extra_compile_args=["-O3"],
            optional=True,  # a failed build is a warning; lac.client.nearest then falls back to BLAS
        )
    ]
)
