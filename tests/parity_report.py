"""The API-parity stage's report in the pytest log: ``K/N identical`` and the fields that differ.

tests/test_parity_vllm.py records each case's differences as a user property of its report; the
terminal summary gathers them (from every worker under pytest-xdist) and prints them at the end
of the run (whatever ``-q`` or ``-r`` the run used), so CI's log says how close
kvroute's answers are to vLLM's, case by case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.parity_compare import field_names


@dataclass
class ParityReport:
    """Per case: the differing fields (none: identical) and, if marked, why they may differ."""

    cases: dict[str, tuple[list[str], str | None]] = field(default_factory=dict)

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


# The user property a parity case records (its name, differing fields, and why they may differ):
# it travels with the test's report, so the summary is whole when workers run the cases.
PROPERTY = "api_parity"


def record(record_property: Callable[[str, object], None], name: str,
           diff: dict[str, object], expected: str | None) -> None:
    record_property(PROPERTY, [name, field_names(diff), expected])  # type: ignore[arg-type]


class _Collector:
    """Gathers the cases from the reports of the process that prints the summary."""

    def __init__(self) -> None:
        self.report = ParityReport()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == PROPERTY:
                name, fields, why = value  # type: ignore[misc]
                self.report.cases[name] = (list(fields), why)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.report.cases:
            return
        terminalreporter.section("API parity")
        for line in self.report.lines():
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Collector(), "kvroute-api-parity")
