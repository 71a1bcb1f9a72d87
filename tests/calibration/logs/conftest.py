"""Fixture logs of tests/calibration/logs (written to each framework's printing code; see
/work/briefs/research/log_import_notes.md for the commits read)."""

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixture_path():
    def get(name: str) -> Path:
        return FIXTURES / name

    return get
