"""benchmarks/mfu.py and benchmarks/gpu_check.{sh,py} (#30): the parsing and tables on made-up logs, a setting
that does not validate reported as "not available", and (slow) the whole check as a CPU dry run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(REPO / "benchmarks"))  # gpu_check imports mfu as a sibling script
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up; gpu_check's `import mfu` finds this one
    spec.loader.exec_module(module)
    return module


mfu = _load("mfu")
gpu_check = _load("gpu_check")


def _records(seconds: dict[int, float], tokens: int = 1000) -> list[dict]:
    """speed_monitor's per-batch lines (window 1): nothing for batch 1, then throughput from each batch's time."""
    out = []
    for step, s in seconds.items():
        line = {"step": step, "loss/train/total": 10.0 - step / 10, "memory/peak_allocated_mem": 1.0 + step}
        if step > 1:
            line.update({"throughput/batches_per_sec": 1 / s, "throughput/device/tokens_per_sec": tokens / s,
                         "throughput/device/mfu": 0.1 / s})
        out.append(line)
    return out


def test_a_row_is_the_median_after_warmup_so_compile_batches_do_not_count():
    seconds = {1: 30.0, 2: 9.0, 3: 0.5, 4: 0.5, 5: 0.4, 6: 0.6}  # batches 1-2 compile
    stats = mfu.summarise(_records(seconds), warmup=2)
    assert stats["tok_s"] == pytest.approx(2000.0)  # median of 1000/0.5, 1000/0.5, 1000/0.4, 1000/0.6
    assert stats["step_s"] == pytest.approx(0.5)
    assert stats["mfu"] == pytest.approx(0.2)
    assert stats["peak_gb"] == 7.0 and stats["losses"][6] == pytest.approx(9.4)


def test_the_save_stall_is_the_extra_time_of_the_batches_after_each_save():
    base = 0.3
    sync = {b: base for b in range(2, 13)} | {5: base + 7.0, 9: base + 6.0}  # the batch after a save waits for it
    asyn = {b: base for b in range(2, 13)} | {5: base + 0.2, 6: base + 0.3, 9: base + 0.1}  # spread over batches
    assert mfu.batch_seconds(_records(sync))[5] == pytest.approx(7.3)
    assert gpu_check.stall_excess(sync, [4, 8], 4, base) == pytest.approx([7.0, 6.0])
    assert gpu_check.stall_excess(asyn, [4, 8], 4, base) == pytest.approx([0.5, 0.1])


def test_a_failed_run_is_told_apart_as_not_available_out_of_memory_or_failed():
    assert mfu.classify_failure(2, "error: precision: 'amp_fp8' is not one of ...\n").startswith(
        "not available (error: precision: 'amp_fp8'")
    assert mfu.classify_failure(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == "OOM"
    assert mfu.classify_failure(1, "Traceback ...\nRuntimeError: boom") == "failed, exit 1 (RuntimeError: boom)"


def test_a_row_whose_key_does_not_validate_is_not_available_and_the_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(mfu, "ROWS", [mfu.Row("tiny", "future key", ["precision=amp_fp9"]),
                                      mfu.Row("tiny", "future section", ["+fsdp_config={no_such_key: 1}"])])
    out = tmp_path / "rows.json"
    assert mfu.main(["--tiny", "--data", str(tmp_path / "data"), "--work", str(tmp_path), "--json", str(out),
                     "--markdown", str(tmp_path / "t.md")]) == 0
    rows = json.loads(out.read_text())
    assert [r["name"] for r in rows] == ["future key", "future section"]
    assert all(r["status"].startswith("not available (") and r["tok_s"] is None for r in rows), rows
    assert "no_such_key" in rows[1]["status"]
    assert "| tiny | future key | `precision=amp_fp9` | - |" in (tmp_path / "t.md").read_text()
    assert not (tmp_path / "data").exists()  # refused before any data was prepared


def test_the_table_marks_the_fastest_row_and_gives_the_published_figure_and_the_transformers_ratio():
    eager = mfu.Result(mfu.Row("125m", "eager alibi", [], hf=True), tok_s=200_000.0, mfu=0.25, step_s=0.16)
    tuned = mfu.Result(mfu.Row("125m", "compile", [mfu._COMPILE]), tok_s=300_000.0, mfu=0.375, step_s=0.11)
    oom = mfu.Result(mfu.Row("125m", "big", []), status="OOM")
    text = mfu.markdown([eager, tuned, oom], {"125m": {"tok_s": 50_000.0, "micro": 16, "status": "ok"}}, "# t")
    assert "| 125m | compile **best** | `compile_config={}` | 300,000 | 37.5% |" in text
    assert "| 125m | big | `` | - | - | - | - | OOM |" in text
    assert "A100 80GB, 8, 40: 44.79%, 142,830" in text  # llm-foundry's row for the shape, with its hardware
    assert "| 50,000 (16) | 4.00x | 6.00x |" in text


def test_plan_output_is_read_for_peak_memory_step_time_and_mfu():
    text = ("  peak                    32.33 GiB   of 80.00 GiB: fits, 47.67 GiB headroom\n"
            "  step time               0.055 s   tok/s per GPU 599,814   MFU 58.7%\n")
    assert gpu_check.parse_plan(text) == dict(peak_gib=32.33, step_s=0.055, tok_s=599814.0, mfu=58.7)


def test_the_cuda_tests_section_collects_every_file_that_uses_the_gpu_marker():
    files = gpu_check.gpu_test_files()
    assert "tests/train/test_lf_callbacks_monitoring.py" in files
    assert all("mark.gpu" in (REPO / f).read_text() for f in files)


def test_the_script_says_how_dependencies_travel_and_the_pack_folder_is_ignored():
    head = (REPO / "benchmarks/gpu_check.sh").read_text().split("set -u")[0]
    assert "bash benchmarks/gpu_check.sh --pack" in head and "--cpu-dry-run" in head and ".gpu" in head
    ignored = subprocess.run(["git", "check-ignore", "-q", ".gpu/site/x.py"], cwd=REPO)
    assert ignored.returncode == 0
