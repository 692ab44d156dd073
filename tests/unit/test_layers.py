"""radixlm's layers point one way and no package has an import cycle: the contracts in pyproject.toml
(`[tool.importlinter]`), checked by import-linter's `lint-imports` as the README's test command runs it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "2 kept, 0 broken" in result.stdout, result.stdout[-2000:]
