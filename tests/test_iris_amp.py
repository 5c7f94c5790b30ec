"""Mixed precision of IRI steps: amp="auto" (the default) resolves per device (bfloat16 on
CUDA, float32 on every CPU), the last ``float32_steps`` steps of a batch run in float32,
and a stored set's key names the arithmetic that ran."""

import pytest
import torch
from torch import nn

import stitchlab.iris.descent as descent
from stitchlab import generate_iris, generate_iris_set
from stitchlab.iris import IRIRecipe
from stitchlab.iris.front import _recipe_front
from stitchlab.iris.recipe import uses_bf16

CPU = torch.device("cpu")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3)).eval()


SEEN: list[torch.dtype] = []  # module-level: the front is a copy of the model


def _record(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
    SEEN.append(out.dtype)


def test_the_last_float32_steps_run_in_float32():
    rec = IRIRecipe(amp="bf16", steps=10, float32_steps=3)
    dtypes = []
    for t in range(rec.steps):
        with descent._precision(CPU, t < descent._bf16_steps(rec, CPU)):
            dtypes.append(nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2)).dtype)
    assert dtypes == [torch.bfloat16] * 7 + [torch.float32] * 3


def _bf16_steps(**recipe) -> int:
    """How many of a generated set's forwards ran in bfloat16, checking that they are
    consecutive and followed by float32 ones only."""
    SEEN.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))
    model[0].register_forward_hook(_record)  # the first layer's output dtype, every forward
    generate_iris(model.eval(), "1", torch.rand(3, 3, 8, 8), amp="bf16", tolerance=None,
                  **recipe)  # fmt: skip
    # before the steps: float32 trials (BatchNorm, layout) and the targets; after them the
    # float32 steps and the measurement of the IRIs and of the null
    seen = "".join("b" if d == torch.bfloat16 else "f" for d in SEEN)
    first = seen.index("b") if "b" in seen else len(seen)
    count = seen.count("b")
    assert first >= 1 and seen[first:] == "b" * count + "f" * (len(seen) - first - count)
    assert len(seen) - first - count >= recipe["steps"] - count + 1
    return count


def test_steps_of_a_generated_set_follow_the_schedule():
    # of 12 steps, 12 - 4 in bfloat16, then 4 in float32
    assert _bf16_steps(steps=12, float32_steps=4, float32_below=None) == 8
    assert _bf16_steps(steps=12, float32_steps=0, float32_below=None) == 12


def test_a_batch_close_to_its_targets_goes_on_in_float32():
    # float32 from the step after the batch's median error is first below float32_below:
    # never for a bound it cannot reach in 40 steps, after a few steps for a loose one
    assert _bf16_steps(steps=40, float32_steps=0, float32_below=1e-6) == 40
    loose = _bf16_steps(steps=40, float32_steps=0, float32_below=0.5)
    tight = _bf16_steps(steps=40, float32_steps=0, float32_below=0.1)
    assert 1 <= loose < tight < 40  # 5 and 20 here


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_auto_resolves_against_the_device(device):
    """bfloat16 on CUDA, float32 on every CPU (with AMX or without); the key names what
    ran."""
    front = _recipe_front(_model(), "1", (), None, IRIRecipe())
    rec = IRIRecipe().for_front(front, torch.rand(2, 3, 8, 8), torch.device(device))
    assert rec.amp == ("bf16" if device == "cuda" else "off")
    assert uses_bf16(rec, torch.device(device)) is (device == "cuda")
    assert rec.key_dict()["amp"] == rec.amp
    assert not uses_bf16(IRIRecipe(), CPU) and uses_bf16(IRIRecipe(), torch.device("cuda"))


def test_fast_is_refused_with_what_replaced_it():
    with pytest.raises(ValueError, match="amp='fast'.*has been removed"):
        IRIRecipe.from_kwargs(amp="fast")


@pytest.mark.filterwarnings("ignore:IRIs")  # 3 steps: flagged, which is not the point here
def test_a_stored_set_is_keyed_by_the_arithmetic_that_ran(tmp_path):
    model, x = _model(), (torch.rand(4, 3, 8, 8), torch.zeros(4, dtype=torch.long))
    kw = dict(steps=3, batch_size=4, chunk_size=4)
    default = generate_iris_set(model, "1", x, tmp_path, **kw)
    off = generate_iris_set(model, "1", x, tmp_path, amp="off", **kw)
    assert default.root == off.root  # the same set: float32 ran on this CPU
    assert off.meta["recipe"]["amp"] == "off"
    bf16 = generate_iris_set(model, "1", x, tmp_path, amp="bf16", **kw)
    assert bf16.root != off.root
    assert bf16.meta["recipe"]["float32_steps"] == 30


def test_presets_keep_their_arithmetic():
    paper = IRIRecipe.from_kwargs(preset="paper")  # the released loop: float32 everywhere
    assert paper.amp == "off" and not uses_bf16(paper, torch.device("cuda"))
    audio = IRIRecipe.from_kwargs(preset="audio")  # bfloat16 on CUDA only, to the last step
    assert (audio.amp, audio.float32_steps, audio.float32_below) == ("auto", 0, None)
    assert uses_bf16(audio, torch.device("cuda")) and not uses_bf16(audio, CPU)
    d = IRIRecipe()
    assert (d.amp, d.float32_steps, d.float32_below) == ("auto", 30, 0.02)


def test_describe_names_the_arithmetic():
    assert IRIRecipe().describe().endswith(
        "in bfloat16 on CUDA, the last 30 in float32 and all once the batch's median is "
        "below 0.02, float32 elsewhere"
    )
    assert IRIRecipe(amp="off").describe().endswith("stored as uint8, in float32")
    assert IRIRecipe(amp="bf16", float32_steps=0, float32_below=None).describe().endswith(
        ", in bfloat16"
    )
    assert IRIRecipe(amp="bf16", float32_steps=0).describe().endswith(
        ", in bfloat16, all once the batch's median is below 0.02"
    )
    assert IRIRecipe(amp="auto", float32_steps=0, float32_below=None).describe().endswith(
        "stored as uint8, in bfloat16 on CUDA, float32 elsewhere")


def test_bad_float32_steps_is_refused():
    with pytest.raises(ValueError, match="float32_steps must be >= 0"):
        IRIRecipe.from_kwargs(float32_steps=-1)
    with pytest.raises(ValueError, match="float32_below must be positive"):
        IRIRecipe.from_kwargs(float32_below=0.0)
    with pytest.raises(TypeError, match="amp must be"):
        IRIRecipe.from_kwargs(amp="fp16")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_error_and_gradient_by_hand_in_either_layout(dtype):
    """The per-sample relative error ||f - t|| / ||t|| and its gradient (f - t) / (||f - t||
    ||t||), by hand: sample 0 is 5 off a target of norm 13 (0.3846..., a gradient of
    diff / 65), sample 1 is the target itself (error 0, gradient 0). The gradient has f's
    dtype and memory format (channels-last maps are reduced in place, not copied)."""
    from stitchlab.iris.descent import _error_and_grad

    target = torch.zeros(2, 2, 2, 2)
    target[0, 0, 0, 0], target[0, 1, 1, 1] = 5.0, 12.0  # norm 13
    target[1, 1, 0, 1] = 2.0
    f = target.clone()
    f[0, 0, 1, 0], f[0, 1, 0, 0] = 3.0, -4.0  # 5 off
    for fmt in (torch.contiguous_format, torch.channels_last):
        fx = f.to(dtype).contiguous(memory_format=fmt)
        tx = target.contiguous(memory_format=fmt)
        norm = torch.linalg.vector_norm(target.flatten(1), dim=1)
        err, grad = _error_and_grad(fx, tx, norm)
        assert err.dtype == torch.float32
        assert err.tolist() == pytest.approx([5 / 13, 0.0], abs=1e-7)
        assert grad.dtype == dtype and grad.is_contiguous(memory_format=fmt)
        expected = torch.zeros_like(target)
        expected[0, 0, 1, 0], expected[0, 1, 0, 0] = 3 / 65, -4 / 65
        assert torch.allclose(grad.float(), expected, atol=1e-3 if dtype != torch.float32 else 1e-7)
