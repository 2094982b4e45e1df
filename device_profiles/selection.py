"""Which of a profile's units a plan may use: ``--pus``, ``--exclude-pus`` and ``--include-unavailable``.

By default a plan uses every unit an onnxruntime release can drive. A unit whose profile says
``runtime = "unavailable"`` (the VIM3's Mali GPU, the A1000's NPU and DSPs) is left out unless
``include_unavailable``: such plans are what-if only, and the compiler refuses them.
"""

from __future__ import annotations

from collections.abc import Sequence

from device_profiles.schema import DeviceProfile, ProfileError


def select_units(
    profile: DeviceProfile,
    pus: Sequence[str] = (),
    exclude: Sequence[str] = (),
    include_unavailable: bool = False,
) -> DeviceProfile:
    """``profile`` restricted to the units a plan may use (see the module docstring); unknown names are refused."""
    known = [p.name for p in profile.pus]
    for name in (*pus, *exclude):
        if name not in known:
            raise ProfileError(f"profile {profile.name!r} has no unit {name!r}; its units are {', '.join(known)}")
    chosen = list(pus) or known
    if not include_unavailable:
        for name in pus:
            p = profile.pu(name)
            if not p.deployable:
                raise ProfileError(
                    f"unit {name} of {profile.name} cannot run: {unavailable_reason(profile, name)}. "
                    "Add --include-unavailable for a what-if plan (not deployable)"
                )
        chosen = [n for n in chosen if profile.pu(n).deployable]
    chosen = [n for n in chosen if n not in set(exclude)]
    if not chosen:
        raise ProfileError(
            f"no unit of {profile.name} is left to plan on (units: {', '.join(known)}; "
            f"left out: {', '.join(sorted(set(known) - set(chosen)))})"
        )
    if chosen == known:
        return profile
    return profile.restricted(chosen)


def unavailable_reason(profile: DeviceProfile, name: str) -> str:
    """Why no onnxruntime drives unit ``name`` (the profile's citation)."""
    runtime = profile.pu(name).runtime
    return runtime.cite if runtime is not None and runtime.cite else "its profile says no onnxruntime drives it"


def undeployable_units(profile: DeviceProfile, units: Sequence[str]) -> list[str]:
    """The units among ``units`` (PU names) that no onnxruntime release can drive, in the order given."""
    names = {p.name for p in profile.undeployable()}
    return [u for u in units if u in names]
