"""Packaging for tfoverlap, torch_parity and the shared flag surface."""

import pathlib
import re

import setuptools

HERE = pathlib.Path(__file__).parent
# The version lives in exactly one place: overlap_core/__init__.py.
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    (HERE / "overlap_core" / "__init__.py").read_text(),
                    re.MULTILINE).group(1)

setuptools.setup(
    name="tfoverlap",
    version=VERSION,
    description=("Measure and control how the overlap optimizations of "
                 "deep-learning training combine, in TensorFlow and PyTorch."),
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=[
        "overlap_core", "overlap_core.*", "flags", "flags.*",
        "tfoverlap", "tfoverlap.*", "torch_parity", "torch_parity.*",
        "overlap_compare", "overlap_compare.*"]),
    # The UCI digits that --dataset=digits reads (data/README.md).
    package_data={"overlap_core": ["runtime/data/*"]},
    install_requires=[
        "absl-py>=2.1",
        "numpy>=1.26",
        # The CPU build: GPU machines add tensorflow[and-cuda] of the same
        # release (see docs/getting-started.md). Both provide the same `tensorflow` module.
        "tensorflow-cpu==2.21.*",
        "tensorboard==2.21.*",  # tf.summary; tensorflow-cpu 2.21 lacks it
        "tensorflow-datasets==4.9.*",
        "importlib_resources",  # tensorflow-datasets needs it at import
    ],
    extras_require={
        # Pinned: 2.13.0 is the CPU wheel; a looser range pulls a CUDA build.
        # Pillow decodes TFDS and image-folder images in DataLoader workers.
        "torch": ["torch==2.13.0", "Pillow>=9"],
        # python -m overlap_compare draws its report's PNG plots (Agg, no
        # display needed); without them it writes the tables alone.
        "compare": ["matplotlib>=3.7", "Pillow>=9"],
        # setuptools: tests/test_packaging.py builds the sdist and wheel
        # offline, with this environment's setuptools.
        # safetensors: tests read checkpoints with the official reader, as a
        # user without tfoverlap would.
        # matplotlib: the comparison's plots are tested too.
        # pytest-xdist: the suite runs one worker process per core.
        # pyyaml: the Kubernetes manifests in examples/ are parsed.
        "test": ["pytest>=8", "pytest-xdist>=3.5", "setuptools>=70.1",
                 "safetensors>=0.4", "matplotlib>=3.7", "Pillow>=9",
                 "pyyaml>=6"],
        # The manual in docs/: `mkdocs serve`, and the suite's strict build.
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5"],
    },
    entry_points={
        "console_scripts": [
            "tfoverlap-train=tfoverlap.train:run_main",
            "tfoverlap-launch=tfoverlap.launch:run_main",
            "tfoverlap-compare=overlap_compare.cli:run_main",
        ],
    },
)
