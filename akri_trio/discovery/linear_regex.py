"""Regular expressions from Configurations, matched in time linear in the input (RE2).

A discoveryDetails regex is written by whoever may create a Configuration and is matched on the
agent against text that devices and the network supply (udev KERNELS, DRIVERS, ATTRS; zeroconf
instance and host names). Python's `re` backtracks: `(a+)+b` or `(a|aa)*b` against a few dozen
characters runs for minutes, on the agent's event loop or a worker thread. RE2 (google-re2)
guarantees time linear in the input and refuses, at compile time, what it cannot do that way
(backreferences, look-around). That is also the syntax of upstream's Rust `regex` crate, so a
pattern upstream accepts is accepted here. Globs (udev's fnmatch) are translated to RE2 too, so
every pattern a handler matches runs on this one engine.

Pure: no I/O; compiled patterns are immutable and shared freely between threads.
"""

from __future__ import annotations

from typing import Final

import re2

# RE2's own bound on the compiled program; a pattern needing more is refused, not truncated.
MAX_PROGRAM_BYTES: Final = 8 << 20


class RegexError(ValueError):
    """A pattern RE2 cannot compile; str() is RE2's reason."""


def _options(dot_matches_newline: bool) -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refused pattern to stderr
    options.max_mem = MAX_PROGRAM_BYTES
    options.dot_nl = dot_matches_newline
    return options


def _utf8(text: str) -> bytes:
    # Matching runs on UTF-8 bytes. A lone surrogate (undecodable bytes smuggled into a str)
    # becomes "?" rather than an exception in the middle of a scan.
    return text.encode("utf-8", "replace")


class Regex:
    """One compiled pattern. Equal when the source and flags are (so frozen attrs classes
    holding one keep comparing by value)."""

    __slots__ = ("_compiled", "dot_matches_newline", "source")

    def __init__(self, source: str, *, dot_matches_newline: bool = False) -> None:
        self.source = source
        self.dot_matches_newline = dot_matches_newline
        try:
            self._compiled = re2.compile(source, _options(dot_matches_newline))
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", "replace")
            raise RegexError(str(reason)) from None
        except UnicodeEncodeError:
            raise RegexError("contains a lone surrogate (not valid Unicode)") from None

    def fullmatch(self, text: str) -> bool:
        """Does the pattern match all of `text` (anchored at both ends)?"""
        return self._compiled.fullmatch(_utf8(text)) is not None

    def spans_whole(self, text: str) -> bool:
        """Does the leftmost-first match span all of `text`? Rust's `find` followed by a
        check of the span, which is not `fullmatch`: `a|ab` does not span "ab"."""
        data = _utf8(text)
        found = self._compiled.search(data)
        return found is not None and found.start() == 0 and found.end() == len(data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Regex):
            return NotImplemented
        return (self.source, self.dot_matches_newline) == (
            other.source,
            other.dot_matches_newline,
        )

    def __hash__(self) -> int:
        return hash((self.source, self.dot_matches_newline))

    def __repr__(self) -> str:
        return f"Regex({self.source!r})"


def literal(char: str) -> str:
    """One character as an RE2 literal, inside or outside a bracket expression."""
    if char.isascii() and (char.isalnum() or char == "_"):
        return char
    return f"\\x{{{ord(char):x}}}"


# Matches nothing (RE2 has no `(?!)`): the empty complement of every code point.
NOTHING: Final = r"[^\x00-\x{10ffff}]"
