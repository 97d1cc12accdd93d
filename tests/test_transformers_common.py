"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) run against every variant and head.

The test code is not committed here: it is taken at test time from the source distribution of the INSTALLED
transformers version (`pip download --no-binary :all: transformers==<version>`), cached under
`~/.cache/hf-txvariants/` (or `$TXV_TRANSFORMERS_SDIST_CACHE`). Where the download is impossible the module skips and
says why.

The sdist carries `tests/test_modeling_common.py` and `tests/test_configuration_common.py`, but not three modules they
import: `tests/generation/test_utils.py` (GenerationTesterMixin), `tests/exporters/test_export.py`
(ExportTesterMixin) and `tests/utils/test_configuration_utils.py` (`config_common_kwargs`). They are replaced by the
placeholders in `_MISSING_FROM_SDIST`: empty mixins, so no generation or export test of transformers runs here (our
own tests cover them: tests/test_export_compile.py and the generation tests of each variant), and a
`config_common_kwargs` of None, so the one ConfigTester check that needs it is not called (see `test_config`).

Opt-in, the generation tests: `TXV_TRANSFORMERS_TESTS=<a transformers tests/ folder>` (the `tests/` of a clone of
transformers' git repository, best at the installed release) takes the three modules above from that folder instead
of the placeholders: `generation/test_utils.py` and `exporters/test_export.py` as they are (their `from tests.<x>`
imports pointed at the package the sdist files are imported under), and `config_common_kwargs` read as a literal from
`utils/test_configuration_utils.py` (the rest of that file needs the repository's root `utils/` folder). Every test
class whose models generate then runs transformers' `GenerationTesterMixin` (the export tests are `@slow` there), and
`test_config` runs `check_config_arguments_init`. The folder is copied into a temporary package each run (nothing is
cached or committed); a folder without those files, or one whose modules do not import on the installed transformers,
is an error naming it, not a skip. So far run with the tests/ folder of a fork of transformers at 5.16.0.dev0 (the
newest snapshot of transformers' repository that could be had; none at 5.23 or 5.24), on transformers 5.23.0 and
5.24.0; the generation tests whose assumption does not apply are in `by_design_skips` with the others.

Each variant has a ModelTester built from its tiny config; the variants are registered in the `*_MAPPING_NAMES` tables
that the tests consult to choose labels. A test is skipped only where its assumption does not hold by design; every
skip names its reason in `by_design_skips`.
"""

from __future__ import annotations

import ast
import atexit
import fnmatch
import importlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from transformers.models.auto import modeling_auto

import hf_txvariants as txv
from hf_txvariants.modeling_image_transformer import NUM_INTENSITIES
from tiny_configs import SEQ_LENGTHS, TINY_CONFIGS

# transformers' test_bc_cache_name_forward passes the cache as `past_key_values` and expects the plugin's deprecation
# warning in a `warnings.catch_warnings(record=True)` block, which keeps the filters of the run around it: an "ignore"
# or "error" filter for that warning (from pytest's -W, PYTHONWARNINGS or the ini's filterwarnings) would hide it or
# raise it instead. The mark's filter, applied last, takes precedence in this module only.
PLUGIN_CACHE_NAME_DEPRECATION = r"always:`(past_key_values|cache_params)` is deprecated for `:FutureWarning"
pytestmark = [
    pytest.mark.slow,  # about 1,700 tests: a few minutes on 2 cores
    pytest.mark.filterwarnings(PLUGIN_CACHE_NAME_DEPRECATION),
]

TRANSFORMERS_VERSION = transformers.__version__
CACHE_ROOT = Path(os.environ.get("TXV_TRANSFORMERS_SDIST_CACHE", Path.home() / ".cache" / "hf-txvariants"))
PACKAGE = "transformers_sdist_tests"  # the name the extracted tests/ folder is imported under
SDIST_FILES = ("tests/test_modeling_common.py", "tests/test_configuration_common.py")
_MISSING_FROM_SDIST = {
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "utils/test_configuration_utils.py": "config_common_kwargs = None\n",
}


def _download_sdist(target: Path) -> Path:
    """The transformers sdist of the installed version, downloaded once with pip into `target`."""
    existing = sorted(target.glob(f"transformers-{TRANSFORMERS_VERSION}.tar.gz"))
    if existing:
        return existing[0]
    target.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--quiet",
        f"transformers=={TRANSFORMERS_VERSION}",
        "-d",
        str(target),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    found = sorted(target.glob(f"transformers-{TRANSFORMERS_VERSION}.tar.gz"))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"`{' '.join(command)}` failed: {result.stderr.strip()[-500:]}")
    return found[0]


def _extract_common_tests() -> Path:
    """A folder holding the package `PACKAGE` (the sdist's common test files plus the placeholders); atomic."""
    root = CACHE_ROOT / f"transformers-{TRANSFORMERS_VERSION}-tests"
    if (root / PACKAGE / "test_modeling_common.py").exists():
        return root
    sdist = _download_sdist(CACHE_ROOT / "sdist")
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=CACHE_ROOT))
    package = staging / PACKAGE
    with tarfile.open(sdist) as archive:
        for name in SDIST_FILES:
            member = archive.getmember(f"transformers-{TRANSFORMERS_VERSION}/{name}")
            (package / Path(name).name).parent.mkdir(parents=True, exist_ok=True)
            (package / Path(name).name).write_bytes(archive.extractfile(member).read())
    for relative, text in _MISSING_FROM_SDIST.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    for folder in [package, *(path for path in package.rglob("*") if path.is_dir())]:
        (folder / "__init__.py").write_text("")
    try:
        staging.rename(root)
    except OSError:  # another run extracted it first
        shutil.rmtree(staging, ignore_errors=True)
    return root


TESTS_FOLDER = os.environ.get("TXV_TRANSFORMERS_TESTS")  # opt-in: a transformers tests/ folder (module docstring)
_TAKEN_FROM_TESTS_FOLDER = ("generation/test_utils.py", "exporters/test_export.py")


def _literal_assignment(path: Path, name: str):
    """The value of the top-level `name = <literal>` in `path`, read without executing the file."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"TXV_TRANSFORMERS_TESTS: no literal `{name} = ...` in {path}")


def _with_tests_folder(sdist_root: Path, folder: Path) -> Path:
    """A temporary copy of the sdist package whose placeholders are replaced by the modules of `folder`."""
    needed = [*_TAKEN_FROM_TESTS_FOLDER, "utils/test_configuration_utils.py"]
    missing = [relative for relative in needed if not (folder / relative).is_file()]
    if missing:
        raise RuntimeError(
            f"TXV_TRANSFORMERS_TESTS={folder} is not a transformers tests/ folder: no {', '.join(missing)}"
        )
    root = Path(tempfile.mkdtemp(prefix="txv-transformers-tests-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    shutil.copytree(sdist_root / PACKAGE, root / PACKAGE)
    for relative in _TAKEN_FROM_TESTS_FOLDER:
        text = (folder / relative).read_text()
        # In the repository these modules import their siblings as `tests.<module>` (the repository root on sys.path).
        text = re.sub(r"^(\s*)(from|import) tests\.", rf"\1\2 {PACKAGE}.", text, flags=re.MULTILINE)
        (root / PACKAGE / relative).write_text(text)
    kwargs = _literal_assignment(folder / "utils/test_configuration_utils.py", "config_common_kwargs")
    (root / PACKAGE / "utils/test_configuration_utils.py").write_text(f"config_common_kwargs = {kwargs!r}\n")
    return root


try:
    _sdist_root = _extract_common_tests()
except Exception as error:  # no network / no pip index in this run: the module cannot run, and says why
    pytest.skip(
        f"transformers {TRANSFORMERS_VERSION} common tests unavailable (sdist download/extract failed): {error}",
        allow_module_level=True,
    )
# An explicit opt-in that does not work is an error, not a skip.
sys.path.insert(0, str(_with_tests_folder(_sdist_root, Path(TESTS_FOLDER)) if TESTS_FOLDER else _sdist_root))
with warnings.catch_warnings():  # transformers registers its own marks (flash_attn_test, generate, ...) in its conftest
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    common = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    config_common = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    generation_common = importlib.import_module(f"{PACKAGE}.generation.test_utils")

ModelTesterMixin = common.ModelTesterMixin
GenerationTesterMixin = generation_common.GenerationTesterMixin  # an empty placeholder unless opted in
ConfigTester = config_common.ConfigTester

# transformers' tests pick labels and inputs from these tables (model_type -> class name).
_AUTO_CLASS_TABLES = {
    "AutoModel": modeling_auto.MODEL_MAPPING_NAMES,
    "AutoModelForCausalLM": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    "AutoModelForMaskedLM": modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    "AutoModelForSequenceClassification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    "AutoModelForImageToImage": modeling_auto.MODEL_FOR_IMAGE_TO_IMAGE_MAPPING_NAMES,
}


@pytest.fixture(scope="module", autouse=True)
def variants_in_transformers_tables():
    """Registers every variant's classes in the tables for this module only, and restores them after."""
    added = []
    for model_type, (_, pretrained_class) in txv.VARIANTS.items():
        for auto_name, class_name in pretrained_class.auto_classes.items():
            table = _AUTO_CLASS_TABLES[auto_name]
            if model_type not in table:
                table[model_type] = class_name
                added.append((table, model_type))
    yield
    for table, model_type in added:
        del table[model_type]


class TxvModelTester:
    """A ModelTester as transformers' tests expect it, built from a variant's tiny config."""

    def __init__(self, parent, config_class, config_kwargs, batch_size=2, seq_length=8):
        self.parent = parent
        self.config_class = config_class
        self.config_kwargs = config_kwargs
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = True
        config = self.get_config()
        self.vocab_size = config.vocab_size
        self.hidden_size = config.hidden_size
        self.num_hidden_layers = config.num_hidden_layers
        self.num_attention_heads = getattr(config, "num_attention_heads", None)  # None: no attention (ACT RNN)

    def get_config(self):
        return self.config_class(**self.config_kwargs)

    def prepare_config_and_inputs_for_common(self):
        config = self.get_config()
        # Token ids from 1: id 0 is the pad token of the tiny configs, and a pad inside the rows is not what these
        # tests mean to feed.
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 1) + 1
        attention_mask = torch.ones_like(input_ids)
        return config, {"input_ids": input_ids, "attention_mask": attention_mask}


# Why a test does not apply (one line each; the tests are skipped with these words).
_XL_MEMORY_KEYS = "XL memory (memory_init='zeros'): attention keys include the memory, weights are [.., q, mem + q]"
_ADAPTIVE_INPUT = "adaptive input embeddings (cutoffs): not one nn.Embedding, and vocab_size is tied to the cutoffs"
_XL_MEMORY_IN_GENERATE = (
    "XL memory: the attentions returned by generate include the memory keys, weights are [.., q, mem + q]"
)
_XL_MEMORY_CACHE_FORMAT = (
    "XL memory: the cache is a MemoryCache of per-layer hidden states [batch, mem_len, hidden] (the paper's memory), "
    "not keys and values"
)
_SPAN_CACHE_FORMAT = (
    "the cache is a SpanCache of each layer's previous hidden states [batch, span, hidden] (the original's memory), "
    "not keys and values"
)
_ADAPTIVE_SOFTMAX_ZERO_LABELS = (
    "adaptive softmax: a tail cluster gets gradients only from targets in it, and the test's labels are all 0"
)


# Tests that check the placeholders rather than a model (none when TXV_TRANSFORMERS_TESTS gives the real modules).
_NEEDS_WHAT_THE_SDIST_LACKS = (
    {}
    if TESTS_FOLDER
    else {
        "test_generation_tester_mixin_inheritance": (
            "it checks that the test class inherits GenerationTesterMixin (tests/generation/ is not shipped; opt in"
            " with TXV_TRANSFORMERS_TESTS); each variant's own tests cover generate"
        ),
    }
)


class TxvCommonTestCase(ModelTesterMixin):
    """transformers' ModelTesterMixin for one variant (a class whose models generate also inherits
    GenerationTesterMixin, as transformers' own test classes do): set `model_type` (its tiny config comes from
    tests/tiny_configs.py, with `config_overrides`) and `all_model_classes`; `by_design_skips` names the tests whose
    assumption does not hold for the variant, with the reason."""

    model_type: str = ""
    config_overrides: dict = {}
    generation_seq_length: int | None = None  # the prompt length of GenerationTesterMixin's tests, where it differs
    by_design_skips: dict[str, str] = {
        "test_model_weights_reload_no_missing_tied_weights": (
            "from_pretrained is strict here: a checkpoint missing weights is a ValueError naming them"
            " (strict_weights=False only warns); the test expects a load that reports them"
        ),
    }

    @property
    def config_class(self):
        return txv.VARIANTS[self.model_type][0]

    @property
    def config_kwargs(self):
        return {**TINY_CONFIGS[self.model_type], **self.config_overrides}

    def setUp(self):
        if self._testMethodName in _NEEDS_WHAT_THE_SDIST_LACKS:
            self.skipTest(f"not in the sdist: {_NEEDS_WHAT_THE_SDIST_LACKS[self._testMethodName]}")
        reason = next(
            (
                why
                for pattern, why in self.by_design_skips.items()
                if fnmatch.fnmatchcase(self._testMethodName, pattern)
            ),
            None,
        )
        if reason is not None:
            self.skipTest(f"by design: {reason}")
        seq_length = SEQ_LENGTHS.get(self.model_type, 8)
        if self.generation_seq_length and self._testMethodName in vars(GenerationTesterMixin):
            seq_length = self.generation_seq_length
        self.model_tester = TxvModelTester(self, self.config_class, self.config_kwargs, seq_length=seq_length)

    def test_config(self):
        tester = ConfigTester(self, config_class=self.config_class, **self.config_kwargs)
        # run_common_tests(); check_config_arguments_init needs the kwargs table that the sdist lacks.
        tester.create_and_test_config_common_properties()
        tester.create_and_test_config_to_json_string()
        tester.create_and_test_config_to_json_file()
        tester.create_and_test_config_from_and_save_pretrained()
        tester.create_and_test_config_from_and_save_pretrained_subfolder()
        tester.create_and_test_config_from_and_save_pretrained_composite()
        tester.create_and_test_config_with_num_labels()
        if config_common.config_common_kwargs is not None:
            tester.check_config_arguments_init()
        tester.create_and_test_config_from_pretrained_custom_kwargs()
        tester.check_config_can_be_init_without_params()


# ------------------------------------------------------------------------------------------------ the variants
# One class per variant (two where the encoder heads need `is_decoder=False`), its tiny config in tests/tiny_configs.py.
# txv_act_rnn (ACT as its own model, added by another change) gets a class here like the ones below.


class TestTransfoXLCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "transfo-xl"
    all_model_classes = (txv.TransfoXLModel, txv.TransfoXLLMHeadModel, txv.TransfoXLForSequenceClassification)
    by_design_skips = {
        **TxvCommonTestCase.by_design_skips,
        "test_attention_outputs": _XL_MEMORY_KEYS,
        "test_model_get_set_embeddings": _ADAPTIVE_INPUT,
        "test_resize_tokens_embeddings": _ADAPTIVE_INPUT + " (resizing refuses cutoffs with a ValueError saying why, "
        "model_cards/transfo-xl.md, Limits; without cutoffs it is tested in test_modeling_transfo_xl.py)",
        "test_load_with_mismatched_shapes": _ADAPTIVE_INPUT + " (the test sets vocab_size=10 under cutoffs [10, 20])",
        "test_training_gradient_checkpointing": _ADAPTIVE_SOFTMAX_ZERO_LABELS,
        "test_training_gradient_checkpointing_use_reentrant_false": _ADAPTIVE_SOFTMAX_ZERO_LABELS,
        "test_training_gradient_checkpointing_use_reentrant_true": _ADAPTIVE_SOFTMAX_ZERO_LABELS,
        "test_*_generate_dict_output*": _XL_MEMORY_IN_GENERATE + " (memory_init='zeros': from the first step)",
        "test_past_key_values_format": _XL_MEMORY_CACHE_FORMAT,
    }


class TestGTrXLCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_gtrxl"
    all_model_classes = (txv.GTrXLModel, txv.GTrXLForCausalLM)
    by_design_skips = {
        **TxvCommonTestCase.by_design_skips,
        "test_*_generate_dict_outputs_use_cache": _XL_MEMORY_IN_GENERATE,
        "test_past_key_values_format": _XL_MEMORY_CACHE_FORMAT,
    }


class TestVanillaDecoderCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_vanilla"
    all_model_classes = (txv.VanillaModel, txv.VanillaForCausalLM, txv.VanillaForSequenceClassification)


class TestVanillaEncoderCommon(TxvCommonTestCase, unittest.TestCase):
    model_type = "txv_vanilla"
    config_overrides = dict(is_decoder=False, position_embedding_type="sinusoidal", num_future_targets=1)
    all_model_classes = (txv.VanillaModel, txv.VanillaForMaskedLM, txv.VanillaForSequenceClassification)


class TestShawDecoderCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_shaw"
    all_model_classes = (txv.ShawModel, txv.ShawForCausalLM, txv.ShawForSequenceClassification)


class TestShawEncoderCommon(TxvCommonTestCase, unittest.TestCase):
    model_type = "txv_shaw"
    config_overrides = dict(is_decoder=False, relative_values=False)
    all_model_classes = (txv.ShawModel, txv.ShawForMaskedLM, txv.ShawForSequenceClassification)


class TestRTransformerCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_r_transformer"
    all_model_classes = (txv.RTransformerModel, txv.RTransformerForCausalLM, txv.RTransformerForSequenceClassification)


class TestUniversalDecoderCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_universal"
    all_model_classes = (
        txv.UniversalTransformerModel,
        txv.UniversalTransformerForCausalLM,
        txv.UniversalTransformerForSequenceClassification,
    )


class TestUniversalEncoderCommon(TxvCommonTestCase, unittest.TestCase):
    model_type = "txv_universal"
    config_overrides = dict(is_decoder=False)
    all_model_classes = (
        txv.UniversalTransformerModel,
        txv.UniversalTransformerForMaskedLM,
        txv.UniversalTransformerForSequenceClassification,
    )


class TestAdaptiveSpanCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_adaptive_span"
    all_model_classes = (txv.AdaptiveSpanModel, txv.AdaptiveSpanForCausalLM)
    by_design_skips = {
        **TxvCommonTestCase.by_design_skips,
        "test_*_generate_dict_outputs_use_cache": _XL_MEMORY_IN_GENERATE,
        "test_past_key_values_format": _XL_MEMORY_CACHE_FORMAT,
    }


class TestAdaptiveSpanOriginalCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_adaptive_span_original"
    all_model_classes = (txv.AdaptiveSpanOriginalModel, txv.AdaptiveSpanOriginalForCausalLM)
    has_attentions = False  # a query's weights cover its own window of previous positions: output_attentions refused
    by_design_skips = {
        **TxvCommonTestCase.by_design_skips,
        "test_*_generate_dict_outputs_use_cache": _SPAN_CACHE_FORMAT,
        "test_past_key_values_format": _SPAN_CACHE_FORMAT,
    }


_SPARSE_LEFT_PADDING = (
    "left padding is refused with a ValueError: the pattern counts positions from the first column, so a "
    "left-padded row would silently differ from the row alone (right padding is tested)"
)


class TestSparseTransformerCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_sparse_transformer"
    all_model_classes = (
        txv.SparseTransformerModel,
        txv.SparseTransformerForCausalLM,
        txv.SparseTransformerForSequenceClassification,
    )
    by_design_skips = {
        **TxvCommonTestCase.by_design_skips,
        "test_eager_matches_sdpa_inference_*pad_left*": _SPARSE_LEFT_PADDING,
        "test_left_padding_compatibility": _SPARSE_LEFT_PADDING,
    }


_IMAGE_LEFT_PADDING = (
    "left padding is refused with a ValueError: positions and the local blocks count from the first column, so a "
    "left-padded row would silently differ from the row alone (test_modeling_image_transformer.py)"
)


class TestImageTransformerCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_image_transformer"
    all_model_classes = (txv.ImageTransformerModel, txv.ImageTransformerForCausalLM)
    by_design_skips = {
        **TxvCommonTestCase.by_design_skips,
        "test_forward_with_logits_to_keep": (
            f"the logits cover the {NUM_INTENSITIES} intensities, not the start token {NUM_INTENSITIES} that only"
            " begins an image (vocab_size 257), as transformers' ImageGPT head has vocab_size - 1 outputs; the scores"
            " of generate are checked at that width below, and logits_to_keep in test_heads.py"
        ),
        "test_left_padding_compatibility": _IMAGE_LEFT_PADDING,
        "test_eager_matches_sdpa_inference_*pad_left*": _IMAGE_LEFT_PADDING,
    }
    # generate() continues an image: the prompt is its first pixels, so that the new ones fit in the image
    generation_seq_length = 8

    def _check_scores(self, batch_size, scores, generated_length, config):
        """Scores over the intensities (see test_forward_with_logits_to_keep above)."""
        self.assertIsInstance(scores, tuple)
        self.assertEqual(len(scores), generated_length)
        self.assertListEqual([tuple(step.shape) for step in scores], [(batch_size, NUM_INTENSITIES)] * len(scores))


class TestACTRNNCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_act_rnn"
    all_model_classes = (txv.ACTRNNModel, txv.ACTRNNForCausalLM, txv.ACTRNNForSequenceClassification)
    has_attentions = False  # a pondering RNN
    # hidden_states[0] is the input embedding: of width hidden_size here, as the test expects of every entry
    config_overrides = {"embedding_size": TINY_CONFIGS["txv_act_rnn"]["hidden_size"]}
    by_design_skips = {
        **TxvCommonTestCase.by_design_skips,
        "test_config": "ConfigTester requires the attention fields (num_attention_heads): the pondering RNN has none",
    }


class TestTxvReformerCommon(TxvCommonTestCase, GenerationTesterMixin, unittest.TestCase):
    model_type = "txv_reformer"
    all_model_classes = (txv.TxvReformerModel, txv.TxvReformerForCausalLM, txv.TxvReformerForSequenceClassification)
    by_design_skips = {
        **TxvCommonTestCase.by_design_skips,
        "test_retain_grad_hidden_states_attentions": (
            "the attentions returned are a dense [query, key] map rebuilt from the chunked, bucket-sorted LSH and "
            "local attention (as transformers' Reformer returns them): a copy the output does not flow through, so "
            "its .grad stays None (hidden states do get gradients); model_cards/txv_reformer.md, Limits"
        ),
        "test_left_padding_compatibility": (
            "positions count from the first column (axial position embeddings, as in transformers' Reformer): "
            "generate refuses left-padded prompts with a ValueError (test_modeling_txv_reformer.py); the forward takes "
            "padding masks as transformers' Reformer does"
        ),
    }

    def _check_caches_are_equal(self, cache1, cache2):
        """TxvReformerCache holds keys/values, LSH buckets, key validity and the LSH input streams, not a `layers`
        list: every one of its tensors must agree."""
        self.assertIsInstance(cache1, txv.modeling_txv_reformer.TxvReformerCache)
        self.assertIsInstance(cache2, txv.modeling_txv_reformer.TxvReformerCache)
        self.assertEqual(cache1.seen_tokens, cache2.seen_tokens)
        tensors1, tensors2 = cache1._row_tensors(), cache2._row_tensors()
        self.assertEqual(tensors1.keys(), tensors2.keys())
        for name, first in tensors1.items():
            second = tensors2[name]
            self.assertEqual(first is None, second is None, name)
            if isinstance(first, list):
                self.assertEqual(len(first), len(second), name)
                for a, b in zip(first, second):
                    torch.testing.assert_close(a, b, msg=name)
            elif first is not None:
                torch.testing.assert_close(first, second, msg=name)


def test_every_variant_has_a_common_test_class():
    tested = {cls.model_type for cls in TxvCommonTestCase.__subclasses__()}
    assert tested == set(txv.VARIANTS)
