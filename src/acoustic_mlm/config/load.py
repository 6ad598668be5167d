"""Reading a configuration file: strict YAML (UTF-8 only, no aliases, no duplicate keys, a size
limit), a path that must be a regular file, then `validate`. Every refusal is one line naming the file.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from acoustic_mlm.config.checks import shorten, validate
from acoustic_mlm.config.sections import Config
from acoustic_mlm.errors import ConfigError, one_line

MAX_CONFIG_BYTES = 1 << 20  # the presets are under 10 KB; a larger file is not a configuration


def load(path: str | Path) -> Config:
    """Read, validate and type a YAML configuration file: the one `Config` every stage reads."""
    path = Path(path)
    _check_config_path(path)
    return Config._from_checked(validate(read_yaml(path), source=str(path)), str(path))


def from_mapping(cfg: dict, source: str = "config") -> Config:
    """A configuration mapping (as the YAML file holds it; a program's edited copy of one), validated
    and typed: the only way to a `Config` besides `load`. Stage entries take a `Config`, never a mapping."""
    return Config._from_checked(validate(cfg, source), source)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases and duplicate keys.

    Aliases are refused outright, not capped: a configuration never needs one, and refusing the
    first alias event ends a "billion laughs" file before anything is expanded. Duplicate keys
    (PyYAML keeps the last silently) are refused with the key and both lines.
    """

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(
                f"line {event.start_mark.line + 1}: YAML alias '*{shorten(event.anchor)}' is not "
                "supported in a configuration; write the value out"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` copies keys in from elsewhere: write them out
                raise ConfigError(
                    f"line {key_node.start_mark.line + 1}: YAML merge key '<<' is not supported in a "
                    "configuration; write the keys out"
                )
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first != key_node.start_mark.line + 1:
                raise ConfigError(
                    f"line {key_node.start_mark.line + 1}: duplicate key {shorten(key)!r} "
                    f"(first at line {first}); keep one"
                )
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path):
    """The YAML document in `path`, read strictly: UTF-8 only, no aliases, no duplicate keys, at
    most MAX_CONFIG_BYTES. Every refusal is one ConfigError line naming the file."""
    path = Path(path)
    _check_config_path(path)
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size} bytes; a configuration file is at most {MAX_CONFIG_BYTES} bytes")
    try:
        raw = path.read_bytes()
    except OSError as exc:  # no read permission, an I/O error: the file, not the install
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or one_line(exc)}); check its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); save the file as UTF-8"
        ) from None
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if document is None:
        raise ConfigError(f"{path}: the file is empty (no settings); copy a preset from config/ and edit it")
    return document


def _check_config_path(path: Path) -> None:
    """The configuration path is a regular file (or a link to one): a folder, a device or a FIFO is
    named as what it is, never opened (reading a FIFO would wait forever)."""
    if path.is_file():
        return
    if path.is_dir():
        raise ConfigError(f"{path}: a folder, not a configuration file; name a YAML file (e.g. config/smoke.yaml)")
    if path.exists():
        raise ConfigError(f"{path}: not a regular file (a device, FIFO or socket); name a YAML file")
    if path.is_symlink():
        raise ConfigError(f"{path}: a broken link; configuration file not found")
    raise ConfigError(f"{path}: configuration file not found")
