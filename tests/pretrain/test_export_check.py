"""An export proves itself: one validation batch through the training-time model (rebuilt from the run's config:
the sparse MLM head, the run's rows, in fp32 whatever the run trained in) and through the exported folder loaded by
transformers; logits or losses beyond fp32's tolerance, or a tokenizer that is not the shards', and the export is
refused. Its card is a Hugging Face model card that `ModelCard.load` reads."""

from __future__ import annotations

import json

import pytest
from model_folders import save_export, save_pretraining_run

from pipeline.common.errors import PipelineError
from pipeline.models.output_agreement import RELATIVE_TOLERANCE
from pipeline.pretrain.export.folder import PROVENANCE_FILE, export_checkpoint

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
    # The reference runs in fp32 whatever the run trained in, held to fp32's tolerance (small logits: scale 1).
    assert check["within_tolerance"] and check["precision"] == "fp32" and check["compared"] > 20
    assert check["tolerance"] == pytest.approx(RELATIVE_TOLERANCE["fp32"])
    assert "built from the run's config: MLM head at masked positions only), " + CASES[case][3] in check["reference"]
    assert (f"its {precision} run's fp32 weights" in check["reference"]) == (precision != "fp32")
    assert check["max_logit_difference"] <= 1e-5 and check["top1_agreement"] == 1.0
    loss = check["mlm_loss"]  # the engine's loss on the batch, and the folder's own
    assert 1 < loss["reference"] and loss["difference"] <= 1e-5 and loss["tolerance"] == pytest.approx(
        1e-4 * loss["reference"])
    shards = json.loads((request.getfixturevalue(CASES[case][1]) / "index.json").read_text())
    assert check["tokenizer_fingerprint"] == shards["tokenizer"]["fingerprint"]


@pytest.mark.parametrize("case", ["roberta-doc-packed", "bert-pairs"])
def test_an_export_whose_recorded_config_is_wrong_is_refused(request, tmp_path, case):
    """The checkpoint's record keeps the model's transformers config, which the export writes; one field wrong
    there (here the activation) and the export computes another function than the model the config trained."""
    run = make_run(request, tmp_path, case)
    record = run / "checkpoints" / "step_00000004" / "complete.json"
    marker = json.loads(record.read_text())
    marker["hf_config"]["hidden_act"] = "relu"
    record.write_text(json.dumps(marker))
    with pytest.raises(PipelineError, match=r"export of .*step_00000004 refused: .* largest logit difference is "
                                            r"[\d.]+, over the tolerance 0.0001 for fp32"):
        export_checkpoint(run, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_a_weight_reset_on_the_way_out_of_a_bf16_run_is_refused(request, tmp_path, monkeypatch):
    """A LayerNorm reset to its initial values moves these small logits by about 0.013: inside bf16's tolerance
    (0.06), which a bf16 reference needs for its own rounding, far outside fp32's (0.0001), which the reference
    runs in."""
    import torch

    import pipeline.pretrain.export.folder as export

    run = make_run(request, tmp_path, "roberta-doc-packed", precision="bf16")
    written = export.write_hf_folder

    def reset(model, tokenizer, folder):
        with torch.no_grad():
            norm = model.roberta.encoder.layer[0].output.LayerNorm
            norm.weight.fill_(1.0)
            norm.bias.zero_()
        written(model, tokenizer, folder)

    monkeypatch.setattr(export, "write_hf_folder", reset)
    with pytest.raises(PipelineError, match=r"refused: .*, fp32\) the largest logit difference is [\d.]+, over the "
                                            r"tolerance 0.0001 for fp32"):
        export_checkpoint(run, tmp_path / "export")


def test_an_export_with_another_tokenizer_than_the_shards_is_refused(request, tmp_path, monkeypatch,
                                                                       wordpiece_tokenizer_dir, doc_packed_shards):
    import shutil

    import pipeline.pretrain.export.folder as export
    from pipeline.data.tokenizer import load_tokenizer

    run = make_run(request, tmp_path, "roberta-doc-packed")
    other = load_tokenizer(wordpiece_tokenizer_dir)
    written = export.write_hf_folder
    monkeypatch.setattr(export, "write_hf_folder", lambda model, tokenizer, folder: written(model, other, folder))
    shards = json.loads((doc_packed_shards / "index.json").read_text())["tokenizer"]["fingerprint"]
    with pytest.raises(PipelineError, match=rf"export of .*step_00000004 refused: the tokenizer saved in the export "
                                            rf".* is not the tokenizer the run's shards {doc_packed_shards} were made "
                                            rf"with: its fingerprint is sha256:\w+, the shards' {shards}"):
        export_checkpoint(run, tmp_path / "export")
    assert not (tmp_path / "export").exists()

    monkeypatch.setattr(export, "write_hf_folder", written)  # the run's own copy replaced: refused before any weight
    shutil.rmtree(run / "tokenizer")
    shutil.copytree(wordpiece_tokenizer_dir, run / "tokenizer")
    monkeypatch.setattr(export, "consolidated_state_dict", lambda *_: pytest.fail("the weights were read"))
    with pytest.raises(PipelineError, match=r"refused: the run's tokenizer .* is not the tokenizer the run's shards"):
        export_checkpoint(run, tmp_path / "export")


@pytest.mark.parametrize("case", ["roberta-doc-packed", "bert-pairs", "modernbert-doc-packed"])
def test_an_export_whose_config_unties_the_decoder_is_refused_and_nothing_is_written(request, tmp_path, case,
                                                                                      monkeypatch):
    """The saved config says the decoder is not tied to the embeddings; the safetensors hold it only tied, so
    transformers initialises it at random: the export mosaicml/examples #445 shipped."""
    import pipeline.pretrain.export.folder as export

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
    import pipeline.pretrain.batches.stretch_data as batches

    run = make_run(request, tmp_path, "roberta-doc-packed")
    made = batches.MaskedBatches
    monkeypatch.setattr(batches, "MaskedBatches", lambda *args, position_offset, **kwargs: made(
        *args, position_offset=position_offset - 1, **kwargs))
    with pytest.raises(PipelineError, match="refused: the saved folder, loaded with transformers' Auto classes, "
                                            "does not compute what the model computed"):
        export_checkpoint(run, tmp_path / "export")


def test_nan_logits_are_refused(request, tmp_path, monkeypatch):
    import torch

    import pipeline.pretrain.export.folder as export

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

    from pipeline.pretrain.export.card import record_scores

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
    assert "The MLM loss on that batch is the same through the training class and this folder" in text
    assert "its tokenizer has the fingerprint of the tokenizer the shards were made with" in text
    assert f'pipeline("fill-mask", model="{out.resolve()}")' in text and "cloze" not in text
    record_scores(out, cloze={"accuracy": 0.25, "constant_accuracy": 0.1, "masked": 120, "texts": 9,
                              "mask_rate": 0.15, "examples": []},
                  minimal_pairs={"model_scores": {"overall": {"accuracy": 0.7, "pairs": 300}},
                                 "unigram_scores": {"overall": {"accuracy": 0.6, "pairs": 300}},
                                 "group_by": "phenomenon", "pairs_file": "pairs.jsonl"})
    text = ModelCard.load(out / "README.md").text
    assert "| cloze top-1 accuracy | 0.250 (always the most frequent token: 0.100; 120 blanks) |" in text
    assert "| minimal pairs | 0.700 (unigram model: 0.600; 300 pairs) |" in text


def test_the_card_of_a_run_in_phases_names_the_phases_corpora(tmp_path, doc_packed_shards, bpe_tokenizer_dir):
    import shutil

    from huggingface_hub import ModelCard

    books = shutil.copytree(doc_packed_shards, tmp_path / "books")
    run = save_pretraining_run(tmp_path / "run", doc_packed_shards, bpe_tokenizer_dir)
    record = run / "checkpoints" / "step_00000004" / "complete.json"
    marker = json.loads(record.read_text())
    marker["config"]["data"]["shards"] = ""
    marker["config"]["phases"] = [
        {"name": "short", "steps_fraction": 0.5, "shards": str(doc_packed_shards)},
        {"name": "mixed", "steps_fraction": 0.5, "shards": [{"path": str(doc_packed_shards), "weight": 1},
                                                              {"path": str(books), "weight": 1}]}]
    record.write_text(json.dumps(marker))
    card = ModelCard.load(export_checkpoint(run, tmp_path / "export") / "README.md")
    assert card.data.datasets == [doc_packed_shards.name, "books"]
    assert f"| phases | short (0.5 of the steps, {doc_packed_shards.name}), mixed (0.5 of the steps, " \
           f"{doc_packed_shards.name}, books) |" in card.text


def test_the_card_of_a_continued_run_names_its_base_model(tmp_path, bpe_tokenizer_dir, roberta_shards):
    from huggingface_hub import ModelCard

    base = save_export(bpe_tokenizer_dir, tmp_path / "released", "roberta")
    run = save_pretraining_run(tmp_path / "run", roberta_shards, bpe_tokenizer_dir, init_from=str(base))
    out = export_checkpoint(run, tmp_path / "export")
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == str(base) and f"continued from `{base}`" in card.text


def test_a_card_rewritten_with_later_figures_leaves_the_exports_fingerprint(request, tmp_path):
    from pipeline.models.fingerprints import model_fingerprint
    from pipeline.pretrain.export.card import record_scores

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
