"""Profiling sessions on a board through its agent: the same run as locally, timed on the board.

The host cuts the blocks and partitions, sends each (with its real input tensors) to
the agent's ``ProfileOps``, and writes every result into the host's cost table as soon
as it arrives, so an interrupted session continues where it stopped.
"""

from __future__ import annotations

import grpc
import numpy as np

from agents.client import AgentClient, AgentError
from agents.proto import parapipe_agent_pb2 as pb
from agents.tensors import to_message
from device_profiles.schema import ProcessingUnit
from profiler.measure import PuConfig, Timing
from profiler.runtime import LOAD_FAILED, ProviderFailed


class RemoteTimer:
    """``profiler.session.Timer`` that measures on the board (energy: none is read remotely yet)."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self._ort_version: str | None = None

    @property
    def ort_version(self) -> str:
        """The onnxruntime version of the board's agent (asked once)."""
        if self._ort_version is None:
            self._ort_version = self.client.status().ort_version
        return self._ort_version

    def _request(
        self, model: bytes, feeds: dict[str, np.ndarray], cfg: PuConfig, warmup: int, repeats: int, per_op: bool
    ):
        return pb.ProfileRequest(
            model=model,
            cores=list(cfg.cores),
            threads=cfg.threads,
            repeats=repeats,
            warmup=warmup,
            per_op=per_op,
            throttle_percent=cfg.throttle_percent or 0.0,
            inputs=[to_message(k, v) for k, v in feeds.items()],
            provider=cfg.provider,
            provider_options=dict(cfg.provider_options),
        )

    def _profile(self, request: pb.ProfileRequest, cfg: PuConfig) -> pb.ProfileReply:
        """The agent's timings; ``ProviderFailed`` (naming the unit) where its provider could not load the model."""
        try:
            return self.client.profile_ops(request)
        except AgentError as exc:
            if exc.code == grpc.StatusCode.FAILED_PRECONDITION and LOAD_FAILED in str(exc):
                raise ProviderFailed(cfg.pu, cfg.provider, (), str(exc).split(LOAD_FAILED, 1)[1].strip()) from None
            raise

    def op_profile(
        self, model: bytes, feeds: dict[str, np.ndarray], cfg: PuConfig, warmup: int, repeats: int
    ) -> dict[str, Timing]:
        reply = self._profile(self._request(model, feeds, cfg, warmup, repeats, True), cfg)
        return {t.node: Timing(t.median_ms, t.mean_ms, t.p10_ms, t.p90_ms, t.repeats, 0.0) for t in reply.timings}

    def time(
        self, model: bytes, feeds: dict[str, np.ndarray], cfg: PuConfig, warmup: int, repeats: int, pu: ProcessingUnit
    ) -> Timing:
        reply = self._profile(self._request(model, feeds, cfg, warmup, repeats, False), cfg)
        t = reply.timings[0]
        return Timing(t.median_ms, t.mean_ms, t.p10_ms, t.p90_ms, t.repeats, 0.0, declined=tuple(t.declined))
