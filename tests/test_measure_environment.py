"""The environment fingerprint and the key that says which measurements compare."""

from __future__ import annotations

import os

import pytest
import torch

from pareto.machine import KEY_FIELDS, environment_key
from pareto.measure.environment import fingerprint


def test_fingerprint_keys_and_stable_key() -> None:
    fp = fingerprint("cpu", 2)
    assert set(fp) == {
        "device", "device_name", "driver", "torch_version", "python_version",
        "platform", "cpu_model", "cpu_count", "threads", "hostname", "onnxruntime_version",
        "torchao_version", "cuda_math", "cpu_features", "cpu_id", "cpu_capability", "cpu_isa_limits",
    }  # fmt: skip
    assert fp["device"] == "cpu" and fp["threads"] == 2 and fp["driver"] is None and fp["cuda_math"] is None
    assert fp["device_name"] == fp["cpu_model"] and fp["cpu_model"]
    assert fp["torch_version"] == torch.__version__
    key = environment_key(fp)
    assert key == environment_key(fingerprint("cpu", 2)) and len(key) == 16
    assert environment_key({**fp, "threads": 4}) != key
    assert environment_key({**fp, "python_version": "0.0"}) == key  # not a comparability field
    assert set(KEY_FIELDS) <= set(fp)
    # ONNX Runtime's version is part of the key where it is installed; without it, keys stay as they were
    assert environment_key({**fp, "onnxruntime_version": "1.0.0"}) != environment_key(
        {**fp, "onnxruntime_version": None}
    )
    without = {k: v for k, v in fp.items() if k != "onnxruntime_version"}
    assert environment_key({**fp, "onnxruntime_version": None}) == environment_key(without)
    # torchao's likewise (int8_dynamic prefers its kernels, int8_static needs them)
    assert environment_key({**fp, "torchao_version": "0.18.0"}) != environment_key({**fp, "torchao_version": None})
    without = {k: v for k, v in fp.items() if k != "torchao_version"}
    assert environment_key({**fp, "torchao_version": None}) == environment_key(without)
    # CUDA's float32 math (TF32 on or off) likewise: a GPU environment's, never a CPU's
    tf32 = "float32_matmul_precision=high, cudnn.allow_tf32=True, cudnn.benchmark=False"
    full = "float32_matmul_precision=highest, cudnn.allow_tf32=True, cudnn.benchmark=False"
    assert environment_key({**fp, "cuda_math": tf32}) != environment_key({**fp, "cuda_math": full})
    assert environment_key({**fp, "cuda_math": None}) == environment_key(
        {k: v for k, v in fp.items() if k != "cuda_math"}
    )


def test_cuda_math_settings_say_what_the_process_has(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.measure.environment import cuda_math_settings

    assert "float32_matmul_precision=highest" in cuda_math_settings()
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert "float32_matmul_precision=high," in cuda_math_settings()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU fingerprint is untested")
def test_fingerprint_cuda() -> None:
    fp = fingerprint("cuda:0", 1)
    assert fp["device_name"] == torch.cuda.get_device_name(0)
    assert fp["driver"]
    assert fp["cuda_math"].startswith("float32_matmul_precision=")


SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 8
flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni {extra}

processor\t: 1
flags\t\t: fpu
"""
CASCADE_LAKE = SAPPHIRE_RAPIDS.replace("model\t\t: 143", "model\t\t: 85").format(extra="")
SAPPHIRE_RAPIDS = SAPPHIRE_RAPIDS.format(extra="avx512_bf16 avx512_fp16 avx_vnni amx_bf16 amx_tile amx_int8")
GRAVITON3 = """processor\t: 0
Features\t: fp asimd evtstrm aes asimdhp asimddp sve sve2 bf16 i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def _fingerprint_on(monkeypatch: pytest.MonkeyPatch, cpuinfo: str) -> dict[str, object]:
    import pareto.measure.environment as environment

    monkeypatch.setattr(environment, "_cpu_model", lambda: "Intel(R) Xeon(R) Processor")  # what cloud VMs say
    monkeypatch.setattr(environment, "_cpuinfo", lambda: environment.parse_cpuinfo(cpuinfo))
    return fingerprint("cpu", 2)


def test_cpus_with_other_kernel_features_never_share_an_environment_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.machine import describe_cpu_features

    new, old = _fingerprint_on(monkeypatch, SAPPHIRE_RAPIDS), _fingerprint_on(monkeypatch, CASCADE_LAKE)
    assert new["cpu_model"] == old["cpu_model"] and new["hostname"] == old["hostname"]
    assert environment_key(new) != environment_key(old)
    assert new["cpu_features"] == (
        "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 avx_vnni "
        "amx_tile amx_int8 amx_bf16"
    )
    assert new["cpu_id"] == "family 6 model 143 stepping 8" and old["cpu_id"] == "family 6 model 85 stepping 8"
    assert describe_cpu_features(str(new["cpu_features"])) == (
        "AVX2, AVX-512 (VNNI, bf16, fp16), AVX-VNNI, AMX (int8, bf16)"
    )
    assert describe_cpu_features(str(old["cpu_features"])) == "AVX2, AVX-512 (VNNI)"
    # the same flags under another model number (another generation's kernels and caches): another key
    stepping = _fingerprint_on(monkeypatch, SAPPHIRE_RAPIDS.replace("model\t\t: 143", "model\t\t: 207"))
    assert environment_key(stepping) != environment_key(new)
    arm = _fingerprint_on(monkeypatch, GRAVITON3)
    assert arm["cpu_id"] == "implementer 0x41 part 0xd40"
    assert describe_cpu_features(str(arm["cpu_features"])) == "NEON (dot product, fp16, bf16, int8 matmul), SVE (SVE2)"
    # no /proc/cpuinfo (macOS, Windows): no features recorded, and the key is as it was without them
    bare = _fingerprint_on(monkeypatch, "")
    assert bare["cpu_features"] is None and bare["cpu_id"] is None
    without = {k: v for k, v in bare.items() if k not in {"cpu_features", "cpu_id"}}
    assert environment_key(bare) == environment_key(without)


def test_techniques_say_what_this_cpus_instructions_do_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import pareto.measure.environment as environment
    from pareto.compress import describe_techniques
    from pareto.compress.availability import on_this_cpu

    amx = str(_fingerprint_on(monkeypatch, SAPPHIRE_RAPIDS)["cpu_features"])
    avx512 = str(_fingerprint_on(monkeypatch, CASCADE_LAKE)["cpu_features"])
    assert on_this_cpu("bf16", amx).startswith("native: AMX bf16")
    assert on_this_cpu("bf16", avx512).startswith("not native")
    assert on_this_cpu("fp16", avx512).startswith("not native") and "AVX-512 FP16" in str(on_this_cpu("fp16", amx))
    assert on_this_cpu("ort_int8_dynamic", amx) == "int8 dot products: AMX int8 tiles, AVX-512 VNNI, AVX-VNNI"
    assert on_this_cpu("int8_static", avx512) == "int8 dot products: AVX-512 VNNI"
    assert on_this_cpu("int8_dynamic", "avx2 fma").startswith("no VNNI")
    assert on_this_cpu("lowrank", amx) is None  # the instructions do not decide it
    monkeypatch.setattr(environment, "host_cpu", lambda library="onednn": (avx512, "AVX512"))
    listing = {t["name"]: t for t in describe_techniques("cpu")}
    assert listing["bf16"]["on_this_cpu"].startswith("not native") and "AVX512" in listing["compile"]["on_this_cpu"]
    assert listing["prune_structured"]["on_this_cpu"] is None


def test_kernels_held_below_the_cpu_are_what_the_facts_and_the_key_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.compress.availability import on_this_cpu

    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    free = _fingerprint_on(monkeypatch, SAPPHIRE_RAPIDS)
    assert free["cpu_isa_limits"] is None
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
    held = _fingerprint_on(monkeypatch, SAPPHIRE_RAPIDS)
    # oneDNN may use AVX2 alone: no AVX-512, no VNNI, no AMX in what the facts read
    assert held["cpu_features"] == "avx2 fma f16c"
    assert held["cpu_isa_limits"] == "ONEDNN_MAX_CPU_ISA=AVX2, FBGEMM_ENABLE_INSTRUCTIONS=AVX2"
    assert environment_key(held) != environment_key(free)
    assert on_this_cpu("bf16", held["cpu_features"]).startswith("not native")
    assert on_this_cpu("int8_static", held["cpu_features"]).startswith("no VNNI")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_vnni")  # oneDNN reads it in any case
    assert "avx512_vnni" in _fingerprint_on(monkeypatch, SAPPHIRE_RAPIDS)["cpu_features"]
    assert "amx_tile" not in _fingerprint_on(monkeypatch, SAPPHIRE_RAPIDS)["cpu_features"]


def test_code_compiled_under_kernel_limits_is_cached_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    from pareto.measure.environment import separate_compiled_code

    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert separate_compiled_code() is None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # Inductor's own
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    avx2 = separate_compiled_code()
    assert avx2 is not None and os.environ["TORCHINDUCTOR_CACHE_DIR"] == avx2
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert separate_compiled_code() not in (None, avx2)  # other limits, another folder
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/mine")
    assert separate_compiled_code() is None and os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/mine"


def test_pods_of_one_host_share_an_environment_under_its_host_id(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from pareto.errors import UsageError

    def on(hostname: str) -> dict[str, object]:
        monkeypatch.setattr(socket, "gethostname", lambda: hostname)
        return _fingerprint_on(monkeypatch, SAPPHIRE_RAPIDS)

    monkeypatch.delenv("PARETO_HOST_ID", raising=False)
    # unset: the hostname decides, as before it existed (a database from before keeps matching)
    assert on("pareto-worker-7f9c")["hostname"] == "pareto-worker-7f9c"
    assert environment_key(on("pareto-worker-7f9c")) != environment_key(on("pareto-worker-b2d1"))
    before = {"device_name": "Xeon", "driver": None, "torch_version": "2.13.0+cpu", "cpu_model": "Xeon"}
    assert environment_key({**before, "threads": 2, "hostname": "worker-1"}) == "40f31bf538b8003b"
    monkeypatch.setenv("PARETO_HOST_ID", "   ")  # blank: as unset
    assert on("pareto-worker-7f9c")["hostname"] == "pareto-worker-7f9c"
    # set (to the node's name, say): every pod on the node is one environment, every night
    monkeypatch.setenv("PARETO_HOST_ID", "gpu-node-3")
    first, second = on("pareto-worker-7f9c"), on("pareto-nightly-29012-x8k2p")
    assert first["hostname"] == second["hostname"] == "gpu-node-3"
    assert environment_key(first) == environment_key(second)
    # the hardware facts are still in the key: another CPU under the same identity is another environment
    monkeypatch.setattr(socket, "gethostname", lambda: "pareto-worker-7f9c")
    assert environment_key(_fingerprint_on(monkeypatch, CASCADE_LAKE)) != environment_key(first)
    monkeypatch.setenv("PARETO_HOST_ID", "n" * 257)
    with pytest.raises(UsageError, match="PARETO_HOST_ID is 257 characters long"):
        on("pareto-worker-7f9c")
