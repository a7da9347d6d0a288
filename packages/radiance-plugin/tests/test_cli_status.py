"""`radiance status`: what is installed, which kernel libraries are prebuilt, every flag."""

from radiance.kernels import library
from radiance.plugin import cli
from radiance.plugin.flags import FLAGS


def test_status_names_every_flag_and_the_prebuilt_libraries(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(library, "PREBUILT_DIR", tmp_path / "none")
    monkeypatch.setenv("RADIANCE_STRICT", "1")
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "kernel libraries: none prebuilt; built for the GPU on first use" in out
    assert all(f.name in out for f in FLAGS)
    assert "RADIANCE_STRICT" in out and [ln for ln in out.splitlines() if "RADIANCE_STRICT" in ln][0].split()[-1] == "1"

    for name in ("cuda-90a", "hip-gfx942", "cuda-89"):
        (tmp_path / "shipped" / name).mkdir(parents=True)
        if name != "cuda-89":  # a directory without its library does not count
            (tmp_path / "shipped" / name / library.LIB_NAME).write_bytes(b"")
    monkeypatch.setattr(library, "PREBUILT_DIR", tmp_path / "shipped")
    cli.main(["status"])
    assert "kernel libraries: prebuilt for cuda-90a, hip-gfx942;" in capsys.readouterr().out
