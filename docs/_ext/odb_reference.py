"""Writes the reference pages from the sources at every build, so they cannot drift.

- one page per public module (``odb``, ``odb.kit``, ``odb.planning``,
  ``odb.integrations`` and each of its public submodules) with a table of the names in
  its ``__all__``, and an autodoc page per name;
- the run-config keys: every field of ``experiments.train.config.TrainConfig``'s
  sections, with its type, default and the meaning its class docstring gives;
- the workflow targets: every rule of ``Snakefile`` and ``experiments/rules/*.smk``
  with the comment that explains it (the table rules expanded from
  ``experiments.grid.TABLES``).

The pages go to ``docs/reference/generated/`` (not committed); a file is rewritten only
when its text changes, so an incremental build stays incremental.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
OUT = DOCS / "reference" / "generated"

TOP_MODULES = ("odb", "odb.kit", "odb.planning", "odb.integrations")
RULE = re.compile(r"^rule\s+(\w+)\s*:\s*(?:#\s*(.*))?$")


def public_modules() -> list[str]:
    """The modules the reference covers: the top ones and odb.integrations' public parts."""
    import odb.integrations

    subs = sorted(
        m.name
        for m in pkgutil.iter_modules(odb.integrations.__path__)
        if not m.name.startswith("_")
    )
    return [*TOP_MODULES, *(f"odb.integrations.{name}" for name in subs)]


def module_pages(modname: str, documented: Sequence[str] = ()) -> dict[str, str]:
    """rst pages ``{page name: text}``: the module's, and one per name of its ``__all__``.

    The module's page holds its docstring and a table of its names, each with the first
    line of its docstring and a link to the name's own page. A name re-exported from
    another module of ``documented`` links to its page there, so a cross-reference to it
    has one target: the module that defines it.
    """
    module = importlib.import_module(modname)
    names = list(getattr(module, "__all__", ()))
    if not names:
        raise RuntimeError(
            f"{modname} has no __all__: the reference lists a module's "
            "public names from it; add one"
        )
    pages: dict[str, str] = {}
    rows, own = [], []
    for name in names:
        obj = getattr(module, name)
        home = getattr(obj, "__module__", modname)
        target = f"{home}.{name}" if home != modname and home in documented else None
        if target is None:
            target = f"{modname}.{name}"
            own.append(target)
            pages[target] = _name_page(module, modname, name)
        rows += [f"   * - :py:obj:`{name} <{target}>`", f"     - {_summary(obj, name)}"]
    lines = [
        f"``{modname}``",
        "=" * (len(modname) + 4),
        "",
        f".. automodule:: {modname}",
        "   :no-members:",
        "",
        ".. list-table::",
        "   :widths: 30 70",
        "",
        *rows,
        "",
        ".. toctree::",
        "   :hidden:",
        "",
        *(f"   {page}" for page in own),
        "",
    ]
    pages[modname] = "\n".join(lines)
    return pages


def _summary(obj: Any, name: str) -> str:
    if not (inspect.isroutine(obj) or inspect.isclass(obj)):
        return _constant_comment(name).split(". ")[0].rstrip(".") + "."
    doc = inspect.getdoc(obj) or ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ").strip() or "(no docstring)"
    # a role resolves against the module that wrote it, not this page: show it as code
    return re.sub(r":\w+:`~?([^`]+)`", r"``\1``", first)


def _constant_comment(name: str) -> str:
    """The comment above ``NAME = ...`` where odb defines it (a constant has no docstring)."""
    for path in sorted((ROOT / "odb").rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(rf"^{name}\s*[:=]", line):
                text = _comment_above(lines, i)
                if text:
                    return text
                raise RuntimeError(
                    f"{name} ({path.relative_to(ROOT)}:{i + 1}) has no comment above it: "
                    "the reference shows that comment as the constant's description; add one"
                )
    raise RuntimeError(f"{name}: no `{name} = ...` line in odb/; the reference cannot describe it")


def _name_page(module: Any, modname: str, name: str) -> str:
    full = f"{modname}.{name}"
    lines = [f"``{full}``", "=" * (len(full) + 4), "", f".. currentmodule:: {modname}", ""]
    obj = getattr(module, name)
    if inspect.isclass(obj):
        lines += [f".. autoclass:: {name}", ""]
    elif inspect.isroutine(obj):
        lines += [f".. autofunction:: {name}", ""]
    else:
        lines += [
            f".. py:data:: {name}",
            f"   :value: {obj!r}",
            "",
            f"   {_constant_comment(name)}",
            "",
        ]
    return "\n".join(lines)


def _attribute_docs(cls: type) -> dict[str, str]:
    """``name -> text`` from a Google-style "Attributes:" section (``a / b:`` names two)."""
    doc = inspect.getdoc(cls) or ""
    match = re.search(r"^Attributes:\n((?:[ ]{4}.*\n?|\n)+)", doc, re.MULTILINE)
    if not match:
        return {}
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in match.group(1).splitlines():
        head = re.match(r"^ {4}([\w /]+?):\s*(.*)$", line)
        if head and not line.startswith(" " * 5):
            current = [head.group(2)]
            for key in head.group(1).split("/"):
                out[key.strip()] = current
        elif line.strip():
            current.append(line.strip())
    return {k: " ".join(v) for k, v in out.items()}


def _type_name(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    text = text or str(hint).replace("typing.", "")
    return text


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return repr(field.default)
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        return "(section)" if dataclasses.is_dataclass(value) else repr(value)
    return "required"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_page() -> str:
    """Markdown: every key of the train entry point's config, section by section."""
    from experiments.train.config import TrainConfig

    lines = [
        "# Run-config keys",
        "",
        "Every key of the train entry point's config (`python -m experiments.train "
        "--config LAYER.yaml key=value ...`), generated from "
        "`experiments/train/config.py` and the classes its sections name. A key is "
        "set in a YAML layer (`section: {key: value}`) or as an override "
        "`section.key=value`; an unknown key or a bad value is refused before any "
        "rank starts. Guide: [the train entry point](../../training.md).",
        "",
    ]
    top_hints = typing.get_type_hints(TrainConfig)
    plain = [
        f
        for f in dataclasses.fields(TrainConfig)
        if not dataclasses.is_dataclass(top_hints[f.name])
    ]
    if plain:
        lines += ["## Top level", "", "| Key | Type | Default |", "|---|---|---|"]
        lines += [
            f"| `{f.name}` | `{_cell(_type_name(top_hints[f.name]))}` | `{_cell(_default(f))}` |"
            for f in plain
        ]
        lines.append("")
    for section in dataclasses.fields(TrainConfig):
        cls = top_hints[section.name]
        if not dataclasses.is_dataclass(cls):
            continue
        docs = _attribute_docs(cls)
        hints = typing.get_type_hints(cls)
        summary = (inspect.getdoc(cls) or "").split("\n", 1)[0]
        lines += [
            f"## `{section.name}`",
            "",
            f"{summary} (`{cls.__module__}.{cls.__qualname__}`)",
            "",
            "| Key | Type | Default | Meaning |",
            "|---|---|---|---|",
        ]
        for f in dataclasses.fields(cls):
            lines.append(
                f"| `{section.name}.{f.name}` | `{_cell(_type_name(hints[f.name]))}` "
                f"| `{_cell(_default(f))}` | {_cell(docs.get(f.name, ''))} |"
            )
        lines.append("")
    return "\n".join(lines)


def workflow_rules() -> list[tuple[str, str, str]]:
    """``(rule, file, what it is for)`` for every rule of the workflow, in file order.

    What a rule is for: the comment beside or above it, then what it makes (its
    ``output:``), or for a target rule that only collects files, what it collects.
    """
    from experiments.grid_cells import TABLES

    files = [ROOT / "Snakefile", *sorted((ROOT / "experiments" / "rules").glob("*.smk"))]
    rules = []
    for path in files:
        text = path.read_text().splitlines()
        where = path.relative_to(ROOT).as_posix()
        for i, line in enumerate(text):
            match = RULE.match(line)
            if match:
                comment = match.group(2) or _comment_above(text, i)
                output = _section(text, i, "output")
                makes = (
                    f"makes `{output}`" if output else f"collects `{_section(text, i, 'input')}`"
                )
                about = "; ".join(part for part in (comment, makes) if part)
                rules.append((match.group(1), where, about))
            elif line.strip() == "rule:" and "table_{_name}" in "".join(text[i : i + 3]):
                rules += [
                    (
                        f"table_{t}",
                        where,
                        f"the `{t}` table (Markdown + LaTeX, and its figure if any), "
                        f"`python -m paper.{t}`; makes `results/paper/tables/{t}.md` and `.tex`",
                    )
                    for t in TABLES
                ]
    return rules


def _section(lines: list[str], start: int, name: str) -> str:
    """A rule's ``name:`` section, its lines joined (the rule's block ends at no indent)."""
    out: list[str] = []
    for line in lines[start + 1 :]:
        if line and not line[0].isspace():
            break
        if out and re.match(r"^ {4}\w+:", line):
            break
        if out:
            out.append(line.strip())
        elif line.strip() == f"{name}:":
            out.append("")
    return " ".join(part for part in out if part).rstrip(",")


def _comment_above(lines: list[str], i: int) -> str:
    block = []
    while i > 0 and lines[i - 1].startswith("#"):
        i -= 1
        block.insert(0, lines[i].lstrip("# ").strip())
    return " ".join(block)


def workflow_page() -> str:
    """Markdown: the workflow's targets, each with what it is for."""
    lines = [
        "# Workflow targets",
        "",
        "Every rule of the Snakemake workflow, generated from `Snakefile` and "
        "`experiments/rules/*.smk` (with the comment above or beside each rule). Any "
        "of them is a target: `snakemake --cores 2 <target>` (CPU-proxy scale) or "
        "`snakemake --profile slurm <target>` (paper scale). Guide, with the time of "
        "each target: [the workflow](../../workflow.md).",
        "",
        "| Target | Defined in | What it is for |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{name}` | `{where}` | {_cell(comment)} |" for name, where, comment in workflow_rules()
    ]
    return "\n".join(lines) + "\n"


def write(name: str, text: str) -> Path:
    path = OUT / name
    if not path.exists() or path.read_text() != text:
        # atomically: another build (make docs beside make test) may be reading it
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def generate(app: Any = None) -> None:
    """Write every generated page (a Sphinx ``config-inited`` handler)."""
    OUT.mkdir(parents=True, exist_ok=True)
    modules = public_modules()
    written = {write("run-config.md", config_page()), write("workflow-targets.md", workflow_page())}
    for modname in modules:
        for page, text in module_pages(modname, modules).items():
            written.add(write(f"{page}.rst", text))
    index = [
        "# Reference",
        "",
        "Generated from the sources at every build. `odb` is what a training loop "
        "uses; `odb.kit` is for loaders that are not ODB; `odb.planning` forecasts "
        "ODB on a dataset; `odb.integrations` drives each framework.",
        "",
        "```{toctree}",
        ":maxdepth: 1",
        "",
        *modules,
        "run-config",
        "workflow-targets",
        "```",
        "",
    ]
    written.add(write("index.md", "\n".join(index)))
    for stale in {
        p for p in OUT.iterdir() if not p.name.startswith(".")
    } - written:  # a name that left __all__ leaves no page
        stale.unlink()


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", lambda app, config: generate(app))
    return {"parallel_read_safe": True}
