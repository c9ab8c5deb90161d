"""Report files, compare(), and the self-contained HTML."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import jiwer
import pytest

from batchscribe.eval import compare, comparison_rows, evaluate, summary_rows, write_report
from batchscribe.eval.normalize import basic_normalize

REFS = {
    "w1": "the cat sat on the mat",
    "w2": "a stitch in time saves nine",
    "w3": "all that glitters is not gold",
    "w4": "every cloud has a silver lining",
    "w5": "actions speak louder than words",
}
# A beats B on w1 and w2, B beats A on w3, they tie on w4 (same errors) and w5 (both perfect).
HYPS_A = {"w1": "the cat sat on the mat", "w2": "a stitch in time saves nine",
          "w3": "all that glitters is gold", "w4": "every cloud has silver lining",
          "w5": "actions speak louder than words"}
HYPS_B = {"w1": "the cat sat on a hat", "w2": "stitch in tine save nine",
          "w3": "all that glitters is not gold", "w4": "every cloud had a silver lining",
          "w5": "actions speak louder than words"}


def _run_dir(root: Path, name: str, hyps: dict[str, str], extra: list[dict] | None = None) -> Path:
    out = root / name
    out.mkdir(parents=True)
    rows = [{"id": k, "text": v, "duration": 2.0 + len(v) / 10} for k, v in hyps.items()] + (extra or [])
    (out / "records-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "summary.json").write_text(json.dumps({"model": f"model-{name}", "items": len(rows)}))
    return out


@pytest.fixture()
def refs(tmp_path: Path) -> Path:
    path = tmp_path / "refs.jsonl"
    path.write_text("".join(json.dumps({"id": k, "text": v, "book": k in ("w1", "w2")}) + "\n"
                            for k, v in REFS.items()))
    return path


def test_compare_counts_wins_losses_and_paired_interval(tmp_path: Path, refs: Path) -> None:
    ra = evaluate(_run_dir(tmp_path, "a", HYPS_A), [str(refs)], normalizer="basic", bootstrap=400)
    rb = evaluate(_run_dir(tmp_path, "b", HYPS_B), [str(refs)], normalizer="basic", bootstrap=400)
    c = compare(ra, rb, name_a="A", name_b="B")
    assert [x.id for x in c.wins_a] == ["w2", "w1"]  # biggest margin first: w2 (0 vs 3), w1 (0 vs 2)
    assert [x.id for x in c.wins_b] == ["w3"]
    assert c.ties == 2 and c.n_items == 5
    ids = list(REFS)
    wer_a = jiwer.wer([REFS[i] for i in ids], [HYPS_A[i] for i in ids])
    wer_b = jiwer.wer([REFS[i] for i in ids], [HYPS_B[i] for i in ids])
    assert c.wer_a == pytest.approx(wer_a) and c.wer_b == pytest.approx(wer_b)
    assert c.diff == pytest.approx(wer_a - wer_b)
    assert c.ci is not None and c.ci[0] <= c.diff <= c.ci[1]
    self_c = compare(ra, ra)  # a system against itself: every resample differs by exactly 0
    assert self_c.ci == (0.0, 0.0) and self_c.ties == 5 and not self_c.wins_a
    assert any("better" in label for label, _ in comparison_rows(c))


def test_compare_refuses_different_references(tmp_path: Path, refs: Path) -> None:
    ra = evaluate(_run_dir(tmp_path, "a", HYPS_A), [str(refs)], normalizer="basic", bootstrap=0)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"id": k, "text": v + " extra"}) + "\n" for k, v in REFS.items()))
    rb = evaluate(_run_dir(tmp_path, "b", HYPS_B), [str(other)], normalizer="basic", bootstrap=0)
    with pytest.raises(ValueError, match="same --references"):
        compare(ra, rb)


def test_write_report_files_hold_every_figure(tmp_path: Path, refs: Path) -> None:
    err = [{"id": "w5-bad", "error": "w5-bad: unreadable", "duration": None}]
    run = _run_dir(tmp_path, "a", {k: v for k, v in HYPS_B.items() if k != "w4"}, extra=err)
    report = evaluate(run, [str(refs)], normalizer="basic", group_columns=["book"], worst_n=3, bootstrap=100)
    paths = write_report(report, tmp_path / "report")
    assert {p.name for p in paths.values()} == {"report.json", "report.md", "report.html"}

    def no_nan(token: str) -> float:
        raise AssertionError(f"non-JSON constant {token} in report.json")

    data = json.loads(paths["json"].read_text(), parse_constant=no_nan)
    ids = list(REFS)
    hyps = [HYPS_B.get(i, "") if i != "w4" else "" for i in ids]
    expected = jiwer.process_words([basic_normalize(REFS[i]) for i in ids], [basic_normalize(h) for h in hyps])
    assert data["corpus"]["wer"] == pytest.approx(expected.wer)
    assert data["corpus"]["words"]["deletions"] == expected.deletions
    lo, hi = data["corpus"]["wer_ci95"]
    assert lo <= data["corpus"]["wer"] <= hi
    assert data["model"] == "model-a" and data["versions"]["jiwer"] == metadata.version("jiwer")
    assert data["settings"]["normalizer"] == "basic" and data["settings"]["bootstrap"] == 100
    assert data["missing"] == ["w4"] and data["unmatched_predictions"] == ["w5-bad"]
    assert len(data["items"]) == 5 and len(data["worst"]) == 3
    assert {r["key"] for r in data["by_group"]["book"]} == {"True", "False"}
    assert data["worst"][0]["aligned"]["ref"].split() == basic_normalize(REFS[data["worst"][0]["id"]]).split()

    md = paths["md"].read_text()
    assert "## By book" in md and "## Missing predictions" in md and "REF: " in md
    assert "| WER |" in md
    labels = [label for label, _ in summary_rows(report)]
    assert labels[:2] == ["Items", "WER"]


def test_html_is_self_contained_with_embedded_charts(tmp_path: Path, refs: Path) -> None:
    report = evaluate(_run_dir(tmp_path, "a", HYPS_A), [str(refs)], group_columns=["book"], bootstrap=50)
    html_path = write_report(report, tmp_path / "r")["html"]
    html = html_path.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I), "external reference"
    assert "http://" not in html and "https://" not in html and "<script" not in html.lower()
    assert "@import" not in html and "url(" not in html
    # the three charts (duration, group, histogram) are inline SVG in the file itself
    assert html.count("<svg") == 3 and html.count("</svg>") == 3


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_html_renders_in_headless_chromium(tmp_path: Path, refs: Path) -> None:
    report = evaluate(_run_dir(tmp_path, "a", HYPS_A), [str(refs)], bootstrap=50)
    html_path = write_report(report, tmp_path / "r")["html"]
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         f"--screenshot={shot}", "--window-size=1200,1600", html_path.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 10_000  # a real picture, not a blank error page


def test_references_default_to_the_records_reference_field(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    rows = [{"id": k, "text": HYPS_B[k], "reference": v, "speaker": "s1"} for k, v in REFS.items()]
    (out / "records-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = evaluate(out, [], normalizer="none", group_columns=["speaker"], bootstrap=0)
    ids = list(REFS)
    assert report.wer == pytest.approx(jiwer.wer([REFS[i] for i in ids], [HYPS_B[i] for i in ids]))
    assert [r.key for r in report.groups["speaker"]] == ["s1"]
