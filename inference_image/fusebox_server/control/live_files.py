"""The ConfigMap-carried files, re-read while the server runs.

Why: `--templates-file`, `--canned-answers-file` and `--quality-file`
come from the service's ConfigMap, and an edit must reach running pods
without a restart. The kubelet updates a configMap volume by writing a new
directory and swapping the `..data` symlink, so neither the path nor
(reliably) the mtime changes the way a watcher expects: the content is
compared instead (the files are small). A thread polls about once a second,
off the event loop; a new file that does not parse keeps the previous
values and logs a warning, never a crash.
Consumers read `LiveSettings`, whose fields are replaced whole.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from fusebox_server.config import (
    ConfigError,
    QualitySettings,
    ServerConfig,
    read_quality_settings,
    read_string_list,
    read_string_map,
)

log = structlog.get_logger("fusebox_server")

POLL_SECONDS: Final = 1.0


@dataclass
class LiveSettings:
    templates: tuple[str, ...] = ()
    canned_answers: Mapping[str, str] = field(default_factory=dict)
    quality: QualitySettings = QualitySettings()


@dataclass
class WatchedFile:
    """One file: how to parse it, what to do with the result, and the content last applied."""

    path: Path
    parse: Callable[[Path], object]
    apply: Callable[[object], None]
    content: bytes | None = None

    def poll(self) -> bool:
        """Apply the file if its content changed; True when it did."""
        try:
            content = self.path.read_bytes()
        except OSError as error:
            if self.content is not None:
                log.warning("config_file_unreadable", path=str(self.path), error=str(error))
                self.content = None  # warn once; apply it again when it comes back
            return False
        if content == self.content:
            return False
        self.content = content
        try:
            value = self.parse(self.path)
        except ConfigError as error:
            log.warning("config_file_rejected", path=str(self.path), error=str(error))
            return False
        self.apply(value)
        log.info("config_file_reloaded", path=str(self.path))
        return True


def watched_files(
    config: ServerConfig,
    live: LiveSettings,
    on_templates: Callable[[tuple[str, ...]], None],
) -> list[WatchedFile]:
    """The configured files; each starts from what `parse_config` read at start."""

    def set_templates(value: object) -> None:
        assert isinstance(value, tuple)
        on_templates(value)
        live.templates = value

    def set_canned(value: object) -> None:
        assert isinstance(value, dict)
        live.canned_answers = value

    def set_quality(value: object) -> None:
        assert isinstance(value, QualitySettings)
        live.quality = value

    candidates = (
        (config.templates_file, "templates file", read_string_list, set_templates),
        (config.canned_answers_file, "canned answers file", read_string_map, set_canned),
        (config.quality_file, "quality file", read_quality_settings, set_quality),
    )
    found: list[WatchedFile] = []
    for path, what, reader, apply in candidates:
        if path is None:
            continue

        def parse(
            p: Path, reader: Callable[[Path, str], object] = reader, what: str = what
        ) -> object:
            return reader(p, what)

        watched = WatchedFile(path, parse, apply)
        try:
            watched.content = path.read_bytes()  # parse_config already applied this content
        except OSError:
            watched.content = None
        found.append(watched)
    return found


class FileWatcher(threading.Thread):
    def __init__(self, files: list[WatchedFile], interval_seconds: float = POLL_SECONDS) -> None:
        super().__init__(name="fusebox-config-files", daemon=True)
        self.files = files
        self._interval = interval_seconds
        self._stopping = threading.Event()

    def poll_once(self) -> int:
        changed = 0
        for watched in self.files:
            try:
                changed += watched.poll()
            except Exception as error:  # a consumer's bug must not end the watching
                log.warning("config_file_apply_failed", path=str(watched.path), error=repr(error))
        return changed

    def run(self) -> None:
        while not self._stopping.wait(self._interval):
            self.poll_once()

    def stop(self) -> None:
        self._stopping.set()
