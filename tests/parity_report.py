"""The API-parity stage's report in the pytest log: ``K/N identical`` and the fields that differ.

tests/test_parity_vllm.py records each case's differences here; the terminal summary prints
them at the end of the run (whatever ``-q`` or ``-r`` the run used), so CI's log says how close
kvroute's answers are to vLLM's, case by case.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.parity_compare import field_names


@dataclass
class ParityReport:
    """Per case: the differing fields (none: identical) and, if marked, why they may differ."""

    cases: dict[str, tuple[list[str], str | None]] = field(default_factory=dict)

    def add(self, name: str, diff: dict[str, object], expected: str | None) -> None:
        self.cases[name] = (field_names(diff), expected)  # type: ignore[arg-type]

    def lines(self) -> list[str]:
        total = len(self.cases)
        same = sum(1 for fields, _ in self.cases.values() if not fields)
        marked = {n: why for n, (fields, why) in self.cases.items() if fields and why}
        unexpected = {n: fields for n, (fields, why) in self.cases.items() if fields and not why}
        out = [f"API parity with vllm serve (vLLM 0.32): {same}/{total} identical, "
               f"{len(marked)} expected differences, {len(unexpected)} unexpected"]
        for name, fields in unexpected.items():
            out.append(f"  DIFFERS   {name}: {', '.join(fields)}")
        for name, why in marked.items():
            out.append(f"  expected  {name}: {', '.join(self.cases[name][0])} -- {why}")
        stale = [n for n, (fields, why) in self.cases.items() if not fields and why]
        for name in stale:
            out.append(f"  IDENTICAL {name}: still marked as expected to differ")
        return out


_KEY = pytest.StashKey[ParityReport]()


@pytest.fixture(scope="session")
def parity_report(request: pytest.FixtureRequest) -> ParityReport:
    return request.config.stash.setdefault(_KEY, ParityReport())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    report = config.stash.get(_KEY, None)
    if report is None or not report.cases:
        return
    terminalreporter.section("API parity")
    for line in report.lines():
        terminalreporter.write_line(line)
