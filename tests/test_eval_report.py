"""The HTML report: one self-contained page, every rollout browsable, model text never executed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from browser import chrome

from palaestra.eval.report import ASSETS, main_report, write_report
from palaestra.eval.summary import summarize
from palaestra.types import ErrorInfo, Rollout, Timing, Turn, Usage

PAYLOAD = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
SYSTEM = {"role": "system", "content": "You are terse."}


def make_rollouts(shift: float = 0.0) -> list[Rollout]:
    """15 rollouts: rewards over [0, 1], two failures, a tool call, an injection attempt, unicode."""
    out = []
    rewards = [0.0, 0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0]
    for i, reward in enumerate(rewards):
        out.append(
            Rollout(
                example_id=i // 2,
                rollout_index=i % 2,
                seed=i,
                prompt=[SYSTEM, {"role": "user", "content": f"question {i}"}],
                completion=[{"role": "assistant", "content": f"answer {i}"}],
                answer=str(i),
                reward=min(1.0, reward + shift),
                metrics={"correct": float(reward >= 0.5), "format": 1.0 - shift},
                stop_reason="answered" if i % 3 else "max_turns",
                turns=[Turn(index=0, prompt_messages=2, token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3])],
                timing=Timing(model=0.5, env=0.01, scoring=0.02, total=0.53),
                usage=Usage(prompt_tokens=20, completion_tokens=5),
            )
        )
    tool_chat = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("call_1", "add", '{"a": 2, "b": 3}'), _call("call_2", "lookup", '{"k": 1')],
        },  # two calls in one turn, as ToolEnv runs them; the second's arguments are broken
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Error: the arguments are not valid JSON"},
        {"role": "assistant", "content": "The sum is 5."},
    ]
    out.append(_rollout(5, 0, tool_chat, 1.0, "solved", prompt="add 2 and 3"))
    out.append(_rollout(5, 1, [{"role": "assistant", "content": "naïve café — 日本語 🎯"}], 0.3, "answered"))
    out.append(_rollout(6, 0, [{"role": "assistant", "content": PAYLOAD}], 0.2, "answered", prompt=PAYLOAD))
    model_err = ErrorInfo("APIError", "upstream said <b>bad gateway</b>", "model")
    out.append(_rollout(6, 1, [], None, "error", error=model_err))
    scoring_err = ErrorInfo("KeyError", "'missing'", "scoring")
    out.append(_rollout(7, 0, [{"role": "assistant", "content": "x"}], None, "error", error=scoring_err))
    out.append(_rollout(7, 1, [{"role": "assistant", "content": "y"}], 0.8, None))
    return out


def _call(id_: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def _rollout(
    eid: int,
    idx: int,
    completion: list[dict[str, Any]],
    reward: float | None,
    stop: str | None,
    *,
    prompt: str = "hi",
    error: ErrorInfo | None = None,
) -> Rollout:
    metrics = {} if reward is None else {"correct": float(reward >= 0.5), "format": 1.0}
    return Rollout(
        eid,
        idx,
        0,
        [{"role": "user", "content": prompt}],
        completion,
        reward=reward,
        metrics=metrics,
        stop_reason=stop,
        error=error,
    )


def write_run(
    path: Path,
    rollouts: list[Rollout],
    *,
    env_id: str = "toy",
    model: str = "model-a",
    summary: bool = True,
    rubric: dict[str, Any] | None = None,
) -> Path:
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rollouts))
    metadata: dict[str, Any] = {
        "run_id": f"run-{model}",
        "env_id": env_id,
        "env_args": {"difficulty": "<hard>"},
        "model": model,
        "base_url": None,
        "sampling": {"temperature": 0.7, "max_tokens": 256},
        "num_examples": 8,
        "rollouts_per_example": 2,
        "max_concurrent": 4,
        "seed": 0,
        "pass_threshold": 0.5,
        "versions": {"palaestra": "0.1.0", "env_package": "0.1", "python": "3.11"},
        "started_at": "2025-01-01T10:00:00+00:00",
        "finished_at": "2025-01-01T10:01:30+00:00",
        "status": "complete",
        "counts": {"expected": 16, "saved": len(rollouts), "errors": 2},
        "rubric": rubric or {},
    }
    if summary:
        metadata["summary"] = summarize(rollouts, rollouts_per_example=2, pass_threshold=0.5)
    else:
        metadata.update(status="interrupted", finished_at=None)
    (path / "metadata.json").write_text(json.dumps(metadata))
    return path


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def parse(html: str) -> list[tuple[str, dict[str, str | None]]]:
    collector = _Collector()
    collector.feed(html)
    return collector.tags


def embedded(html: str) -> list[list[dict[str, Any]]]:
    match = re.search(r'<script type="application/json" id="palaestra-data">(.*?)</script>', html, re.S)
    assert match
    return json.loads(match.group(1))["runs"]


@pytest.fixture
def run_a(tmp_path: Path) -> Path:
    return write_run(tmp_path / "a", make_rollouts())


def test_single_run_page_is_self_contained_and_written_next_to_the_run(run_a: Path) -> None:
    out = write_report([run_a])
    assert out == run_a / "report.html"
    html = out.read_text()
    tags = parse(html)
    assert not [t for t, _ in tags if t in ("link", "img", "iframe", "object", "embed")]
    scripts = [a for t, a in tags if t == "script"]
    assert len(scripts) == 2 and all("src" not in a for a in scripts)  # the data and the inline JS
    refs = [a.get(k) for _, a in tags for k in ("src", "href") if a.get(k)]
    assert all(ref.startswith("#") for ref in refs), refs
    assert "http://" not in html and "https://" not in html
    assert "<style>" in html and "function setup" in html


def test_header_and_summary_show_the_run(run_a: Path) -> None:
    html = write_report([run_a]).read_text()
    for text in ("toy", "model-a", "run-model-a", "complete", "temperature=0.7", "3.11", "90.0 s"):
        assert text in html
    assert "difficulty=&lt;hard&gt;" in html  # env args are escaped too
    summary = summarize(make_rollouts(), rollouts_per_example=2, pass_threshold=0.5)
    assert f"<b>{summary['reward']['mean']:.3f}</b> ± {summary['reward']['std']:.3f}" in html
    assert f"[{summary['reward']['ci95'][0]:.3f}, {summary['reward']['ci95'][1]:.3f}]" in html
    assert f"pass@2</th><td>{summary['pass_at_k']['2']:.3f}" in html
    histogram = re.search(r'<svg[^>]*aria-label="reward histogram".*?</svg>', html, re.S)
    assert histogram and histogram.group(0).count('class="bar"') == 10
    bars = re.search(r'<svg[^>]*aria-label="reward function means".*?</svg>', html, re.S)
    assert bars and ">correct<" in bars.group(0) and ">format<" in bars.group(0)
    for stop in ("answered", "max_turns", "solved", "error", "none"):
        assert f"<code>{stop}</code>" in html
    assert "APIError" in html and "KeyError" in html


def test_every_rollout_is_embedded_without_token_ids(run_a: Path) -> None:
    html = write_report([run_a]).read_text()
    [data] = embedded(html)
    ids = {(r["example_id"], r["rollout_index"]) for r in data}
    assert ids == {(r.example_id, r.rollout_index) for r in make_rollouts()}
    assert "15 of 15 rollouts shown" in html
    assert all(isinstance(r["turns"], int) for r in data)
    tool = next(r for r in data if r["stop_reason"] == "solved")
    assert tool["completion"][0]["tool_calls"][0]["function"]["name"] == "add"
    assert any(m["content"] == "naïve café — 日本語 🎯" for r in data for m in r["completion"])


def test_model_and_error_text_is_escaped(run_a: Path) -> None:
    html = write_report([run_a]).read_text()
    assert "window.__pwned" in html  # the payload is there, as data
    assert "<script>window.__pwned" not in html and "<img" not in html
    assert html.count("</script>") == 2
    assert "upstream said &lt;b&gt;bad gateway&lt;/b&gt;" in html  # the summary's error example
    [data] = embedded(html)
    assert any(m["content"] == PAYLOAD for r in data for m in r["completion"])


def test_two_runs_of_one_env_show_signed_deltas(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", make_rollouts())
    b = write_run(tmp_path / "b", make_rollouts(shift=0.1), model="model-b")
    html = write_report([a, b], tmp_path / "cmp.html").read_text()
    sa, sb = (json.loads((d / "metadata.json").read_text())["summary"] for d in (a, b))
    rows = dict(re.findall(r'<tr class="cmp-row" data-name="([^"]+)"[^>]*>(.*?)</tr>', html))
    deltas = {name: float(re.findall(r'data-delta="([-\d.]+)"', row)[0]) for name, row in rows.items()}
    assert deltas["reward mean"] == pytest.approx(sb["reward"]["mean"] - sa["reward"]["mean"], abs=1e-6)
    assert deltas["pass@1"] == pytest.approx(sb["pass_at_k"]["1"] - sa["pass_at_k"]["1"], abs=1e-6)
    fmt = sb["metrics"]["format"]["mean"] - sa["metrics"]["format"]["mean"]
    assert fmt < 0 and deltas["format"] == pytest.approx(fmt, abs=1e-6)
    assert f'class="delta neg" data-delta="{fmt:.6f}">-{abs(fmt):.3f}<' in rows["format"]
    assert re.search(r'class="delta pos" data-delta="0\.\d+">\+0\.\d{3}<', html)
    assert "Deltas are against run 1" in html
    assert [len(r) for r in embedded(html)] == [15, 15]  # both runs browsable
    assert 'id="run-0"' in html and 'id="run-1"' in html


RUBRIC = {
    "correct": {"weight": 1.0, "higher_is_better": True},
    "format": {"weight": 0.5, "higher_is_better": True},
    "turns_used": {"weight": 0.0, "higher_is_better": False},
}


def game_rollouts(turns: list[float]) -> list[Rollout]:
    """One rollout per example with a 0-1 reward and a turns_used metric on another scale."""
    return [
        Rollout(
            i,
            0,
            0,
            [{"role": "user", "content": f"game {i}"}],
            [{"role": "assistant", "content": f"{t:g}"}],
            reward=1.0 if t < 6 else 0.0,
            metrics={"correct": 1.0 if t < 6 else 0.0, "turns_used": t},
            stop_reason="won",
        )
        for i, t in enumerate(turns)
    ]


def test_weights_are_shown_beside_each_function(tmp_path: Path) -> None:
    html = write_report([write_run(tmp_path / "a", make_rollouts(), rubric=RUBRIC)]).read_text()
    summary = html.split('<table class="summary">', 1)[1].split("</table>", 1)[0]
    assert '<code>correct</code> <small class="weight">×1</small>' in summary
    assert '<code>format</code> <small class="weight">×0.5</small>' in summary
    bars = html.split('aria-label="reward function means"', 1)[1].split("</svg>", 1)[0]
    assert ">×0.5<" in bars and ">×1<" in bars


def test_a_lower_is_better_metric_is_green_when_it_goes_down(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", game_rollouts([8, 7, 8, 5]), rubric=RUBRIC)
    b = write_run(tmp_path / "b", game_rollouts([4, 5, 3, 5]), model="model-b", rubric=RUBRIC)
    html = write_report([a, b], tmp_path / "cmp.html").read_text()
    rows = dict(re.findall(r'<tr class="cmp-row" data-name="([^"]+)" data-better="(\w+)"', html))
    assert rows["turns_used"] == "lower" and rows["correct"] == "higher" and rows["reward mean"] == "higher"
    turns = html.split('data-name="turns_used"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'class="delta pos" data-delta="-2\.750000">-2\.750<', turns)  # fewer turns: better
    assert "↓ lower is better" in turns
    correct = html.split('data-name="correct" data-better', 1)[1].split("</tr>", 1)[0]
    assert 'class="delta pos"' in correct  # more correct: better too


def test_metrics_of_different_scales_get_their_own_axes(tmp_path: Path) -> None:
    html = write_report([write_run(tmp_path / "a", game_rollouts([2, 8, 5]), rubric=RUBRIC)]).read_text()
    axes = dict(re.findall(r'<g class="metric" data-name="([^"]+)" data-axis="([^"]+)"', html))
    assert axes == {"correct": "0..1", "turns_used": "0..8"}
    assert "8 (own scale)" in html


def test_runs_of_different_envs_are_compared_without_deltas(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", make_rollouts())
    b = write_run(tmp_path / "b", make_rollouts(), env_id="other", model="model-b")
    html = write_report([a, b], tmp_path / "cmp.html").read_text()
    assert "deltas are not computed" in html
    assert "data-delta" not in html
    assert "model-a" in html and "model-b" in html


def test_truncated_last_line_is_skipped_and_reported(run_a: Path) -> None:
    with (run_a / "results.jsonl").open("a") as f:
        f.write('{"example_id": 9, "rollout_in')
    html = write_report([run_a]).read_text()
    assert "Skipped 1 unreadable line(s) of results.jsonl (line 16)" in html
    assert len(embedded(html)[0]) == 15


def test_interrupted_run_without_summary_is_summarized(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a", make_rollouts()[:5], summary=False)
    html = write_report([run]).read_text()
    assert "interrupted" in html
    assert "5 (3 examples)" in html
    assert f"<b>{(0.0 + 0.1 + 0.25 + 0.4 + 0.5) / 5:.3f}</b>" in html


def test_empty_run_renders(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a", [])
    html = write_report([run]).read_text()
    assert "0 of 0 rollouts shown" in html and "No scored rollouts." in html
    assert embedded(html) == [[]]


def test_assets_ship_in_the_wheel(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)]
    subprocess.run(cmd, cwd=repo, check=True, capture_output=True)
    (wheel,) = tmp_path.glob("palaestra-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert {f"palaestra/eval/report_assets/{p.name}" for p in ASSETS.iterdir()} <= shipped


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "no such directory"),
        (lambda p: p.mkdir(), "not a run directory (no results.jsonl)"),
        (
            lambda p: (p.mkdir(), (p / "results.jsonl").write_text("")),
            "not a run directory (no metadata.json)",
        ),
        (lambda p: _files(p, "{not json"), "malformed JSON"),
        (lambda p: _files(p, "[1, 2]"), "malformed (not a JSON object)"),
        (lambda p: _files(p, '{"summary": 3}'), "malformed ('summary' is not an object)"),
    ],
)
def test_bad_run_directories_raise_one_line_errors(tmp_path: Path, setup: Any, message: str) -> None:
    path = tmp_path / "run"
    setup(path)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        main_report([str(path)], None)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def _files(path: Path, metadata: str) -> None:
    path.mkdir()
    (path / "results.jsonl").write_text("")
    (path / "metadata.json").write_text(metadata)


def test_bad_output_paths_and_no_runs_raise(run_a: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one run directory"):
        main_report([], None)
    with pytest.raises(ValueError, match="output directory does not exist"):
        main_report([str(run_a)], str(tmp_path / "missing" / "r.html"))
    with pytest.raises(ValueError, match="is a directory"):
        main_report([str(run_a)], str(tmp_path))
    assert main_report([str(run_a)], str(tmp_path / "r.html")) == tmp_path / "r.html"


# ---------------------------------------------------------------- in a real browser


def test_page_filters_and_expands_rollouts_in_chromium(run_a: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    rollouts = make_rollouts()
    page = write_report([run_a])
    driver = chrome(tmp_path)
    try:
        driver.set_page_load_timeout(15)
        driver.get(page.as_uri())
        browser = driver.find_element(By.CSS_SELECTOR, "#run-0 .browser")

        def shown() -> tuple[str, int]:
            rows = driver.execute_script(
                "return arguments[0].querySelectorAll('.row:not([hidden])').length", browser
            )
            return browser.find_element(By.CLASS_NAME, "count").text, rows

        assert shown() == ("15 of 15 rollouts shown", 15)
        assert browser.find_elements(By.CLASS_NAME, "badge-err")[0].text == "error · model"

        browser.find_element(By.CLASS_NAME, "f-min").send_keys("0.5")
        high = sum(r.reward is not None and r.reward >= 0.5 for r in rollouts)
        assert shown() == (f"{high} of 15 rollouts shown", high)
        browser.find_element(By.CLASS_NAME, "f-min").clear()
        Select(browser.find_element(By.CLASS_NAME, "f-errors")).select_by_value("errors")
        assert shown() == ("2 of 15 rollouts shown", 2)
        Select(browser.find_element(By.CLASS_NAME, "f-errors")).select_by_value("ok")
        assert shown() == ("13 of 15 rollouts shown", 13)
        Select(browser.find_element(By.CLASS_NAME, "f-errors")).select_by_value("all")
        Select(browser.find_element(By.CLASS_NAME, "f-stop")).select_by_value("max_turns")
        assert shown()[1] == sum(r.stop_reason == "max_turns" for r in rollouts)
        Select(browser.find_element(By.CLASS_NAME, "f-stop")).select_by_value("")

        search = browser.find_element(By.CLASS_NAME, "f-search")
        search.send_keys("add(")
        assert shown() == ("1 of 15 rollouts shown", 1)
        row = browser.find_element(By.CSS_SELECTOR, ".row:not([hidden])")
        row.find_element(By.CLASS_NAME, "row-head").click()
        bubbles = [
            (b.get_attribute("class"), b.get_attribute("textContent"))
            for b in row.find_elements(By.CLASS_NAME, "msg")
        ]
        assert [c for c, _ in bubbles] == [
            "msg user",
            "msg assistant",
            "msg tool",
            "msg tool",
            "msg assistant",
        ]
        calls = [c.text for c in row.find_elements(By.CLASS_NAME, "toolcall")]
        assert calls == ['add({"a": 2, "b": 3})', 'lookup({"k": 1)']
        assert bubbles[2][1] == "tool result · add (call_1)5"
        assert bubbles[3][1] == "tool result · lookup (call_2)Error: the arguments are not valid JSON"
        assert "The sum is 5." in bubbles[4][1]

        search.clear()
        search.send_keys("onerror")
        row = browser.find_element(By.CSS_SELECTOR, ".row:not([hidden])")
        row.find_element(By.CLASS_NAME, "row-head").click()
        texts = [t.text for t in row.find_elements(By.CSS_SELECTOR, ".msg .text")]
        assert texts == [PAYLOAD, PAYLOAD]  # shown as text in the prompt and the reply
        time.sleep(0.2)  # an onerror handler would have fired by now
        assert driver.execute_script("return window.__pwned === undefined")

        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    finally:
        driver.quit()


def test_rollouts_preview_their_task_and_two_runs_compare_per_example_in_chromium(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    a = write_run(tmp_path / "a", make_rollouts(), rubric=RUBRIC)
    b = write_run(tmp_path / "b", make_rollouts(shift=0.1), model="model-b", rubric=RUBRIC)
    page = write_report([a, b], tmp_path / "cmp.html")
    means = []
    for rollouts in (make_rollouts(), make_rollouts(shift=0.1)):
        by_example: dict[int, list[float]] = {}
        for r in rollouts:
            if r.reward is not None:
                by_example.setdefault(r.example_id, []).append(r.reward)
        means.append({k: sum(v) / len(v) for k, v in by_example.items()})
    differ = sum(abs(means[1][k] - means[0][k]) >= 5e-4 for k in means[0])
    driver = chrome(tmp_path)
    try:
        driver.get(page.as_uri())
        first = driver.find_element(By.CSS_SELECTOR, "#run-0 .browser .row .snippet")
        assert first.text == "question 0"  # the task, not the reply or the environment's last message

        pairs = driver.find_element(By.CSS_SELECTOR, "#comparison .pairs")
        count = pairs.find_element(By.CLASS_NAME, "p-count")
        assert count.text == "8 of 8 examples in both runs shown"
        row = pairs.find_element(By.CSS_SELECTOR, ".row.pair")
        assert row.find_element(By.CLASS_NAME, "snippet").text == "question 0"
        row.find_element(By.CLASS_NAME, "row-head").click()
        sides = row.find_elements(By.CLASS_NAME, "pair-side")
        assert [s.find_element(By.CLASS_NAME, "pair-label").text for s in sides] == ["run 1", "run 2"]
        for side in sides:  # the same example in both runs: its task and each run's own reply
            texts = [t.text for t in side.find_elements(By.CSS_SELECTOR, ".msg .text")]
            assert texts == ["You are terse.", "question 0", "answer 0"]
        facts = [s.find_element(By.CLASS_NAME, "facts").text for s in sides]
        assert "reward: 0.000" in facts[0] and "reward: 0.100" in facts[1]
        pick = sides[1].find_element(By.CLASS_NAME, "p-rollout")
        pick.find_elements(By.TAG_NAME, "option")[1].click()  # the example's other rollout
        assert "answer 1" in sides[1].text

        pairs.find_element(By.CLASS_NAME, "p-differ").click()
        assert count.text == f"{differ} of 8 examples in both runs shown" and differ < 8
        shot = tmp_path / "compare.png"
        driver.execute_script("arguments[0].scrollIntoView()", pairs)
        assert driver.save_screenshot(str(shot))
    finally:
        driver.quit()


def test_a_run_of_all_examples_says_how_many_it_has(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a", make_rollouts())
    meta = json.loads((run / "metadata.json").read_text())
    (run / "metadata.json").write_text(json.dumps({**meta, "num_examples": -1}))  # as the RL samples save it
    html = write_report([run]).read_text()
    assert "<dt>Examples</dt><dd>all (8) × 2 rollouts</dd>" in html and "-1 ×" not in html
