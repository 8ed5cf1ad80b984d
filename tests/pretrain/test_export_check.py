"""An export proves itself: one validation batch through the training-time model (the sparse MLM head, the run's
rows and precision) and through the exported folder loaded by transformers; beyond the precision's tolerance the
export is refused. Its card is a Hugging Face model card that `ModelCard.load` reads."""

from __future__ import annotations

import json

import pytest
from model_folders import save_export, save_pretraining_run

from pipeline.common.errors import PipelineError
from pipeline.common.output_agreement import RELATIVE_TOLERANCE
from pipeline.pretrain.export import PROVENANCE_FILE, export_checkpoint

CASES = {  # architecture, shard fixture, tokenizer fixture, the rows the training path runs on
    "roberta-full": ("roberta", "roberta_shards", "bpe_tokenizer_dir", "full rows"),
    "roberta-doc-packed": ("roberta", "doc_packed_shards", "bpe_tokenizer_dir", "doc-packed rows"),
    "prelayernorm-doc-packed": ("roberta-prelayernorm", "doc_packed_shards", "bpe_tokenizer_dir", "doc-packed rows"),
    "bert-pairs": ("bert", "pairs_shards", "wordpiece_tokenizer_dir", "padded rows of segment pairs"),
    "modernbert-doc-packed": ("modernbert", "doc_packed_shards", "bpe_tokenizer_dir", "doc-packed rows"),
}


def make_run(request, tmp_path, case: str, **kwargs):
    architecture, shards, tokenizer, _ = CASES[case]
    return save_pretraining_run(tmp_path / "run", request.getfixturevalue(shards),
                                request.getfixturevalue(tokenizer), architecture, **kwargs)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_architecture_exports_with_its_equivalence_figures(request, tmp_path, case, precision):
    run = make_run(request, tmp_path, case, precision=precision)
    out = export_checkpoint(run, tmp_path / "export")
    check = json.loads((out / PROVENANCE_FILE).read_text())["equivalence"]
    assert check["within_tolerance"] and check["precision"] == precision and check["compared"] > 20
    assert "MLM head at masked positions only), " + CASES[case][3] in check["reference"]
    assert check["tolerance"] == pytest.approx(RELATIVE_TOLERANCE[precision])  # small logits: the scale is 1
    if precision == "fp32":
        assert check["max_logit_difference"] <= 1e-5 and check["top1_agreement"] == 1.0
    else:  # the training path really ran in bf16: its logits differ from the fp32 export's, within the tolerance
        assert 1e-4 < check["max_logit_difference"] < check["tolerance"] and check["top1_agreement"] > 0.9


@pytest.mark.parametrize("case", ["roberta-doc-packed", "bert-pairs", "modernbert-doc-packed"])
def test_an_export_whose_config_unties_the_decoder_is_refused_and_nothing_is_written(request, tmp_path, case,
                                                                                      monkeypatch):
    """The saved config says the decoder is not tied to the embeddings; the safetensors hold it only tied, so
    transformers initialises it at random: the export mosaicml/examples #445 shipped."""
    import pipeline.pretrain.export as export

    run = make_run(request, tmp_path, case)
    written = export.write_hf_folder

    def untied(model, tokenizer, folder):
        written(model, tokenizer, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))

    monkeypatch.setattr(export, "write_hf_folder", untied)
    with pytest.raises(PipelineError, match=r"export of .*step_00000004 refused: .* largest logit difference is "
                                            r"[\d.]+, over the tolerance 0.0001 for fp32"):
        export_checkpoint(run, tmp_path / "export")
    assert not (tmp_path / "export").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export")]


def test_a_position_shifted_on_the_training_path_is_refused(request, tmp_path, monkeypatch):
    """Doc-packed rows number their positions themselves; one off from what transformers computes (the offset
    mistake of transformers PR #47525) and the trained model is one the export cannot reproduce."""
    import pipeline.pretrain.model as model

    run = make_run(request, tmp_path, "roberta-doc-packed")
    first = model.first_position_id
    monkeypatch.setattr(model, "first_position_id", lambda architecture, pad_id: first(architecture, pad_id) - 1)
    with pytest.raises(PipelineError, match="refused: the saved folder, loaded with transformers' Auto classes, "
                                            "does not compute what the model computed"):
        export_checkpoint(run, tmp_path / "export")


def test_nan_logits_are_refused(request, tmp_path, monkeypatch):
    import torch

    import pipeline.pretrain.export as export

    run = make_run(request, tmp_path, "modernbert-doc-packed")
    written = export.write_hf_folder

    def poisoned(model, tokenizer, folder):
        with torch.no_grad():
            model.model.final_norm.weight[0] = float("nan")
        written(model, tokenizer, folder)

    monkeypatch.setattr(export, "write_hf_folder", poisoned)
    with pytest.raises(PipelineError, match="largest logit difference is inf"):
        export_checkpoint(run, tmp_path / "export")


def test_the_card_is_a_model_card_with_the_runs_facts_and_figures(request, tmp_path, doc_packed_shards):
    from huggingface_hub import ModelCard

    from pipeline.pretrain.export_card import record_scores

    run = make_run(request, tmp_path, "roberta-doc-packed", steps=(2, 4), evaluations={2: 5.9, 4: 5.61})
    out = export_checkpoint(run, tmp_path / "export")
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "fill-mask"
    assert card.data.datasets == [doc_packed_shards.name] and card.data.base_model is None
    text = card.text
    assert "| validation MLM loss (step 4) | 5.610 (unigram entropy 5.000: 0.610 nats above it) |" in text
    assert "| tokens seen | 4,096 (sequence positions, padding included) |" in text  # 4 steps × 16 × 64
    assert "| steps | 4 of 8 |" in text and "| tokenizer | BPE, vocabulary 400 |" in text
    assert "largest logit difference is 0 (tolerance 0.0001 for fp32)" in text
    assert f'pipeline("fill-mask", model="{out.resolve()}")' in text and "cloze" not in text
    record_scores(out, cloze={"accuracy": 0.25, "constant_accuracy": 0.1, "masked": 120, "texts": 9,
                              "mask_rate": 0.15, "examples": []},
                  minimal_pairs={"model_scores": {"overall": {"accuracy": 0.7, "pairs": 300}},
                                 "unigram_scores": {"overall": {"accuracy": 0.6, "pairs": 300}},
                                 "group_by": "phenomenon", "pairs_file": "pairs.jsonl"})
    text = ModelCard.load(out / "README.md").text
    assert "| cloze top-1 accuracy | 0.250 (always the most frequent token: 0.100; 120 blanks) |" in text
    assert "| minimal pairs | 0.700 (unigram model: 0.600; 300 pairs) |" in text


def test_the_card_of_a_continued_run_names_its_base_model(tmp_path, bpe_tokenizer_dir, roberta_shards):
    from huggingface_hub import ModelCard

    base = save_export(bpe_tokenizer_dir, tmp_path / "released", "roberta")
    run = save_pretraining_run(tmp_path / "run", roberta_shards, bpe_tokenizer_dir, init_from=str(base))
    out = export_checkpoint(run, tmp_path / "export")
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == str(base) and f"continued from `{base}`" in card.text


def test_a_card_rewritten_with_later_figures_leaves_the_exports_fingerprint(request, tmp_path):
    from pipeline.common.fingerprints import model_fingerprint
    from pipeline.pretrain.export_card import record_scores

    out = export_checkpoint(make_run(request, tmp_path, "roberta-full"), tmp_path / "export")
    before = model_fingerprint(str(out))
    record_scores(out, cloze={"accuracy": 0.3, "constant_accuracy": 0.1, "masked": 10, "texts": 2, "mask_rate": 0.15})
    assert model_fingerprint(str(out)) == before  # finished fine-tuning seeds of this export stay reusable


def test_an_export_whose_validation_shards_are_gone_says_what_to_restore(tmp_path, doc_packed_shards,
                                                                         bpe_tokenizer_dir):
    import shutil

    moved = tmp_path / "shards"
    shutil.copytree(doc_packed_shards, moved)
    run = save_pretraining_run(tmp_path / "run", moved, bpe_tokenizer_dir)
    shutil.rmtree(moved)
    with pytest.raises(PipelineError, match=f"the export is checked on the run's validation shards, which cannot be "
                                            f"read: .*{moved}.*Restore the shard folder the run's config names"):
        export_checkpoint(run, tmp_path / "export")
