"""`radiance status`: what is installed, which kernel libraries are prebuilt, every flag."""

from radiance.kernels import library
from radiance.plugin import cli
from radiance.plugin.flags import FLAGS


def test_status_names_every_flag_and_the_prebuilt_libraries(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(library, "PREBUILT_DIR", tmp_path / "none")
    monkeypatch.setenv("RADIANCE_STRICT", "1")
    monkeypatch.delenv("RADIANCE_ATTN_SCRATCH_MIB", raising=False)
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "kernel libraries: none prebuilt; built for the GPU on first use" in out
    lines = out.splitlines()
    flag_lines = lines[lines.index("flags:") + 1:]
    assert [ln.split()[0] for ln in flag_lines] == [f.name for f in FLAGS]
    shown = dict(ln.split(maxsplit=1) for ln in flag_lines)
    assert shown["RADIANCE_STRICT"] == "1"
    assert shown["RADIANCE_ATTN_SCRATCH_MIB"] == "(default 256)"

    for name in ("cuda-90a", "hip-gfx942", "cuda-89"):
        (tmp_path / "shipped" / name).mkdir(parents=True)
        if name != "cuda-89":  # a directory without its library does not count
            (tmp_path / "shipped" / name / library.LIB_NAME).write_bytes(b"")
    monkeypatch.setattr(library, "PREBUILT_DIR", tmp_path / "shipped")
    cli.main(["status"])
    assert "kernel libraries: prebuilt for cuda-90a, hip-gfx942;" in capsys.readouterr().out
