"""Config-named modules import from the working directory, and nothing else does."""

import sys

from speedtronic.registry import import_modules, import_object


def test_a_config_module_beside_the_config_imports_and_the_directory_goes_away(
    tmp_path, monkeypatch
):
    (tmp_path / "speedtronic_cwd_probe.py").write_text("VALUE = 7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    import_modules(["speedtronic_cwd_probe"])
    assert sys.modules["speedtronic_cwd_probe"].VALUE == 7
    assert str(tmp_path) not in sys.path  # a library's later optional import cannot find it
    assert import_object("speedtronic_cwd_probe:VALUE", "model.name") == 7


def test_builtin_paths_never_put_the_working_directory_on_the_path(tmp_path, monkeypatch):
    (tmp_path / "tensorflow.py").write_text("raise SystemExit('local tensorflow.py ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    import_object("speedtronic.observe.metrics:MetricLogger", "logging.hooks")
    import_modules([])
    assert str(tmp_path) not in sys.path
