"""The wheel and the sdist of edge-contracts both carry the conformance fixtures."""

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "src/edge_contracts/conformance/v1.json"


def test_wheel_and_sdist_carry_the_fixtures(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("edge_contracts-*.whl")
    (sdist,) = tmp_path.glob("edge_contracts-*.tar.gz")
    expected = FIXTURES.read_bytes()
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert "edge_contracts/py.typed" in names
        assert "edge_contracts/conformance/__main__.py" in names
        assert archive.read("edge_contracts/conformance/v1.json") == expected
    with tarfile.open(sdist) as archive:
        prefix = sdist.name.removesuffix(".tar.gz")
        member = archive.extractfile(f"{prefix}/src/edge_contracts/conformance/v1.json")
        assert member is not None
        assert member.read() == expected
        assert f"{prefix}/tools/make_fixtures.py" in archive.getnames()
        assert f"{prefix}/tools/conformance_cases/binary_frames.py" in archive.getnames()
        archive.extractall(tmp_path / "sdist", filter="data")
    # The sdist's generator (the script and its conformance_cases package) reproduces the
    # sdist's fixture file byte for byte.
    check = subprocess.run(
        [sys.executable, str(tmp_path / "sdist" / prefix / "tools/make_fixtures.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
