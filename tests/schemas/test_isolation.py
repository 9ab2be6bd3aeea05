"""``schemas`` depends on nothing else of ours."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import schemas

OURS = {"proxy", "pipeline", "trainer", "orchestrator", "infra", "openforge", "tests", "bench"}


def test_no_module_of_schemas_imports_our_other_packages() -> None:
    for path in Path(schemas.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in OURS, f"{path} imports {name}"


def test_importing_schemas_loads_none_of_our_other_packages() -> None:
    code = (
        "import sys, schemas.codec, schemas.delta, schemas.archive;"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(OURS)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
