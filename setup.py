from setuptools import find_packages, setup

setup(
    name="dynagraph",
    version="0.1.0",
    description="Dynamic neural networks written per sample, batched automatically (DyNet-compatible API)",
    packages=find_packages(include=["dynagraph", "dynagraph.*"]),
    python_requires=">=3.9",
    install_requires=["numpy>=1.22", "tqdm>=4.0", "threadpoolctl>=3.0"],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6"],
        "bench": ["dynet38", "torch==2.13.0"],
        "gpu": ["cupy-cuda12x"],
        "dev": ["pytest>=7", "hypothesis>=6", "ruff"],
    },
)
