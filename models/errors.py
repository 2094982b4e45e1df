"""The error hierarchy shared by every part of parapipe.

Each error is raised at an entry point with a message that says what to do; the CLI
turns any ``ParapipeError`` into that message and exit code 2.
"""

from __future__ import annotations


class ParapipeError(Exception):
    """Base of every error parapipe raises on purpose."""


class ModelError(ParapipeError):
    """A model (torch module or ONNX file) cannot be used as given."""


class ExportError(ModelError):
    """Exporting a torch module to ONNX failed or gave wrong results."""


class PartitionError(ModelError):
    """A grouping of nodes into partitions is not valid, or the cut partitions disagree."""
