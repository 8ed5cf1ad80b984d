"""Benchmark results: recorded with their conditions, rendered beside them, and the committed page kept in step."""

from __future__ import annotations

import argparse
import json
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import each other as top-level modules, as when run

import harness  # noqa: E402
import render_tables  # noqa: E402
from harness import BenchmarkRecord, Study  # noqa: E402

# modules, not benchmarks
HELPERS = {"harness.py", "render_tables.py", "hf_baselines.py", "gpu_runs.py", "gpu_bundle.py", "plain_loop.py",
           "embedding_data.py", "embedding_serving.py"}
TOY = Study("toy_bench", question="Is ours faster?", metric="tokens/s", baseline="HF", arms=("ours", "HF"))


def synthetic_result(out: Path, name: str = "toy_bench") -> dict:
    with BenchmarkRecord(name, argv=["benchmarks/toy_bench.py", "--steps", "3"], out_dir=out, study=TOY) as rec:
        rec.table("toy rows", [{"method": "ours", "tokens/s": 5162}, {"method": "HF", "tokens/s": 1820}])
        rec.headline("ours vs HF", "2.84×", target="≥ 2×", met=True)
    return json.loads((out / f"{name}.json").read_text())


def page_with_region(name: str) -> str:
    return (f"# Page\n\nHand-written prose.\n\n{render_tables.START.format(name=name)}\n"
            f"{render_tables.END}\n\nMore prose.\n")


def test_a_record_holds_the_command_date_machine_load_commit_and_study(tmp_path, monkeypatch):
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    data = synthetic_result(tmp_path)
    assert data["command"] == "OMP_NUM_THREADS=1 python benchmarks/toy_bench.py --steps 3"
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", data["date"])
    assert data["machine"]["cores"] >= 1 and data["machine"]["cpu_model"]
    assert len(data["load_start"]) == 3 and len(data["load_end"]) == 3
    assert re.fullmatch(r"[0-9a-f]{40}", data["git_commit"]) and isinstance(data["git_dirty"], bool)
    assert data["results"]["tables"][0]["columns"] == ["method", "tokens/s"]
    assert data["results"]["headline"]["ours vs HF"] == {"value": "2.84×", "target": "≥ 2×", "met": True}
    assert data["study"] == {"question": "Is ours faster?", "metric": "tokens/s", "baseline": "HF",
                             "arms": ["ours", "HF"]}


def test_a_study_names_its_arms_metric_and_baseline_and_records_under_its_name(tmp_path):
    with pytest.raises(ValueError, match="give baseline, arms"):
        Study("half_declared", question="?", metric="s", baseline="", arms=())
    with TOY.record("smoke", argv=["x"], out_dir=tmp_path) as rec:
        rec.table("t", [{"a": 1}])
    assert json.loads((tmp_path / "toy_bench.smoke.json").read_text())["study"]["arms"] == ["ours", "HF"]


def test_a_copy_records_the_commit_its_caller_names_and_no_dirty_state(tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    copy.mkdir()
    monkeypatch.setenv("BENCHMARK_GIT_COMMIT", "a" * 40)
    assert harness.git_state(copy) == {"commit": "a" * 40, "dirty": None}
    assert harness.git_state(ROOT) == {"commit": "a" * 40, "dirty": None}  # even beside a .git of its own
    monkeypatch.delenv("BENCHMARK_GIT_COMMIT")
    assert harness.git_state(ROOT)["commit"] != "a" * 40


def test_a_step_log_stays_in_the_record_and_off_the_page(tmp_path):
    data = synthetic_result(tmp_path)
    data["results"]["steps"] = [{"step": "a", "status": "failed", "traceback": "Traceback (most recent call last)"}]
    data["results"]["summary"] = {"ok": 1}
    page = render_tables.render_result(data)
    assert "Traceback" not in page and '"summary": {"ok": 1}' in page


def test_a_benchmark_that_fails_writes_no_result(tmp_path):
    with pytest.raises(RuntimeError), BenchmarkRecord("broken", argv=["x"], out_dir=tmp_path) as rec:
        rec.table("half", [{"a": 1}])
        raise RuntimeError("the run died")
    assert list(tmp_path.iterdir()) == []


def test_a_variant_name_is_its_own_file_and_a_bad_name_is_refused(tmp_path):
    synthetic_result(tmp_path, "toy_bench.budget-tiny")
    assert (tmp_path / "toy_bench.budget-tiny.json").is_file()
    with pytest.raises(ValueError, match="benchmark name"):
        BenchmarkRecord("../escape", argv=["x"], out_dir=tmp_path)


def test_the_conditions_are_rendered_right_under_the_table(tmp_path, monkeypatch):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    results = tmp_path / "results"
    data = synthetic_result(results)
    page = render_tables.render_page(page_with_region("toy_bench"), render_tables.load_results(results))
    region = page.split(render_tables.START.format(name="toy_bench"))[1].split(render_tables.END)[0]
    table_end = region.index("| HF | 1820 |")
    after = region[table_end:]
    for fact in ("ours vs HF: **2.84×** (target ≥ 2×: **met**)",
                 "*Study:* arms ours, HF; metric: tokens/s; baseline: HF",
                 "command: `python benchmarks/toy_bench.py --steps 3`",
                 f"date: {data['date']}", f"{data['machine']['cores']} cores", data["machine"]["cpu_model"],
                 "at the start", "at the end", f"git commit: `{data['git_commit'][:7]}`"):
        assert fact in after, fact
    assert page.startswith("# Page\n\nHand-written prose.") and page.endswith("More prose.\n")
    assert "Transcribed" not in region


def test_the_machine_is_named_once_at_the_top_and_per_result_only_where_it_differs(tmp_path):
    results = tmp_path / "results"
    synthetic_result(results, "here")
    synthetic_result(results, "also_here")
    synthetic_result(results, "elsewhere")
    data = json.loads((results / "elsewhere.json").read_text())
    data["machine"] = {"cores": 64, "cpu_model": "Other CPU"}
    (results / "elsewhere.json").write_text(json.dumps(data))
    page = (f"# Page\n\n{render_tables.MACHINE_START}\n{render_tables.END}\n\n"
            + "".join(page_with_region(name) for name in ("here", "also_here", "elsewhere")))
    page = render_tables.render_page(page, render_tables.load_results(results))
    machine = render_tables.machine_text(json.loads((results / "here.json").read_text())["machine"])
    assert page.count(machine) == 1 and f"it ran on: {machine}." in page
    assert page.count("machine: 64 cores, Other CPU") == 1
    # Without the machine region, no result's machine goes unstated.
    page = render_tables.render_page(page_with_region("here"), render_tables.load_results(results))
    assert f"machine: {machine}" in page


def test_a_transcribed_result_says_so_and_how_to_regenerate_it(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    data = synthetic_result(tmp_path)
    data.update(provenance="transcribed", transcribed_from={"file": "README.md", "commit": "abc1234" + "0" * 33},
                load_start=None, load_end=None, load_note="about 20")
    text = render_tables.render_result(data)
    assert "*Transcribed* from README.md at commit `abc1234`" in text
    assert "its command regenerates it" in text and "command: `python benchmarks/toy_bench.py --steps 3`" in text
    assert "load average: about 20" in text


def test_check_fails_on_a_stale_page_and_passes_once_rendered(tmp_path, capsys):
    results = tmp_path / "results"
    synthetic_result(results)
    page = tmp_path / "page.md"
    page.write_text(page_with_region("toy_bench"))
    args = ["--page", str(page), "--results", str(results)]
    assert render_tables.main([*args, "--check"]) == 1
    assert render_tables.main(args) == 0
    assert render_tables.main([*args, "--check"]) == 0
    data = json.loads((results / "toy_bench.json").read_text())
    data["results"]["tables"][0]["rows"][0]["tokens/s"] = 9999  # a figure changed, the page not rerendered
    (results / "toy_bench.json").write_text(json.dumps(data))
    assert render_tables.main([*args, "--check"]) == 1
    assert "toy_bench" in capsys.readouterr().err


def test_a_result_without_a_region_is_appended_so_it_cannot_go_unseen(tmp_path):
    results = tmp_path / "results"
    synthetic_result(results, "new_bench")
    page = render_tables.render_page("# Page\n", render_tables.load_results(results))
    assert render_tables.OTHER_HEADING in page and render_tables.START.format(name="new_bench") in page


def test_a_region_without_its_result_is_an_error_naming_the_file(tmp_path):
    with pytest.raises(render_tables.PipelineError, match=r"benchmarks/results/gone\.json"):
        render_tables.render_page(page_with_region("gone"), {})


def test_a_result_rendered_in_two_places_is_an_error(tmp_path):
    results = tmp_path / "results"
    synthetic_result(results, "twice")
    with pytest.raises(render_tables.PipelineError, match=r"two regions for benchmarks/results/twice\.json"):
        render_tables.render_page(page_with_region("twice") + page_with_region("twice"),
                                  render_tables.load_results(results))


def test_the_committed_page_matches_the_committed_results():
    assert render_tables.main(["--check"]) == 0, "run: python benchmarks/render_tables.py"


def test_every_benchmark_declares_its_study_and_records_through_it():
    scripts = [p for p in BENCHMARKS.glob("*.py") if p.name not in HELPERS]
    assert scripts
    for script in scripts:
        study = runpy.run_path(str(script), run_name="declaration")["STUDY"]
        assert isinstance(study, Study) and study.name == script.stem, script.name
        assert "STUDY.record(" in script.read_text(), f"{script.name} writes no record through its study"


def commands_in_page(page: Path) -> list[list[str]]:
    """Every `python benchmarks/X.py ...` line of the page's fenced code blocks, continuations joined."""
    text = re.sub(r"^> ?", "", page.read_text(), flags=re.M)  # blocks quoted in the maintainers' note too
    # Fences pair in order; only shell blocks (```bash or bare) hold commands, not ```text or ```json.
    blocks = [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if lang in ("", "bash")]
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split(" #")[0]) if "benchmarks/" in line else []
            while words and re.match(r"^[A-Z_]+=", words[0]):  # OMP_NUM_THREADS=1 python ...
                words = words[1:]
            if words[:1] == ["python"] and words[1].startswith("benchmarks/"):
                commands.append(words[1:])
    return commands


def commands_of_results() -> list[list[str]]:
    """The command each committed result names (its "rerun ... to regenerate")."""
    commands = []
    for path in sorted(render_tables.RESULTS_DIR.glob("*.json")):
        words = shlex.split(json.loads(path.read_text())["command"])
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        assert words[:1] == ["python"], f"{path.name}: {words}"
        commands.append(words[1:])
    return commands


class Parsed(Exception):
    pass


def test_every_command_on_the_page_and_in_the_results_parses(monkeypatch):
    commands = commands_in_page(render_tables.PAGE) + commands_of_results()
    assert len(commands) >= len(list(render_tables.RESULTS_DIR.glob("*.json")))  # a command from every record
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)  # unknown flags and bad values exit 2 here
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for script, *args in commands:
        # As `python script` does: the script's folder first (the scripts prepend the repository too).
        monkeypatch.setattr(sys, "path", [str((ROOT / script).parent), *sys.path])
        monkeypatch.setattr(sys, "argv", [script, *args])
        with pytest.raises(Parsed):
            runpy.run_path(str(ROOT / script), run_name="__main__")


def test_a_result_may_sit_on_the_page_of_its_subject_and_is_then_not_appended(tmp_path):
    results = tmp_path / "results"
    synthetic_result(results, "scale_bench")
    main, others = render_tables.render_pages("# Benchmarks\n", {"docs/data.md": page_with_region("scale_bench")},
                                              render_tables.load_results(results))
    assert render_tables.OTHER_HEADING not in main
    assert "| ours | 5162 |" in others["docs/data.md"]
