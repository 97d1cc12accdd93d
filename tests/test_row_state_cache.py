"""RowStateCache.check_batch: one batch-size check for every cache that carries a model's own state."""

import pytest
import torch

from hf_txvariants.txv_cache import RowStateCache


class _Rows(RowStateCache):
    def __init__(self, **tensors):
        super().__init__()
        self.tensors = tensors

    def _row_tensors(self):
        return self.tensors

    def get_seq_length(self, layer_idx=0):
        return 0


def test_check_batch_reads_the_first_cached_tensor_and_names_both_sizes():
    cache = _Rows(empty=None, per_layer=[None, torch.zeros(3, 2)], other=torch.zeros(3))
    cache.check_batch(3)
    with pytest.raises(ValueError, match="the cache holds batch size 3, but the input has batch size 2"):
        cache.check_batch(2)


def test_check_batch_accepts_any_batch_on_an_empty_cache():
    _Rows(state=None, layers=[None, None]).check_batch(5)
