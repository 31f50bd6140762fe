"""``--precision auto``: the mixed-precision policy the hardware computes faster, else float32.

A mixed policy is only worth its changed numerics where the device has the instructions for it. A CPU
without bfloat16 instructions emulates ``mixed_bfloat16`` through float32 conversions around every op:
on a 2-core AMD EPYC with AVX2 and no AVX-512 BF16 the transformer's step ran at 0.25x float32
(BENCHMARKS.md), and a comparison of methods there measures the emulation. So ``auto`` takes a mixed
policy only where the hardware is known to gain from it:

- a GPU of compute capability 8.0 or more: ``mixed_bfloat16`` (its tensor cores take bfloat16, and no
  loss scale is needed); 7.x: ``mixed_float16`` (Keras' mixed-precision guide: tensor cores from 7.0);
- a CPU with AMX (``amx_bf16``): ``mixed_bfloat16`` (oneDNN's bfloat16 matrix kernels on AMX tiles);
- anything else: ``float32``. A CPU with ``avx512_bf16`` but no AMX computes bfloat16 dot products
  natively, yet measured no faster than float32 (the transformer at 0.95x on an AMD EPYC with
  avx512_bf16, BENCHMARKS.md), so ``auto`` keeps float32 there too.

The same rule tells a run whose policy the flag forced whether the hardware emulates it (``emulated``),
which its header records and the report says beside it. Each process decides from its own hardware,
read once: the CPU's flags from /proc/cpuinfo, the GPUs' compute capabilities from ``nvidia-smi`` where
it is installed (no GPU path has run on the machines hvdps is tested on)."""
import dataclasses
import functools
import os
import shutil
import subprocess
from typing import Optional, Tuple

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
AUTO = "auto"
CPU_BF16 = ("avx512_bf16", "amx_bf16")       # a CPU's bfloat16 instructions
CPU_FP16 = ("avx512_fp16", "amx_fp16")       # a CPU's float16 instructions
NVIDIA_SMI_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What one process computes on: its CPU's model name and the flags that bear on a policy, and each
    GPU's compute capability ((major, minor), ...)."""
    cpu: str = ""
    cpu_flags: frozenset = frozenset()
    gpus: Tuple[Tuple[int, int], ...] = ()

    def said(self):
        """The hardware in the words a header gives: the GPUs, else the CPU and its bfloat16/float16 flags."""
        if self.gpus:
            return "GPU compute capability " + ", ".join(f"{a}.{b}" for a, b in self.gpus)
        have = [f for f in CPU_BF16 + CPU_FP16 if f in self.cpu_flags]
        return f"{self.cpu or 'CPU'}: " + (", ".join(have) if have else "no " + " or ".join(CPU_BF16))


@dataclasses.dataclass(frozen=True)
class Choice:
    """The policy a run trains in: ``policy``; ``asked``, ``auto`` or the policy the flag named;
    ``emulated``, whether the hardware lacks the instructions of the policy's compute type; ``why``,
    one sentence for the run's header and the report."""
    policy: str
    asked: str
    emulated: bool
    why: str

    def to_dict(self):
        return dataclasses.asdict(self)


def native(policy, hw):
    """Whether ``hw`` computes ``policy``'s compute type with instructions of its own (float32 always)."""
    if policy == "float32":
        return True
    if hw.gpus:
        need = (8, 0) if policy == "mixed_bfloat16" else (5, 3)       # float16 arithmetic from 5.3
        return min(hw.gpus) >= need
    flags = CPU_BF16 if policy == "mixed_bfloat16" else CPU_FP16
    return any(f in hw.cpu_flags for f in flags)


def auto_policy(hw):
    """(the policy ``auto`` takes on ``hw``, why): see the module's docstring."""
    if hw.gpus:
        low = min(hw.gpus)
        if low >= (8, 0):
            return "mixed_bfloat16", f"{hw.said()}, bfloat16 on its tensor cores, no loss scale needed"
        if low >= (7, 0):
            return "mixed_float16", f"{hw.said()}, float16 on its tensor cores, no bfloat16 below 8.0"
        return "float32", f"{hw.said()}, no tensor cores: a mixed policy would gain nothing"
    if "amx_bf16" in hw.cpu_flags:
        return "mixed_bfloat16", f"{hw.said()}, bfloat16 matrix kernels on AMX"
    if "avx512_bf16" in hw.cpu_flags:
        return "float32", (f"{hw.said()}, bfloat16 dot products but no AMX, on which bfloat16 measured no "
                           f"faster than float32")
    return "float32", f"{hw.said()}, so mixed_bfloat16 would be emulated, at a quarter of float32's speed on such a CPU"


def choose(asked, hw=None):
    """The Choice for ``--precision asked`` (``auto`` or a policy) on ``hw`` (default: this process's)."""
    hw = hardware() if hw is None else hw
    if asked == AUTO:
        policy, why = auto_policy(hw)
        return Choice(policy, AUTO, not native(policy, hw), f"--precision auto chose {policy}: {why}")
    emulated = not native(asked, hw)
    why = f"--precision {asked}" + (f": emulated, {hw.said()}" if emulated else "")
    return Choice(asked, asked, emulated, why)


def of_config(cfg):
    """The Choice a Config trains in (its ``precision``, and whether ``auto`` chose it), on this process's hardware."""
    choice = choose(AUTO if cfg.precision_auto else cfg.precision)
    return choice if choice.policy == cfg.precision else choose(cfg.precision)


@functools.lru_cache(maxsize=1)
def hardware():
    """This process's Hardware, read once."""
    return Hardware(*_cpu(), gpus=_gpus())


def _cpu(path="/proc/cpuinfo"):
    """(model name, {flags}) of the first processor /proc/cpuinfo lists; ("", {}) where it cannot be read."""
    model, flags = "", frozenset()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = " ".join(value.split())
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


def _gpus():
    """Each visible NVIDIA GPU's compute capability, from ``nvidia-smi`` (bounded); () where there is none."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1") or not shutil.which("nvidia-smi"):
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(parsed for parsed in map(_capability, out.split()) if parsed is not None)


def _capability(text) -> Optional[Tuple[int, int]]:
    major, _, minor = text.strip().partition(".")
    return (int(major), int(minor or 0)) if major.isdigit() and (minor or "0").isdigit() else None
