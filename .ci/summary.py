"""Print one line per JUnit file under results/ and the overall 'N passed, N failed' closing line."""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def counts(path: Path) -> tuple[int, int, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failed = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0)) + int(s.get("disabled", 0))
    return tests - failed - skipped, failed, skipped


def main(folder: str) -> None:
    total = [0, 0, 0]
    for path in sorted(Path(folder).glob("pytest-*.xml")):
        p, f, s = counts(path)
        total = [total[0] + p, total[1] + f, total[2] + s]
        print(f"  {path.name:28} {p} passed, {f} failed, {s} skipped")
    for path in sorted(Path(folder).glob("csi-sanity-*.xml")):
        p, f, s = counts(path)
        print(f"  {path.name:28} {p} specs passed, {f} failed, {s} skipped (upstream-disabled and not-offered)")
    print(f"total: {total[0]} passed, {total[1]} failed, {total[2]} skipped")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results")
