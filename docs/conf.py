"""Sphinx configuration: the guide's Markdown pages (MyST) and the API reference (autodoc).

Built by ``make docs`` and checked by tests/test_docs.py (``sphinx-build -W``: any warning fails).
"""

# First, before anything imports torch.distributed._shard: the reference documents torch_shard.compat,
# and importing it installs the alias, which refuses to do so once upstream's package is loaded.
import torch_shard.compat

project = "torch_shard"
author = "torch_shard contributors"
copyright = "torch_shard contributors"
release = torch_shard.__version__
version = release.split("+")[0]

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
# Methods that override torch's (a DCP reader's hooks, unittest's setUp) say nothing of their own:
# leave them out rather than repeat torch's text.
autodoc_inherit_docstrings = False
# Every reference to a torch_shard object must resolve; references to torch and Python objects are
# not checked (no inventories are fetched: the build runs offline).
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!torch_shard\b).*")]

html_theme = "alabaster"
html_title = f"torch_shard {version}"
