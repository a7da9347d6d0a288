"""The README stays true: its flag table is the plugin's flag table, its commands exist."""

import re
from pathlib import Path

from radiance.plugin.flags import FLAGS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_flag_table_matches_the_code():
    in_readme = re.findall(r"^\| `(RADIANCE_[A-Z0-9_]+)` \| ([^|]+) \|", README, flags=re.M)
    assert [name for name, _ in in_readme] == [f.name for f in FLAGS]
    for (name, default), flag in zip(in_readme, FLAGS):
        assert default.strip().strip("`") == flag.default, name


def test_every_flag_read_in_the_sources_is_documented():
    read = set()
    for path in ROOT.glob("packages/*/src/**/*.py"):
        read |= set(re.findall(r"\"(RADIANCE_[A-Z0-9_]+)\"", path.read_text()))
    documented = {f.name for f in FLAGS}
    assert read - documented == set(), "flags read but not in radiance.plugin.flags.FLAGS"


def test_the_two_commands_exist():
    assert "./dev demo" in README and "./dev test" in README
    dev = (ROOT / "dev").read_text()
    assert "demo)" in dev and "test)" in dev
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()
