"""Optional dependencies, checked before they are imported so a missing one is a clear message, not a traceback."""

from __future__ import annotations

from models.errors import ModelError


def require_torch() -> None:
    """PyTorch is an extra: only exporting a PyTorch module (and the zoo) needs it."""
    try:
        import onnxscript  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        raise ModelError(
            "exporting PyTorch modules needs PyTorch and onnxscript: pip install 'parapipe[torch]' "
            "(every other command works on .onnx files without them)"
        ) from None
