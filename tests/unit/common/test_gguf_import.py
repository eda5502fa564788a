"""`rollway import-gguf` refuses what it cannot convert, naming why, and writes nothing."""

from __future__ import annotations

import pytest

from rollway.cli import main
from rollway.common.gguf_import import GgufImportError, import_gguf


def test_a_file_that_is_not_gguf_is_refused_naming_its_first_bytes(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(GgufImportError, match=r"not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        import_gguf(fake, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_missing_file_and_a_full_directory_are_refused(tmp_path):
    with pytest.raises(GgufImportError, match="no such file"):
        import_gguf(tmp_path / "absent.gguf", tmp_path / "out")
    real = tmp_path / "model.gguf"
    real.write_bytes(b"GGUF" + b"\0" * 16)
    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text("{}")
    with pytest.raises(GgufImportError, match="is not empty"):
        import_gguf(real, full)
    assert [p.name for p in full.iterdir()] == ["config.json"]


def test_a_truncated_gguf_file_is_refused_by_the_command_with_exit_2(tmp_path, capsys):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00")  # the header ends after its version
    assert main(["import-gguf", str(broken), str(tmp_path / "out")]) == 2
    assert "rollway import-gguf: broken.gguf: transformers cannot convert it" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
