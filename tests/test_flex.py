"""FlexAttention path (posenc_lib/attention/flex.py), forward on CPU (the eager reference, no compile): forms found
by scheme class, switched on only by the environment.  Its equality with the explicit path for every scheme it
applies to, encoder and causal, with padding: tests/test_backend_contract.py."""
import pytest
import torch

from posenc_lib import ShawRelative, set_seed
from posenc_lib.attention import flex
from posenc_lib.attention.layer import MultiHeadAttention, PositionScheme

pytestmark = pytest.mark.skipif(not flex.available(), reason="this torch has no FlexAttention")


def test_a_subclass_takes_the_form_its_base_class_registered():
    """Forms are found by class, not by name: a renamed subclass of Shaw's scheme has Shaw's score_mod and value term
    (the equality of every scheme's form with the explicit path: tests/test_backend_contract.py)."""
    set_seed(0)

    class Renamed(ShawRelative):
        name = "renamed"

    scheme, attn = Renamed(32, 4, 1, max_relative_position=4), MultiHeadAttention(32, 4).eval()
    pos, x = torch.arange(12), torch.randn(2, 12, 32)
    q = k = v = attn.split(x)
    prep = scheme.prepare(pos, pos)
    with torch.no_grad():
        got = flex.flex_attend(scheme, q, k, v, prep, 0, attn, 0.3, None)
        ref = torch.softmax((q @ k.transpose(-1, -2) + scheme.scores(q, k, prep, 0, attn)) * 0.3, -1)
        ref = ref @ v + scheme.values(ref, prep, 0)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_a_scheme_without_a_form_is_named():
    class ValuesOnly(PositionScheme):
        def scores(self, q, k, prep, layer, attn):
            return torch.zeros(q.shape[:3] + k.shape[2:3])

        def values(self, probs, prep, layer):
            return None

    scheme, q = ValuesOnly(32, 4, 1), torch.zeros(1, 4, 3, 8)
    with pytest.raises(ValueError, match="no FlexAttention form for scheme ValuesOnly"):
        flex.scheme_score_mod(scheme, q, q, scheme.prepare(torch.arange(3), torch.arange(3)), 0, None, 1.0)


def test_flex_is_off_unless_switched_on(monkeypatch):
    monkeypatch.delenv(flex.ENV, raising=False)
    assert not flex.use_flex()
    monkeypatch.setenv(flex.ENV, "1")
    assert flex.use_flex()
