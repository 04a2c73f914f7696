"""AWS credentials and config files (INI), as the `s3` secret type reads them: a value error in one line
when the bytes are not such a file, or have no profile to take keys from."""

from __future__ import annotations

import configparser
from collections.abc import Mapping


def parse_ini(content: bytes, what: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(content.decode("utf-8"))
    except (UnicodeDecodeError, configparser.Error) as exc:
        problem = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else type(exc).__name__
        raise ValueError(f"the {what} is not an AWS INI file ({problem})") from None
    return parser


def aws_profile(content: bytes, what: str, need_profile: bool = True) -> Mapping[str, str]:
    """The [default] profile (or the only one) of an AWS credentials/config file."""
    parser = parse_ini(content, what)
    sections = parser.sections()
    if "default" in sections or len(sections) == 1:
        return parser["default" if "default" in sections else sections[0]]
    if need_profile:
        raise ValueError(f"the {what} has no [default] profile (profiles: {', '.join(sections) or 'none'})")
    return {}
