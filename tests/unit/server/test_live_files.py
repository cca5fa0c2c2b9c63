"""ConfigMap files re-read on change, the way the kubelet changes them (a `..data` swap)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fusebox_server.config import QualitySettings, ServerConfig
from fusebox_server.control.live_files import FileWatcher, LiveSettings, watched_files


def kubelet_volume(root: Path, files: dict[str, str], generation: int) -> None:
    """Write a new timestamped dir, point `..data` at it (atomic rename), link the names."""
    target = root / f"..2026_{generation}"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text)
    temporary = root / "..data_tmp"
    temporary.symlink_to(target.name)
    os.replace(temporary, root / "..data")
    for name in files:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def test_canned_answers_and_templates_follow_the_volume(tmp_path: Path) -> None:
    kubelet_volume(
        tmp_path,
        {"canned.json": json.dumps({"hi": "A"}), "templates.json": json.dumps(["t1"])},
        1,
    )
    config = ServerConfig(
        model_dir=tmp_path,
        canned_answers_file=tmp_path / "canned.json",
        templates_file=tmp_path / "templates.json",
        canned_answers={"hi": "A"},
        templates=("t1",),
    )
    live = LiveSettings(config.templates, dict(config.canned_answers), ())
    encoded: list[tuple[str, ...]] = []
    watcher = FileWatcher(watched_files(config, live, encoded.append))
    assert watcher.poll_once() == 0  # what parse_config read is not applied again

    kubelet_volume(
        tmp_path,
        {"canned.json": json.dumps({"hi": "B"}), "templates.json": json.dumps(["t1", "t2"])},
        2,
    )
    assert watcher.poll_once() == 2
    assert live.canned_answers == {"hi": "B"}
    assert live.templates == ("t1", "t2") and encoded == [("t1", "t2")]

    # A bad new file keeps the previous values; a good one after it applies.
    kubelet_volume(
        tmp_path, {"canned.json": "{broken", "templates.json": json.dumps(["t1", "t2"])}, 3
    )
    assert watcher.poll_once() == 0
    assert live.canned_answers == {"hi": "B"}
    kubelet_volume(
        tmp_path,
        {"canned.json": json.dumps({"hi": "C"}), "templates.json": json.dumps(["t1", "t2"])},
        4,
    )
    assert watcher.poll_once() == 1 and live.canned_answers == {"hi": "C"}


def test_a_file_that_disappears_and_returns_is_applied_again(tmp_path: Path) -> None:
    path = tmp_path / "quality.json"
    path.write_text(json.dumps({"blockedTerms": ["x"]}))
    config = ServerConfig(
        model_dir=tmp_path, quality_file=path, quality=QualitySettings(blocked_terms=("x",))
    )
    live = LiveSettings((), {}, config.quality)
    watcher = FileWatcher(watched_files(config, live, lambda _: None))
    path.unlink()
    assert watcher.poll_once() == 0 and live.quality.blocked_terms == ("x",)
    path.write_text(json.dumps({"blockedTerms": ["y"]}))
    assert watcher.poll_once() == 1 and live.quality.blocked_terms == ("y",)


def test_every_quality_setting_follows_the_volume(tmp_path: Path) -> None:
    kubelet_volume(tmp_path, {"quality.json": json.dumps({"sampleRate": 0.1})}, 1)
    config = ServerConfig(model_dir=tmp_path, quality_file=tmp_path / "quality.json")
    live = LiveSettings((), {}, config.quality)
    watcher = FileWatcher(watched_files(config, live, lambda _: None))
    edited = {"sampleRate": 1, "maxOutputInputRatio": 2.5, "blockedTerms": ["leak"]}
    kubelet_volume(tmp_path, {"quality.json": json.dumps(edited)}, 2)
    assert watcher.poll_once() == 1
    assert live.quality == QualitySettings(1.0, 2.5, ("leak",))
    # A key the server does not know keeps the previous settings (and logs why).
    kubelet_volume(tmp_path, {"quality.json": json.dumps({"sampleRat": 0.5})}, 3)
    assert watcher.poll_once() == 0
    assert live.quality == QualitySettings(1.0, 2.5, ("leak",))
