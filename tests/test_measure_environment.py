"""The environment fingerprint and the key that says which measurements compare."""

from __future__ import annotations

import pytest
import torch

from pareto.measure.environment import KEY_FIELDS, environment_key, fingerprint


def test_fingerprint_keys_and_stable_key() -> None:
    fp = fingerprint("cpu", 2)
    assert set(fp) == {
        "device", "device_name", "driver", "torch_version", "python_version",
        "platform", "cpu_model", "cpu_count", "threads", "hostname", "onnxruntime_version",
        "torchao_version", "cuda_math",
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
