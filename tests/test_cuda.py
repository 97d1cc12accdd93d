"""The checks that only a GPU can run (issue 12): mixed precision on CUDA for every variant (the adaptive-input
index_copy crash, fp16 overflows), R-Transformer backward in eval mode under cuDNN, SDPA reaching a fused kernel,
FlexAttention training (the patterns' and Transformer-XL's relative attention), and the compiled Transformer-XL.
Skipped where CUDA is absent; run on a GPU machine with

    HF_HUB_OFFLINE=1 python -m pytest -q tests/test_cuda.py
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiny_configs
from test_mixed_precision import (
    PRECISIONS,
    VARIANTS,
    attention_cases,
    build,
    check_mixed_precision_training,
    loss_and_gradients,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# the variants with an SDPA path (not the Reformer's LSH attention, not the ACT RNN, which has no attention)
SDPA_VARIANTS = [name for name in VARIANTS if tiny_configs.default_attention(VARIANTS[name][0]) == "sdpa"]


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize(("variant", "attn_implementation"), attention_cases(VARIANTS))
def test_trains_in_mixed_precision_on_cuda(variant, attn_implementation, precision):
    check_mixed_precision_training(variant, precision, "cuda", attn_implementation=attn_implementation)


@pytest.mark.parametrize("precision", ["autocast-bf16", "autocast-fp16"])
@pytest.mark.parametrize(("variant", "attn_implementation"), attention_cases(["transfo-xl div_val 2"]))
def test_transfo_xl_wt103_style_div_val_4_under_autocast(variant, attn_implementation, precision):
    """The paper's wt103 head (div_val 4, three tail clusters) crashed in the adaptive input under autocast."""
    check_mixed_precision_training(
        variant,
        precision,
        "cuda",
        attn_implementation=attn_implementation,
        vocab_size=80,
        cutoffs=[10, 20, 40],
        div_val=4,
        d_embed=64,
    )


@pytest.mark.parametrize("rnn_type", ["GRU", "LSTM", "RNN"])
def test_r_transformer_backward_in_eval_mode_under_cudnn(rnn_type):
    """cuDNN's eval-mode RNN has no backward; the LocalRNN runs it with cuDNN off then (attribution, RL)."""
    assert torch.backends.cudnn.enabled
    model, ids = build("r_transformer", "cuda", rnn_type=rnn_type)
    loss, gradients = loss_and_gradients(model.eval(), ids)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in gradients.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", SDPA_VARIANTS)
def test_sdpa_reaches_a_fused_kernel(variant, dtype):
    """With SDPA restricted to the flash and memory-efficient kernels (no math fallback), every SDPA variant trains
    in half precision: its masks and additive terms have a shape and dtype the fused kernels accept."""
    model, ids = build(variant, "cuda", attn_implementation="sdpa")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]), torch.autocast("cuda", dtype):
        loss, gradients = loss_and_gradients(model, ids)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in gradients.values())


@pytest.mark.parametrize("variant", ["sparse_transformer", "image_transformer"])
def test_flex_attention_trains_like_the_dense_reference(variant):
    flex, ids = build(variant, "cuda", pattern_implementation="flex")
    dense, _ = build(variant, "cuda", pattern_implementation="dense")
    dense.load_state_dict(flex.state_dict())
    flex_loss, flex_gradients = loss_and_gradients(flex, ids)
    dense_loss, dense_gradients = loss_and_gradients(dense, ids)
    torch.testing.assert_close(flex_loss, dense_loss, atol=1e-4, rtol=1e-4)
    for name, gradient in dense_gradients.items():
        torch.testing.assert_close(flex_gradients[name], gradient, atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize("variant", ["transfo-xl div_val 2", "gtrxl", "adaptive_span"])
def test_relative_flex_attention_trains_like_sdpa(variant):
    """Transformer-XL's relative attention through FlexAttention's fused CUDA kernels (the position term read at the
    relative shift's index), forward and backward, float32, against the SDPA path."""
    flex, ids = build(variant, "cuda", attn_implementation="flex_attention")
    sdpa, _ = build(variant, "cuda", attn_implementation="sdpa")
    sdpa.load_state_dict(flex.state_dict())
    flex_loss, flex_gradients = loss_and_gradients(flex, ids)
    sdpa_loss, sdpa_gradients = loss_and_gradients(sdpa, ids)
    torch.testing.assert_close(flex_loss, sdpa_loss, atol=1e-4, rtol=1e-4)
    for name, gradient in sdpa_gradients.items():
        torch.testing.assert_close(flex_gradients[name], gradient, atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_transfo_xl_training_step_equals_eager(dtype):
    model, ids = build("transfo-xl div_val 2", "cuda", attn_implementation="sdpa")
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        expected_loss, expected_gradients = loss_and_gradients(model, ids)
        loss, gradients = loss_and_gradients(model, ids, forward=torch.compile(model))
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(loss, expected_loss, atol=tolerance, rtol=tolerance)
    for name, gradient in expected_gradients.items():
        torch.testing.assert_close(gradients[name], gradient, atol=tolerance, rtol=10 * tolerance, msg=name)


@pytest.mark.exact  # tokens compared exactly; logits within 1e-4 (the two paths round differently, TF32 off)
@pytest.mark.parametrize("name", ["transfo-xl (adaptive softmax, zero memory)", "gtrxl"])
def test_generate_through_the_one_position_step_equals_the_general_path_on_cuda(name):
    """`generate()` takes `txv_xl_step` for its one-token calls: on the GPU too it gives the general backbone's tokens,
    past mem_len (the step's buffers wrapping round), with a beam search reordering them."""
    from test_generation_step import _ids, _model

    prompt = _ids(2, 4).cuda()
    kwargs = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None)
    outputs = {}
    for step_path in (True, False):
        model = _model(name).cuda()
        if not step_path:
            tiny_configs.general_path_only(model)
        greedy = model.generate(prompt, output_logits=True, return_dict_in_generate=True, **kwargs)
        outputs[step_path] = (
            greedy.sequences,
            torch.stack(greedy.logits, 1),
            model.generate(prompt, num_beams=3, **kwargs),
        )
    assert torch.equal(outputs[True][0], outputs[False][0])
    torch.testing.assert_close(outputs[True][1], outputs[False][1], atol=1e-4, rtol=1e-4)
    assert torch.equal(outputs[True][2], outputs[False][2])
