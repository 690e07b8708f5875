"""FlexAttention path (posenc_lib/attention/flex.py), forward on CPU (the eager reference, no compile):
equal to the explicit path for every score-modifying scheme, encoder with padding and causal decoder."""
import pytest
import torch

from posenc_lib import make_scheme, set_seed
from posenc_lib.attention import flex
from posenc_lib.attention.layer import MultiHeadAttention

pytestmark = pytest.mark.skipif(not flex.available(), reason="this torch has no FlexAttention")


@pytest.mark.parametrize("pe", ["t5", "alibi", "shaw", "xlnet", "deberta"])
@pytest.mark.parametrize("causal", [False, True])
def test_flex_forward_equals_the_explicit_path(pe, causal, monkeypatch):
    set_seed(0)
    d, h, n = 32, 4, 24  # n > 2k + 1 for shaw (k = 4 below): both clipped ends are populated
    opts = {"max_relative_position": 4} if pe == "shaw" else {}
    scheme = make_scheme(pe, d, h, 1, causal=causal, **opts)
    attn = MultiHeadAttention(d, h).eval()
    pos = torch.arange(n)
    x = torch.randn(2, n, d)
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[1, 17:] = True
    with torch.no_grad():
        ctx = scheme.prepare(pos, pos)
        monkeypatch.delenv(flex.ENV, raising=False)
        ref = attn(x, causal=causal, pos=scheme, ctx=ctx, key_padding_mask=pad)
        monkeypatch.setenv(flex.ENV, "1")
        calls = []
        real = flex.flex_attend
        monkeypatch.setattr(flex, "flex_attend", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        got = attn(x, causal=causal, pos=scheme, ctx=scheme.prepare(pos, pos), key_padding_mask=pad)
    assert calls
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_flex_is_off_unless_switched_on(monkeypatch):
    monkeypatch.delenv(flex.ENV, raising=False)
    assert not flex.use_flex()
    monkeypatch.setenv(flex.ENV, "1")
    assert flex.use_flex()
