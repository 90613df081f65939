"""The suite's own scheduling under pytest-xdist: every test of the shared real-vLLM processes
runs on ONE worker (tests/conftest.py), any other file as a unit; a pytest or xdist release that
stops honouring the groups would start those processes on every worker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
import pytest

@pytest.mark.parametrize("i", range(4))
def test_probe(i: int) -> None:
    pass
'''


def test_the_vllm_group_and_each_file_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_itemcollected\n")
    for name in ("test_a_vllm.py", "test_b_vllm.py", "test_c.py", "test_d.py"):
        (tmp_path / name).write_text(PROBE)
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2",
         "--dist", "loadgroup", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    workers: dict[str, set[str]] = {}
    for worker, path in re.findall(r"\[(gw\d)\] .*PASSED \S*?(test_\w+\.py)::", ran.stdout):
        workers.setdefault(path, set()).add(worker)
    assert sorted(workers) == ["test_a_vllm.py", "test_b_vllm.py", "test_c.py", "test_d.py"]
    assert all(len(w) == 1 for w in workers.values()), workers  # each file on one worker
    assert workers["test_a_vllm.py"] == workers["test_b_vllm.py"], workers  # one vllm group
