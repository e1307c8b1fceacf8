"""torch_shard's PEP 517 build backend: setuptools' own, built against the torch of the environment
pip installs into.

torch_shard's library is C++ against torch's C++ ABI, so it must compile against the torch it will
run with. pip's default build isolation hides that environment's packages from the build and would
install a torch of its choosing into a temporary environment (the newest release the requirements
admit, a CUDA build of several GB), compile against it, and install a library that the user's torch
cannot load. This backend instead puts the target environment's site-packages back at the end of
``sys.path``, after the isolated build tools, so setup.py imports the torch the library will run
with; setup.py then pins that torch's minor release in the wheel's metadata and refuses an unsupported
one before compiling.

Only where the target environment has no torch at all (a fresh venv, or a frontend such as
``python -m build`` whose isolated interpreter is not the target's) is torch asked for as a build
requirement; the wheel's ``torch==X.Y.*`` then makes the installer put the same minor release beside it.

Without build isolation (``pip install --no-build-isolation -e .``) torch is importable as it is and
this module changes nothing.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every hook setuptools has; the ones below wrap it)

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build_info():
    spec = importlib.util.spec_from_file_location(
        "_torch_shard_build_info", os.path.join(_HERE, "torch_shard", "_support", "_build_info.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _target_site_packages() -> list[str]:
    """The site-packages of the interpreter running this backend: pip runs build hooks with the target
    environment's interpreter, and its isolation only takes these folders off ``sys.path``."""
    folders = list(site.getsitepackages())
    if sys.prefix == sys.base_prefix:  # not a venv: a `pip install --user` torch counts too
        folders.append(site.getusersitepackages())
    return folders


def _use_target_torch() -> bool:
    """Make the target environment's torch importable; return whether some torch is importable."""
    if importlib.util.find_spec("torch") is not None:
        return True  # no isolation, or the isolated environment got torch as a build requirement
    for folder in _target_site_packages():
        if os.path.isfile(os.path.join(folder, "torch", "__init__.py")):
            if folder not in sys.path:
                sys.path.append(folder)  # last: the isolated setuptools, wheel and ninja stay first
            importlib.invalidate_caches()
            return True
    return False


_HAS_TORCH = _use_target_torch()


def _requires(setuptools_hook, config_settings) -> list[str]:
    if _HAS_TORCH:
        return setuptools_hook(config_settings)  # runs setup.py, which imports torch
    spec = _build_info().SUPPORTED_SPEC
    print(
        f"torch_shard: no torch in the environment being installed into; building against torch{spec} "
        "from the build environment (the wheel will require that torch's minor release). To build "
        "against a particular torch, install it first.",
        file=sys.stderr,
    )
    return [f"torch{spec}"]


def get_requires_for_build_wheel(config_settings=None):
    return _requires(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _requires(_setuptools.get_requires_for_build_editable, config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _requires(_setuptools.get_requires_for_build_sdist, config_settings)
