"""Structured pruning of conv channels, transformer FFN width and attention heads; 2:4 sparsity."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pareto.compress import Config, apply
from pareto.compress.prune import MultiHeadSelfAttention, StructuredPrune, TwoFourPrune, two_four_mask
from pareto.errors import TechniqueError
from pareto.task import Task


def _task(model: nn.Module, shape: tuple[int, ...] = (16,)) -> Task:
    return Task(name="tiny", model=model, example_input=lambda b: torch.randn(b, *shape), evaluate=lambda m: 0.0)


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.eval()(x)


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- convolutions ---------------------------------------------------------------------------------


def _cnn() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4, 10),
    )
    model.train()
    with torch.no_grad():  # give the batch norm real statistics
        model(torch.randn(8, 3, 8, 8))
    return model.eval()


def test_structured_prune_removes_conv_channels_through_batchnorm_pooling_and_flatten() -> None:
    model = _cnn()
    pruned = StructuredPrune(ratio=0.5).apply(copy.deepcopy(model), _task(model, (3, 8, 8)))
    assert (pruned[0].out_channels, pruned[1].num_features, pruned[4].in_channels) == (8, 8, 8)
    assert (pruned[4].out_channels, pruned[8].in_features) == (16, 16 * 4)
    assert _forward(pruned, torch.randn(2, 3, 8, 8)).shape == (2, 10)
    assert _n_params(pruned) < _n_params(model) / 2


def test_conv_channel_removal_equals_zeroing_the_channel() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 5, 1)).eval()
    with torch.no_grad():
        model[0].weight[[0, 3]] *= 1e-3  # channels 0 and 3 carry almost nothing
    pruned = StructuredPrune(ratio=0.5).apply(copy.deepcopy(model), _task(model, (3, 6, 6)))
    torch.testing.assert_close(pruned[0].weight, model[0].weight[[1, 2]])
    torch.testing.assert_close(pruned[2].weight, model[2].weight[:, [1, 2]])
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference[0].weight[[0, 3]] = 0
        reference[0].bias[[0, 3]] = 0
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(_forward(pruned, x), _forward(reference, x))


def test_a_depthwise_first_layer_keeps_the_models_input_channels() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, groups=4), nn.ReLU(), nn.Conv2d(4, 8, 1), nn.ReLU(), nn.Conv2d(8, 3, 1))
    pruned = StructuredPrune(ratio=0.5).apply(copy.deepcopy(model.eval()), _task(model, (4, 6, 6)))
    assert (pruned[0].in_channels, pruned[0].out_channels) == (4, 4)  # its channels are the input's
    assert (pruned[2].out_channels, pruned[4].in_channels, pruned[4].out_channels) == (4, 4, 3)
    assert _forward(pruned, torch.randn(2, 4, 6, 6)).shape == (2, 3, 4, 4)


class _ResNet(nn.Module):
    """Stem and two residual blocks with batch norm, the second with a 1x1 projection shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.a1, self.a2 = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.bn_a = nn.BatchNorm2d(16)
        self.b1, self.b2 = nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.Conv2d(32, 32, 3, padding=1)
        self.project = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2), nn.BatchNorm2d(32))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.bn_a(self.a2(torch.relu(self.a1(x)))))
        x = torch.relu(self.project(x) + self.b2(torch.relu(self.b1(x))))
        return self.head(x.mean(dim=(2, 3)))


def test_structured_prune_keeps_a_residual_cnn_consistent_through_adds_and_batch_norms() -> None:
    torch.manual_seed(0)
    model = _ResNet()
    model.train()
    with torch.no_grad():  # real batch-norm statistics
        model(torch.randn(8, 3, 8, 8))
    model.eval()
    pruned = StructuredPrune(ratio=0.5).apply(copy.deepcopy(model), _task(model, (3, 8, 8)))
    # the stem, the first block's output and its shortcut share channels through the add: pruned together
    assert pruned.stem[0].out_channels == pruned.stem[1].num_features == pruned.a2.out_channels == 8
    assert pruned.bn_a.num_features == pruned.b1.in_channels == pruned.project[0].in_channels == 8
    assert pruned.a1.out_channels == pruned.a2.in_channels == 8
    assert pruned.b2.out_channels == pruned.project[1].num_features == pruned.head.in_features == 16
    assert (pruned.stem[0].in_channels, pruned.head.out_features) == (3, 10)  # input and classes kept
    assert _forward(pruned, torch.randn(2, 3, 8, 8)).shape == (2, 10)
    assert _n_params(pruned) < _n_params(model) / 3


# --- transformers ---------------------------------------------------------------------------------


def test_structured_prune_narrows_the_transformer_feed_forward() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=64, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    pruned = StructuredPrune(ratio=0.75).apply(copy.deepcopy(model), _task(model, (5, 16)))
    for block in pruned.layers:
        assert (block.linear1.out_features, block.linear2.in_features) == (16, 16)
        assert block.self_attn.num_heads == 4  # nn.MultiheadAttention is not head-pruned
    x = torch.randn(3, 5, 16)
    assert _forward(pruned, x).shape == (3, 5, 16)
    with torch.no_grad():  # the fused inference fast path and the plain path agree
        assert pruned.train()(x).shape == (3, 5, 16)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = MultiHeadSelfAttention(32, 4)
        self.ffn = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.ffn(x)


def test_structured_prune_removes_attention_heads_and_ffn_units() -> None:
    torch.manual_seed(0)
    model = _Block().eval()
    with torch.no_grad():  # head 2's value and output weights are tiny: it goes first
        model.attn.v_proj.weight[16:24] *= 1e-3
    pruned = StructuredPrune(ratio=0.25).apply(copy.deepcopy(model), _task(model, (7, 32)))
    attn = pruned.attn
    assert attn.num_heads == 3
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features) == (24, 24, 24)
    assert (attn.out_proj.in_features, attn.out_proj.out_features) == (24, 32)
    kept = [*range(0, 16), *range(24, 32)]
    torch.testing.assert_close(attn.q_proj.weight, model.attn.q_proj.weight[kept])
    torch.testing.assert_close(attn.out_proj.weight, model.attn.out_proj.weight[:, kept])
    assert pruned.ffn[0].out_features == 48
    x = torch.randn(2, 7, 32)
    assert _forward(pruned, x).shape == (2, 7, 32)
    # dropping a head equals zeroing its value rows (its attention output is then zero)
    reference = copy.deepcopy(model)
    reference.ffn = pruned.ffn
    with torch.no_grad():
        reference.attn.v_proj.weight[16:24] = 0
        reference.attn.v_proj.bias[16:24] = 0
    torch.testing.assert_close(_forward(pruned, x), _forward(reference, x), rtol=1e-4, atol=1e-5)


def _tiny_bert(layers: int) -> nn.Module:
    """A Hugging Face BertModel: width 32, 4 heads, feed-forward 64, vocabulary 50, no pooler."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64
    )
    torch.manual_seed(0)
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def test_structured_prune_removes_heads_and_ffn_width_of_a_hugging_face_bert_and_keeps_its_width() -> None:
    bert = _tiny_bert(2)

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state.mean(dim=1)

    model = Encoder().eval()
    ids, mask = torch.randint(0, 50, (3, 7)), torch.ones(3, 7, dtype=torch.long)
    task = Task(name="bert", model=model, example_input=lambda b: (ids[:b], mask[:b]), evaluate=lambda m: 0.0)
    pruned = StructuredPrune(ratio=0.5).apply(copy.deepcopy(model), task)
    for layer in pruned.bert.encoder.layer:
        attention = layer.attention.self
        assert (attention.num_attention_heads, attention.all_head_size) == (2, 16)
        assert attention.query.out_features == attention.value.out_features == 16
        assert layer.attention.output.dense.in_features == 16
        assert layer.intermediate.dense.out_features == layer.output.dense.in_features == 32
        assert layer.output.dense.out_features == 32  # the width (embedding size) is kept
    assert pruned.bert.embeddings.word_embeddings.embedding_dim == 32
    with torch.inference_mode():
        assert pruned(ids, mask).shape == (3, 32)


def test_width_ratio_prunes_the_embedding_width_too() -> None:
    bert = _tiny_bert(1)

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert, self.head = bert, nn.Linear(32, 3)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.bert(input_ids=ids).last_hidden_state[:, 0])

    model = Classifier().eval()
    ids = torch.randint(0, 50, (2, 5))
    task = Task(name="bert", model=model, example_input=lambda b: (ids[:b],), evaluate=lambda m: 0.0)
    pruned = StructuredPrune(ratio=0.5, width_ratio=0.25).apply(copy.deepcopy(model), task)
    assert pruned.bert.embeddings.word_embeddings.embedding_dim == 24
    assert (pruned.head.in_features, pruned.head.out_features) == (24, 3)
    with torch.inference_mode():
        assert pruned(ids).shape == (2, 3)


def test_multi_head_self_attention_matches_torch() -> None:
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(16, 4).eval()
    theirs = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(2, 5, 16)
    with torch.inference_mode():
        torch.testing.assert_close(ours(x), theirs(x, x, x, need_weights=False)[0], rtol=1e-4, atol=1e-5)


class _InputResidual(nn.Module):
    """``head(x + fc2(relu(fc1(x))))``: the residual channels are the input's own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(16, 64), nn.Linear(64, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.fc2(torch.relu(self.fc1(x))))


def test_a_residual_stream_that_starts_at_the_input_keeps_its_width() -> None:
    torch.manual_seed(0)
    model = _InputResidual().eval()
    pruned = StructuredPrune(ratio=0.5).apply(copy.deepcopy(model), _task(model))
    assert (pruned.fc1.in_features, pruned.fc2.out_features, pruned.head.in_features) == (16, 16, 16)
    assert pruned.fc1.out_features == pruned.fc2.in_features == 32  # the hidden units still go
    assert _forward(pruned, torch.randn(2, 16)).shape == (2, 3)


class _WithBuffer(nn.Module):
    """A fixed encoding added to the channels: a buffer, invisible to the trace."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = nn.Linear(16, 32), nn.Linear(32, 3)
        self.register_buffer("encoding", torch.randn(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(x) + self.encoding))


def test_a_coupling_the_trace_cannot_see_is_caught_and_said() -> None:
    model = _WithBuffer().eval()
    reason = StructuredPrune(ratio=0.5).available("cpu", _task(model))
    assert reason is not None and reason.startswith("the pruned model no longer runs on example_input(1)")
    with pytest.raises(TechniqueError, match="a buffer added to them"):
        apply(model, Config(techniques=(StructuredPrune(ratio=0.5),), batch_size=1), _task(model))


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)
        self.out = nn.Linear(32, 50, bias=False)
        self.out.weight = self.embed.weight  # the output layer reads the embedding's weights

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc2(torch.relu(self.fc1(self.embed(ids)))))


def test_tied_weights_stay_tied() -> None:
    model = _Tied().eval()
    ids = torch.randint(0, 50, (2, 5))
    task = Task(name="tied", model=model, example_input=lambda b: ids[:b], evaluate=lambda m: 0.0)
    for technique in (StructuredPrune(ratio=0.5), StructuredPrune(ratio=0.5, width_ratio=0.5)):
        pruned = technique.apply(copy.deepcopy(model), task)
        assert pruned.out.weight is pruned.embed.weight and pruned.embed.embedding_dim == 32
        assert pruned.fc1.out_features == pruned.fc2.in_features == 32  # the hidden units still go
        assert pruned(ids).shape == (2, 5, 50)


def test_structured_prune_on_a_model_whose_every_channel_is_output_says_so() -> None:
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
    task = _task(model)
    reason = StructuredPrune(ratio=0.5).available("cpu", task)
    assert reason is not None and "reaches the model's output" in reason
    with pytest.raises(TechniqueError, match=r"^prune_structured\(ratio=0.5\): the model has no group"):
        StructuredPrune(ratio=0.5).apply(model, task)


def test_structured_prune_on_a_model_it_cannot_trace_gives_the_reason() -> None:
    model = nn.MultiheadAttention(16, 4)  # forward needs query, key and value: the example gives one tensor
    reason = StructuredPrune(ratio=0.5).available("cpu", _task(model))
    assert reason is not None and reason.startswith("the model could not be traced on example_input(1): TypeError")


def test_structured_prune_leaves_the_models_requires_grad_flags_and_mode_as_they_were() -> None:
    model = _cnn()
    for p in model.parameters():
        p.requires_grad_(False)
    pruned = StructuredPrune(ratio=0.5).apply(model, _task(model, (3, 8, 8)))
    assert not pruned.training
    assert not any(p.requires_grad for p in pruned.parameters())


# --- 2:4 semi-structured sparsity ------------------------------------------------------------------


def test_two_four_mask_keeps_exactly_the_two_largest_of_every_four() -> None:
    torch.manual_seed(0)
    weight = torch.randn(6, 16)
    mask = two_four_mask(weight)
    groups = mask.reshape(6, 4, 4)
    assert (groups.sum(dim=-1) == 2).all()
    magnitude = weight.abs().reshape(6, 4, 4)
    kept_min = magnitude.masked_fill(~groups, float("inf")).min(dim=-1).values
    dropped_max = magnitude.masked_fill(groups, -1).max(dim=-1).values
    assert (kept_min >= dropped_max).all()
    assert (two_four_mask(torch.zeros(2, 8)).reshape(2, 2, 4).sum(-1) == 2).all()  # ties still give 2


def test_two_four_mask_needs_columns_in_fours() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        two_four_mask(torch.randn(4, 6))


def test_two_four_is_unavailable_without_a_recent_cuda_gpu() -> None:
    reason = TwoFourPrune().available("cpu")
    assert reason is not None
    assert reason.startswith("2:4 sparse kernels need a CUDA GPU of compute capability 8.0 or newer (A100, H100…)")
    model = nn.Sequential(nn.Linear(64, 32))
    with pytest.raises(TechniqueError, match="2:4 sparse kernels need a CUDA GPU"):
        TwoFourPrune().apply(model, _task(model, (64,)))
    small = nn.Sequential(nn.Linear(6, 3))
    with pytest.raises(TechniqueError, match="no nn.Linear whose shape the 2:4 kernels take"):
        TwoFourPrune().apply(small, _task(small, (6,)))


_SM80 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)


@pytest.mark.skipif(not _SM80, reason="2:4 sparse kernels need a CUDA GPU of compute capability 8.0 or newer")
@pytest.mark.parametrize("cast", [[], ["fp16"]], ids=["fp32", "fp16"])
def test_two_four_packs_linear_weights_on_cuda(cast: list[str]) -> None:
    from pareto.compress import get_technique
    from pareto.compress.sparse import semi_structured_linears

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    techniques = (TwoFourPrune(), *(get_technique(name) for name in cast))
    sparse = apply(model, Config(techniques=techniques, batch_size=8), _task(model, (128,)), device="cuda").module
    assert len(semi_structured_linears(sparse)) == 2
    x = torch.randn(8, 128, device="cuda")
    reference = copy.deepcopy(model).cuda()
    with torch.no_grad():
        for layer in (reference[0], reference[2]):
            layer.weight.mul_(two_four_mask(layer.weight))
    torch.testing.assert_close(_forward(sparse, x), _forward(reference, x), rtol=2e-2, atol=2e-2)
