"""A saved folder loads with trust_remote_code=True where hf_txvariants cannot be imported, and gives the plugin's
outputs: the folder of every shared-tester class (every variant, in each tester's configuration), all loaded in one
clean subprocess (`txv_tester.load_without_plugin`) instead of one per tester class."""

from __future__ import annotations

import pytest
import torch

import hf_txvariants as txv
from txv_tester import ATOL, all_testers, load_without_plugin


def test_every_variant_has_a_shared_tester():
    assert {tester.model_type for tester in all_testers()} == set(txv.VARIANTS)


@pytest.mark.slow  # one clean process importing transformers and loading every tester's folder
def test_every_testers_folder_loads_without_the_plugin(tmp_path):
    outputs = load_without_plugin(all_testers(), tmp_path)
    failures = []
    for tester, (expected, loaded) in outputs.items():
        name = f"{tester.__module__}.{tester.__name__}"
        if not isinstance(loaded, torch.Tensor):  # the clean process's error for this folder
            failures.append(f"{name}: {loaded}")
            continue
        try:
            torch.testing.assert_close(loaded, expected, atol=ATOL, rtol=0)
        except AssertionError as error:
            failures.append(f"{name}: {error}")
    assert not failures, "\n".join(failures)
