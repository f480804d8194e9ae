"""An import-linter contract for submodules of external packages (``torch.distributed``).

import-linter's own ``forbidden`` contract forbids an external package only as a whole:
its graph records ``import torch.distributed`` as an import of ``torch``. ``odb.core``
may use torch's tensors but not its process groups, so this contract reads the import
statements themselves (the graph keeps each import's line): ``import torch.distributed``,
``from torch.distributed[.x] import ...`` and ``from torch import distributed`` count;
reaching ``torch.distributed`` as an attribute after ``import torch`` is no import and is
not seen. Registered in ``pyproject.toml`` under ``contract_types``.
"""

from __future__ import annotations

import re

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck
from importlinter.domain.helpers import module_expressions_to_modules


def names_submodule(line: str, submodule: str) -> bool:
    """Whether the import statement ``line`` imports ``submodule`` (``a.b``) or below it.

    Example:
        >>> names_submodule("from torch import distributed as dist", "torch.distributed")
        True
        >>> names_submodule("import torch", "torch.distributed")
        False
    """
    dotted = re.escape(submodule)
    if re.match(rf"\s*(import|from)\s+{dotted}(\.|\s|$)", line):
        return True
    if re.match(rf"\s*import\s+.*,\s*{dotted}(\.|\s|,|$)", line):
        return True
    parent, _, last = submodule.rpartition(".")
    return bool(re.match(rf"\s*from\s+{re.escape(parent)}\s+import\s.*\b{last}\b", line))


class ForbiddenSubmoduleContract(Contract):
    """Source modules (and their descendants) import none of ``forbidden_submodules``."""

    type_name = "forbidden_submodules"

    source_modules = fields.SetField(subfield=fields.ModuleExpressionField())
    forbidden_submodules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        found = []
        for source in module_expressions_to_modules(graph, self.source_modules):  # type: ignore
            importers = {source.name} | graph.find_descendants(source.name)
            for importer in sorted(importers):
                for submodule in self.forbidden_submodules:  # type: ignore
                    top = submodule.partition(".")[0]
                    details = graph.get_import_details(importer=importer, imported=top)
                    found += [
                        f"{importer}:{d['line_number']} {d['line_contents'].strip()}"
                        for d in details
                        if names_submodule(d["line_contents"], submodule)
                    ]
        return ContractCheck(kept=not found, warnings=[], metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["found"]:
            output.print_error(line, bold=False)
            output.new_line()
