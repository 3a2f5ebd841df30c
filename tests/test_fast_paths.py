"""Fast paths give the same numbers as the plain torch code they replace."""
import pytest
import torch
import torch.nn.functional as F

from megatron.model.loss import SummedCrossEntropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_summed_cross_entropy_equals_torch(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(37, 211, generator=g)).to(dtype).requires_grad_()
    labels = torch.randint(0, 211, (37,), generator=g)
    labels[:3] = labels[3]  # repeated labels
    upstream = torch.tensor(0.37)

    reference = F.cross_entropy(logits.float(), labels, reduction="sum")
    (reference * upstream).backward()
    expected_grad, logits.grad = logits.grad, None
    fused = SummedCrossEntropy.apply(logits, labels)
    (fused * upstream).backward()

    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, reference, rtol=1e-6, atol=1e-5)
    assert logits.grad.dtype == dtype
    torch.testing.assert_close(logits.grad, expected_grad, rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-7)


def test_summed_cross_entropy_of_no_tokens_is_zero():
    logits = torch.randn(0, 11, requires_grad=True)
    loss = SummedCrossEntropy.apply(logits, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and logits.grad.shape == (0, 11)
