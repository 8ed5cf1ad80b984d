"""The screen shows stages and figures; framework chatter goes to the log file (and to the screen with --verbose)."""

from __future__ import annotations

import io
import logging
import os
import sys
import textwrap
import warnings

import pytest

from pipeline.common.console import ScreenFilter, quiet_frameworks, run_logged

NOISY = [
    "[2026-11-21 22:54:52,040] [INFO] [launch.py:152:main] WORLD INFO DICT: {'localhost': [0, 1]}",
    "[2026-11-21 22:54:37,016] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU. "
    "If you have GPU or other accelerator, we were unable to detect it.",
    "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully",
    "2026/11/21 22:58:17 INFO mlflow.store.db.utils: Creating initial MLflow database tables...",
    "Loading weights: 100%|██████████| 103/103 [00:00<00:00, 2051.23it/s]",
    "Reconstructed fp32 state dict with 42 params 1462336 elements",
    "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 25.11it/s]",
    "Downloading artifacts:  40%|████      | 2/5 [00:00<00:00, 11814.94it/s]",
]
KEPT = [
    "== 5/8 pretrain (2 ranks)",
    "step 200: eval MLM loss 5.1234, perplexity 168.00",
    "[2026-11-21 22:55:00,000] [WARNING] [engine.py:1:f] gradient overflow, skipping step",
    "error: data.shards: no index.json in /tmp/x",
]


def test_known_framework_lines_are_hidden_and_the_pipelines_own_lines_kept():
    screen = ScreenFilter()
    assert [line for line in NOISY + KEPT if screen.shows(line)] == KEPT


def test_a_known_future_warning_is_hidden_with_its_source_line_and_an_unknown_one_is_shown():
    screen = ScreenFilter()
    known = ["/venv/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` "
             "is deprecated. Please use `torch.distributed.all_gather_single` instead.",
             "  return func(*args, **kwargs)"]
    unknown = ["/venv/x/y.py:3: FutureWarning: `frobnicate` will change its default in 2.0",
               "  warnings.warn("]
    assert [line for line in known + unknown + ["next"] if screen.shows(line)] == unknown + ["next"]


CHILD = textwrap.dedent("""
    import sys, time, warnings
    print("[2026-11-21 22:54:52,045] [INFO] [launch.py:170:main] dist_world_size=2")
    print("== stage heading")
    warnings.warn_explicit("`torch.distributed.all_gather_into_tensor` is deprecated", FutureWarning,
                           "/venv/torch/distributed/c10d_logger.py", 1, module="torch.distributed.c10d_logger")
    for i in range(3):
        sys.stderr.write(f"\\rpretrain: {i + 1}/3")
        sys.stderr.flush()
        if i == 1:  # a record logged while the bar is drawn arrives glued to it
            print("[2026-11-21 23:35:44,580] [INFO] [engine.py:1:f] mid-bar record")
    sys.stderr.write("\\n")
    print("result: 0.75")
    sys.exit(3)
""")


@pytest.mark.parametrize("verbose", [False, True])
def test_run_logged_writes_everything_to_the_log_and_filters_the_screen(tmp_path, verbose):
    log, screen = tmp_path / "logs" / "stage.log", io.StringIO()
    code = run_logged([sys.executable, "-u", "-c", CHILD], log, verbose=verbose, screen=screen)
    assert code == 3
    written = log.read_text()
    assert "dist_world_size=2" in written and "all_gather_into_tensor" in written
    assert "== stage heading" in written and "result: 0.75" in written
    assert "pretrain: 3/3\n" in written and "pretrain: 1/3" not in written  # a bar's final state only
    assert "[2026-11-21 23:35:44,580] [INFO] [engine.py:1:f] mid-bar record" in written.splitlines()
    shown = screen.getvalue()
    assert "== stage heading" in shown and "result: 0.75" in shown and "pretrain: 1/3\r" in shown
    assert ("dist_world_size=2" in shown) is verbose and ("mid-bar record" in shown) is verbose
    assert "pretrain: 2/3\r" in shown
    assert ("all_gather_into_tensor" in shown) is verbose


def test_a_rerun_appends_to_the_log_instead_of_replacing_it(tmp_path):
    log = tmp_path / "stage.log"
    for word in ("first", "second"):
        run_logged([sys.executable, "-c", f"print('{word}')"], log, screen=io.StringIO())
    text = log.read_text()
    assert text.index("first") < text.index("second")


@pytest.fixture
def restore_frameworks(monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("MLFLOW_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    deepspeed_logger = logging.getLogger("DeepSpeed")
    level = deepspeed_logger.level
    with warnings.catch_warnings():
        yield
    deepspeed_logger.setLevel(level)
    hf_logging.enable_progress_bar()


def _emit_known_and_unknown_warnings() -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", append=True)  # after quiet_frameworks' filters, which still decide first
        warnings.warn_explicit("`torch.distributed.all_gather_into_tensor` is deprecated", FutureWarning,
                               "c10d_logger.py", 1, module="torch.distributed.c10d_logger")
        warnings.warn_explicit("`frobnicate` will change", FutureWarning, "y.py", 1, module="x.y")
    return [str(w.message) for w in caught]


def test_quiet_frameworks_silences_only_the_known_warnings_and_lowers_deepspeed(restore_frameworks):
    from transformers.utils import logging as hf_logging

    quiet_frameworks()
    assert _emit_known_and_unknown_warnings() == ["`frobnicate` will change"]
    assert logging.getLogger("DeepSpeed").level == logging.WARNING
    assert not hf_logging.is_progress_bar_enabled()
    assert os.environ["MLFLOW_LOGGING_LEVEL"] == "WARNING"
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"


def test_verbose_leaves_every_framework_alone(restore_frameworks):
    from transformers.utils import logging as hf_logging

    quiet_frameworks(verbose=True)
    assert len(_emit_known_and_unknown_warnings()) == 2
    assert hf_logging.is_progress_bar_enabled()
