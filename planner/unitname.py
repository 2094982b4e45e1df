"""``UnitName``: the PU a unit runs on, one PU or several CPU clusters spanned by one session.

A unit's session runs on one PU of the profile, or, with its threads spread over them, on several CPU
clusters of one host. The second is written ``"a+b"`` in plan files (so plans written before this type
existed still load), and parsed once into a ``UnitName``: a ``str`` (a dict key, a JSON string and what
the agents are sent, unchanged) that knows its ``parts``.
"""

from __future__ import annotations

from collections.abc import Iterable

SEPARATOR = "+"


class UnitName(str):
    """One PU's name, or the names of the CPU clusters one session spans joined by ``+``."""

    parts: tuple[str, ...]

    def __new__(cls, name: str) -> UnitName:
        if isinstance(name, UnitName):
            return name
        self = super().__new__(cls, name)
        self.parts = tuple(name.split(SEPARATOR))
        if not all(self.parts):
            raise ValueError(f"{name!r} is not a PU name nor PU names joined by {SEPARATOR!r}")
        return self

    def __getnewargs__(self) -> tuple[str]:
        return (str(self),)

    @classmethod
    def spanning(cls, parts: Iterable[str]) -> UnitName:
        """The unit of one session whose threads span ``parts``."""
        return cls(SEPARATOR.join(parts))

    @property
    def spans(self) -> bool:
        """Whether the session spans several clusters."""
        return len(self.parts) > 1

    @property
    def first(self) -> str:
        """The PU whose host, provider and memory a spanning session uses."""
        return self.parts[0]
