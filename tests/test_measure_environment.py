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
        "torchao_version",
    }  # fmt: skip
    assert fp["device"] == "cpu" and fp["threads"] == 2 and fp["driver"] is None
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU fingerprint is untested")
def test_fingerprint_cuda() -> None:
    fp = fingerprint("cuda:0", 1)
    assert fp["device_name"] == torch.cuda.get_device_name(0)
    assert fp["driver"]
