"""The end of a CI log: the ten slowest tests and the total (issue #51).

    python .ci/slowest.py JUNIT_XML START_EPOCH BOOTSTRAP_END_EPOCH

Reads pytest's JUnit XML (each test case's ``time``: setup, call and teardown together, so a
module's shared fixture counts on its first test) and prints the ten slowest test cases, then the
run's total wall time split into the bootstrap and pytest. Stdlib only: it runs after a failed
bootstrap too.
"""

from __future__ import annotations

import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path


def slowest(xml_path: Path, n: int = 10) -> list[tuple[float, str]]:
    """(seconds, ``file::name``) of the ``n`` slowest test cases, slowest first."""
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        cases.append((float(case.get("time") or 0.0), f"{path}::{case.get('name')}"))
    return sorted(cases, key=lambda c: (-c[0], c[1]))[:n]


def main(argv: list[str]) -> int:
    xml_path, start, booted = Path(argv[0]), float(argv[1]), float(argv[2])
    end = time.time()
    print("\n== CI: the ten slowest tests (setup + call + teardown) ==")
    if xml_path.is_file():
        for seconds, name in slowest(xml_path):
            print(f"{seconds:8.1f} s  {name}")
    else:
        print(f"(no {xml_path}: pytest did not run)")
    print(f"== CI: total {end - start:.0f} s (bootstrap {booted - start:.0f} s, pytest {end - booted:.0f} s) ==")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
