"""What this CPU offers int8 inference: the flags that decide onnxruntime's kernels."""
from __future__ import annotations

from pathlib import Path

_VNNI = ("avx512_vnni", "avx_vnni")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The ``flags`` of the first processor in ``/proc/cpuinfo`` (or of ``cpuinfo``, its text);
    empty where there is no such file (not Linux): callers then assume the weakest CPU."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # Features: ARM's spelling
            return set(value.split())
    return set()


def describe(flags: set[str]) -> str:
    """``AVX2 yes, AVX-512 yes, VNNI yes (avx512_vnni)``: what int8 speed depends on."""
    vnni = [f for f in _VNNI if f in flags]
    return (f"AVX2 {'yes' if 'avx2' in flags else 'no'}, AVX-512 {'yes' if 'avx512f' in flags else 'no'}, "
            f"VNNI {'yes (' + ', '.join(vnni) + ')' if vnni else 'no'}")


def flag_summary(flags: set[str]) -> dict[str, bool]:
    return {"avx2": "avx2" in flags, "avx512": "avx512f" in flags, "vnni": any(f in flags for f in _VNNI)}


def reduce_range(flags: set[str]) -> tuple[bool, str]:
    """Whether weights should be quantized to 7 bits on this CPU, and why.

    Without VNNI, onnxruntime's x86 uint8×int8 kernels add pairs of products in int16
    (vpmaddubsw), which saturates past 32767 (255·127·2 = 64770): 7-bit weights keep every
    pair sum in range. VNNI (avx512_vnni / avx_vnni) accumulates in int32, so 8 bits are safe.
    """
    vnni = [f for f in _VNNI if f in flags]
    if vnni:
        return False, (f"reduce_range off: this CPU has VNNI ({', '.join(vnni)}), whose int8 kernels accumulate "
                       f"in int32 without saturating")
    return True, ("reduce_range on (7-bit weights): this CPU has no VNNI (no avx512_vnni / avx_vnni flag), and "
                  "onnxruntime's uint8×int8 kernels without it saturate int16 pair sums")


# oneDNN ISA caps (DNNL_MAX_CPU_ISA) below which its int8 kernels have no VNNI instruction
_NO_VNNI_ISAS = {"SSE41", "AVX", "AVX2", "AVX512_MIC", "AVX512_MIC_4OPS", "AVX512_CORE"}


def onednn_vnni(flags: set[str], max_isa: str | None = None) -> tuple[bool, str]:
    """Whether MXNet's oneDNN int8 kernels run with VNNI here, and why: the CPU must have it and
    ``DNNL_MAX_CPU_ISA`` (``max_isa``; default: the environment's) must not cap oneDNN below it."""
    import os

    isa = (os.environ.get("DNNL_MAX_CPU_ISA") or os.environ.get("MKLDNN_MAX_CPU_ISA") or ""
           if max_isa is None else max_isa).upper()
    vnni = [f for f in _VNNI if f in flags]
    if not vnni:
        return False, "this CPU has no VNNI (no avx512_vnni / avx_vnni flag)"
    if isa in _NO_VNNI_ISAS or (isa == "AVX2_VNNI" and "avx_vnni" not in flags):
        return False, f"DNNL_MAX_CPU_ISA={isa} keeps oneDNN off this CPU's VNNI ({', '.join(vnni)})"
    return True, f"this CPU has VNNI ({', '.join(vnni)})" + (f" and DNNL_MAX_CPU_ISA={isa} allows it" if isa else "")
