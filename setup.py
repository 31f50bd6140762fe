"""Packaging for hvdps.

The Horovod wheel is deliberately *not* an install_requires: it must be compiled
against the TensorFlow already in the environment, with the project's patch
(horovod_train/install.py, patches/), and letting pip resolve it would build the
unpatched release in an isolated env against the wrong TensorFlow.
"""
from setuptools import find_packages, setup

setup(
    name="hvdps",
    version="0.1.0",
    description="Train one TensorFlow model several ways (Horovod or TensorFlow all-reduce vs parameter servers) and compare",
    python_requires=">=3.9,<3.14",
    # every method package (<name>_train: its trainer, launcher and registry entry) is found by its name
    packages=find_packages(include=["common", "common.*", "allreduce", "allreduce.*", "*_train", "*_train.*", "tf_cluster", "tf_cluster.*",
                                    "hvdps", "hvdps.*"]),
    package_data={"hvdps.cost": ["model_profiles.json"],   # layer profiles of the benchmark models
                  "hvdps.measure": ["*.sh"],             # the remote-shell agents (namespaces, SLURM)
                  "common.inputs": ["digits.csv.gz"]},       # the bundled data set (common/inputs/data.py: load_digits)
    install_requires=[
        # The stack is pinned by make setup (hvdps/install/stack.py): 2.21 (numpy 2) on Python 3.10-3.13, 2.18 and
        # 2.15 (numpy 1) selectable. `tensorflow`, not `tensorflow-cpu`: tf-keras depends on the former.
        "tensorflow>=2.15.1,<2.22",
        "numpy>=1.23,<3",
        "mpi4py==4.1.2",
        "matplotlib==3.9.2",
        "tqdm==4.66.5",
        "google-crc32c==1.9.0",     # TFRecord framing checked before any task starts (common/inputs/records.py)
        "PyYAML==6.0.2",
        "tensorboard>=2.15",              # TensorFlow 2.21 no longer brings it; the runs write its events
        "pydantic==2.12.5",               # the schema of every file hvdps reads (common/formats/schemas.py)
        # hvdps k8s checks what it writes: Kubernetes' own schemas, and the CRDs' with jsonschema (hvdps/k8s/validate.py)
        "kubernetes-validate==1.37.0",
        "jsonschema==4.23.0",
    ],
    extras_require={
        "gpu": ["tensorflow[and-cuda]>=2.15.1,<2.22"],
        "horovod": ["horovod==0.28.1"],
        "test": ["pytest==8.3.3", "pytest-timeout==2.3.1", "pytest-xdist==3.8.0", "hypothesis>=6.100,<7"],
    },
    entry_points={
        "console_scripts": [
            "hvdps=hvdps.cli:main",
        ],
    },
)
