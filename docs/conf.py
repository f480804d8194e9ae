"""Sphinx configuration of the ODB docs site: `make docs` (warnings are errors).

The pages are the Markdown files of this folder (MyST-Parser); the reference is
generated from the sources at every build by ``_ext/odb_reference.py`` (autodoc pages for
every public name, the run-config keys and the workflow targets), so it cannot drift.
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]  # odb and the recipes from this checkout

project = "ODB"
author = "The ODB artifact authors"
copyright = "the ODB artifact authors, Apache-2.0"  # noqa: A001 (Sphinx's setting name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "odb_reference",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# docs/README.md is the folder's index when browsing the repository; the site has index.md.
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # `page.md#a-heading` links resolve, and a wrong one warns

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # dataclass "Attributes:" render as fields, not duplicate objects

html_theme = "furo"
html_title = "ODB: online dynamic batching"
html_static_path = ["_static"]

# A reference to a name that is not documented fails the build (nitpicky), except where
# the target is outside this site: other projects (no intersphinx: the build runs
# offline) and odb's private layers, which the reference does not document on purpose.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|collections|typing|pathlib|os|transformers|trl|numpy|accelerate"
        r"|deepspeed|peft|datasets|contextlib|types)(\..*)?",
    ),
    (r"py:.*", r"odb\.(core|_process)\..*"),
    # as annotations spell them: torch types, type variables, a private class one
    # public function returns (odb.kit.open_rendezvous); torch's inherited docstrings
    (
        r"py:.*",
        r"(Tensor|FSDPModule|C|AdaptedWindow|odb\.integrations\.window\.AdaptedWindow"
        r"|Rendezvous|get_last_lr)",
    ),
]
