"""Refits the shipped stack profiles (``perfmodel/profiles/stacks/*.json``) to the modern runs.

Each profile keeps its name, description and free constants; its constants, covariance, rows and
leave-one-out errors are fitted again with :func:`calibration.modern.fit_stack_profile` on the
runs of its stack and hardware in ``calibration/data/modern_runs.csv`` (never the holdout). Run
it after a change to the step model: ``python docs/make_stack_profiles.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from calibration.modern import MAIN_CSV, fit_stack_profile, load_modern_runs
from simbase.io import atomic_write_text

STACKS_DIR = Path(__file__).resolve().parents[1] / "perfmodel" / "profiles" / "stacks"


def main() -> None:
    runs, _ = load_modern_runs(MAIN_CSV)
    for path in sorted(STACKS_DIR.glob("*.json")):
        old = json.loads(path.read_text())
        doc = fit_stack_profile(
            runs, old["fitted"], stack=old["stack"], hardware=old["hardware"], seed=0
        )
        doc["name"], doc["description"] = old["name"], old["description"]
        atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
        print(
            f"{path.name}: {doc['rows']} rows, leave-one-out MAPE {doc['fit']['cv_mape_pct']:.2f}%"
        )


if __name__ == "__main__":
    main()
