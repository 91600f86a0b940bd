"""The README's quick start, run as written against the real binary (only the address differs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start() -> str:
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def test_the_quick_start_is_ten_lines_and_runs(toolgate):
    code = quick_start()
    assert len(code.strip().splitlines()) <= 10
    assert "127.0.0.1:50051" in code
    done = subprocess.run(
        [sys.executable, "-c", code.replace("127.0.0.1:50051", toolgate.address)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    tools_line, result_line = done.stdout.splitlines()
    assert "'rag_search'" in tools_line
    assert result_line.startswith('OK {"results":[{"id":"acme-1"'), result_line
