"""Eval summary statistics and their Rich rendering."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from palaestra.eval.summary import pick_sample, summarize, t_quantile_975
from palaestra.eval.summary_view import render_rollout, render_summary
from palaestra.types import ErrorInfo, Rollout, Timing, Usage


def make(
    example_id: int = 0,
    rollout_index: int = 0,
    reward: float | None = 1.0,
    **fields,
) -> Rollout:
    return Rollout(
        example_id=example_id,
        rollout_index=rollout_index,
        seed=0,
        prompt=[{"role": "user", "content": "hi"}],
        reward=reward,
        **fields,
    )


def group(rewards: list[float | None], example_id: int = 0) -> list[Rollout]:
    return [make(example_id, i, r) for i, r in enumerate(rewards)]


def plain_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=80, no_color=True, force_terminal=False), buf


# ---------------------------------------------------------------- statistics


def test_reward_mean_std_and_ci_match_hand_computed_values() -> None:
    s = summarize(group([0.2, 0.4, 0.6]), rollouts_per_example=3)
    reward = s["reward"]
    assert reward["mean"] == pytest.approx(0.4)
    assert reward["std"] == pytest.approx(0.2)  # sample std: divides by n - 1
    half = 4.302653 * 0.2 / math.sqrt(3)  # t(0.975, 2): 0.497, wider than the rewards seen
    assert reward["ci95"] == [0.2, 0.6]  # so clipped to them
    assert (reward["min"], reward["max"], reward["n"]) == (0.2, 0.6, 3)
    assert (s["n_rollouts"], s["n_examples"], s["rollouts_per_example"]) == (3, 1, 3)
    many = summarize(group([0.0, 1.0] * 20), rollouts_per_example=40)["reward"]
    half = 2.022691 * many["std"] / math.sqrt(40)  # t(0.975, 39); narrow enough to stay unclipped
    assert many["ci95"] == pytest.approx([0.5 - half, 0.5 + half], abs=1e-6)


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (29, 2.045), (30, 2.042), (60, 2.000), (1000, 1.962)],
)
def test_t_quantile_matches_published_values(df: int, expected: float) -> None:
    assert t_quantile_975(df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_is_continuous_where_table_hands_over_and_tends_to_normal() -> None:
    assert t_quantile_975(30) - t_quantile_975(31) == pytest.approx(0.002759, abs=1e-5)
    assert t_quantile_975(10**7) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_single_reward_has_zero_std_and_no_ci() -> None:
    reward = summarize(group([0.7]), rollouts_per_example=1)["reward"]
    assert (reward["mean"], reward["std"], reward["ci95"], reward["n"]) == (0.7, 0.0, None, 1)


def test_none_rewards_are_left_out_of_reward_stats_but_fail_pass_at_k() -> None:
    s = summarize(group([1.0, None, None, None]), rollouts_per_example=4)
    assert s["reward"]["mean"] == 1.0
    assert s["reward"]["n"] == 1
    assert s["n_rollouts"] == 4
    assert s["pass_at_k"]["1"] == pytest.approx(0.25)


def test_histogram_of_unit_rewards_uses_tenth_bins_with_one_in_last_bin() -> None:
    s = summarize(group([0.0, 0.0, 0.1, 0.3, 0.95, 1.0]), rollouts_per_example=6)
    hist = s["histogram"]
    assert hist["edges"] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert hist["counts"] == [2, 1, 0, 1, 0, 0, 0, 0, 0, 2]


def test_histogram_widens_range_for_negative_and_large_rewards() -> None:
    hist = summarize(group([-0.1, 0.5, 1.0]), rollouts_per_example=3)["histogram"]
    assert hist["edges"][0] == -0.1
    assert hist["edges"][-1] == 1.0
    assert hist["edges"][1] == pytest.approx(0.01)
    assert hist["counts"] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 1]

    hist = summarize(group([0.0, 2.0]), rollouts_per_example=2)["histogram"]
    assert (hist["edges"][0], hist["edges"][5], hist["edges"][-1]) == (0.0, 1.0, 2.0)
    assert hist["counts"] == [1, 0, 0, 0, 0, 0, 0, 0, 0, 1]


def test_pass_at_k_uses_the_unbiased_estimator() -> None:
    s = summarize(group([1.0, 0.0, 0.0, 0.0]), rollouts_per_example=4)
    assert s["pass_at_k"] == pytest.approx({"1": 0.25, "2": 0.5, "4": 1.0})
    s = summarize(group([1.0, 0.5, 0.2, 0.0]), rollouts_per_example=4)  # c = 2 at threshold 0.5
    assert s["pass_at_k"] == pytest.approx({"1": 0.5, "2": 5 / 6, "4": 1.0})
    s = summarize(group([1.0, 0.5, 0.2, 0.0]), rollouts_per_example=4, pass_threshold=0.9)
    assert s["pass_at_k"]["1"] == pytest.approx(0.25)
    assert s["pass_threshold"] == 0.9


def test_pass_at_k_averages_examples_and_skips_short_ones() -> None:
    rollouts = group([1.0] + [0.0] * 7, example_id=0) + group([0.0, 0.0], example_id=1)
    s = summarize(rollouts, rollouts_per_example=8)
    # example 0 (n=8, c=1): 1/8, 1 - C(7,2)/C(8,2) = 1/4, 1 - C(7,4)/C(8,4) = 1/2, 1
    # example 1 (n=2, c=0): 0, 0, then too few rollouts for k = 4 and 8
    assert s["pass_at_k"] == pytest.approx({"1": 0.0625, "2": 0.125, "4": 0.5, "8": 1.0})


@pytest.mark.parametrize(
    ("r", "ks"), [(1, ["1"]), (3, ["1", "2"]), (6, ["1", "2", "4"]), (8, ["1", "2", "4", "8"])]
)
def test_pass_at_k_only_goes_to_powers_of_two_up_to_rollouts_per_example(r: int, ks: list[str]) -> None:
    assert list(summarize(group([1.0] * r), rollouts_per_example=r)["pass_at_k"]) == ks


def test_metrics_cover_every_name_even_when_some_rollouts_lack_it() -> None:
    rollouts = [
        make(0, 0, metrics={"b": 1.0, "a": 1.0}),
        make(0, 1, metrics={"b": 0.0}),
        make(0, 2, metrics={"b": 0.5}),
    ]
    metrics = summarize(rollouts, rollouts_per_example=3)["metrics"]
    assert list(metrics) == ["a", "b"]
    assert metrics["a"] == {"mean": 1.0, "std": 0.0, "n": 1, "min": 1.0, "max": 1.0}
    assert metrics["b"]["mean"] == pytest.approx(0.5)
    assert metrics["b"]["std"] == pytest.approx(0.5)
    assert metrics["b"]["n"] == 3


def test_stop_reasons_are_counted_most_common_first() -> None:
    reasons = ["max_turns", None, "stop", "max_turns", "max_turns", None]
    rollouts = [make(0, i, stop_reason=reason) for i, reason in enumerate(reasons)]
    stops = summarize(rollouts, rollouts_per_example=6)["stop_reasons"]
    assert list(stops.items()) == [("max_turns", 3), ("none", 2), ("stop", 1)]


def test_errors_are_grouped_by_stage_and_type_with_one_example() -> None:
    timeout = ErrorInfo("TimeoutError", "too slow", "timeout")
    rollouts = [
        make(3, 1, None, error=timeout),
        make(1, 2, None, error=ErrorInfo("TimeoutError", "first " + "x" * 900, "timeout")),
        make(2, 0, None, error=timeout),
        make(0, 0, None, error=ErrorInfo("APIError", "500", "model")),
        make(0, 1, 1.0),
    ]
    errors = summarize(rollouts, rollouts_per_example=2)["errors"]
    assert [(e["stage"], e["type"], e["count"]) for e in errors] == [
        ("timeout", "TimeoutError", 3),
        ("model", "APIError", 1),
    ]
    example = errors[0]["example"]
    assert (example["example_id"], example["rollout_index"]) == (1, 2)  # lowest ids, not the first seen
    assert example["message"].startswith("first x")
    assert len(example["message"]) == 500
    assert errors[1]["example"] == {"example_id": 0, "rollout_index": 0, "message": "500"}


def test_timing_and_tokens() -> None:
    rollouts = [
        make(0, 0, timing=Timing(model=1.0, env=0.5, scoring=0.1, total=2.0), usage=Usage(100, 10)),
        make(0, 1, timing=Timing(model=3.0, env=0.0, scoring=0.3, total=4.0), usage=Usage(200, 30)),
    ]
    s = summarize(rollouts, rollouts_per_example=2)
    assert s["timing"]["model"] == {"min": 1.0, "mean": 2.0, "max": 3.0}
    assert s["timing"]["scoring"]["mean"] == pytest.approx(0.2)
    assert s["timing"]["total"] == {"min": 2.0, "mean": 3.0, "max": 4.0}
    assert s["tokens"] == {"prompt": 300, "completion": 40, "total": 340}


def test_empty_input_gives_nones_not_a_crash() -> None:
    s = summarize([], rollouts_per_example=4)
    assert (s["n_rollouts"], s["n_examples"]) == (0, 0)
    assert s["reward"] == {"mean": None, "std": None, "ci95": None, "min": None, "max": None, "n": 0}
    assert s["pass_at_k"] == {}
    assert s["metrics"] == {} and s["errors"] == [] and s["stop_reasons"] == {}
    assert s["timing"]["model"] == {"min": None, "mean": None, "max": None}
    assert s["histogram"]["counts"] == [0] * 10
    assert len(s["histogram"]["edges"]) == 11
    json.dumps(s, allow_nan=False)
    console, buf = plain_console()
    render_summary(console, s, title="empty")
    assert "0 rollouts" in buf.getvalue()


def test_summary_is_strict_json_even_with_non_finite_values() -> None:
    rollouts = [
        make(0, 0, math.inf, metrics={"m": math.nan}),
        make(0, 1, 0.5, metrics={"m": 1.0}),
        make(0, 2, math.nan, timing=Timing(model=math.nan)),
    ]
    s = summarize(rollouts, rollouts_per_example=3)
    assert json.loads(json.dumps(s, allow_nan=False)) == s
    assert s["reward"]["n"] == 3
    assert s["reward"]["mean"] is None
    assert s["reward"]["max"] is None
    assert s["metrics"]["m"]["mean"] is None
    assert s["histogram"]["counts"][5] == 1  # only the finite reward is binned
    assert s["pass_at_k"]["1"] == pytest.approx(2 / 3)  # inf passes, nan fails


def test_pick_sample_takes_the_median_error_free_rollout() -> None:
    rollouts = [
        make(0, 0, 0.0),
        make(0, 1, 1.0),
        make(2, 0, 0.5),
        make(1, 1, 0.5),
        make(1, 0, 0.9, error=ErrorInfo("E", "m", "env")),
    ]
    picked = pick_sample(rollouts)
    assert picked is not None
    assert (picked.example_id, picked.rollout_index) == (1, 1)  # median 0.5, lowest ids among ties
    errored = [
        make(4, 0, None, error=ErrorInfo("E", "m", "env")),
        make(3, 0, None, error=ErrorInfo("E", "m", "env")),
    ]
    assert pick_sample(errored) is errored[0]
    assert pick_sample([]) is None


# ---------------------------------------------------------------- rendering


def test_render_summary_shows_the_key_numbers_in_plain_text_within_80_columns() -> None:
    rollouts = [
        make(0, 0, 0.0, metrics={"correct": 0.0}, stop_reason="max_turns", usage=Usage(1000, 200)),
        make(0, 1, 1.0, metrics={"correct": 1.0}, stop_reason="win", usage=Usage(1000, 234)),
        make(1, 0, 1.0, metrics={"correct": 1.0}, stop_reason="win", timing=Timing(model=2.5, total=3.0)),
        make(1, 1, None, error=ErrorInfo("RewardError", "bad [bold]parse[/] here", "scoring")),
    ]
    s = summarize(rollouts, rollouts_per_example=2)
    console, buf = plain_console()
    render_summary(console, s, title="tictactoe")
    out = buf.getvalue()
    assert "\x1b[" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    for expected in (
        "tictactoe",
        "0.667",  # reward mean
        "0.577",  # reward std
        "[0.000, 1.000]",  # 95% CI: [-0.768, 2.101] clipped to the rewards seen
        "correct",
        "pass@1 0.500",
        "pass@2 1.000",
        "win 2",
        "max_turns 1",
        "RewardError",
        "bad [bold]parse[/] here",
        "2.500",  # max model time
        "prompt 2,000",
        "completion 434",
    ):
        assert expected in out, expected
    first_bin = next(line for line in out.splitlines() if "0.000,  0.100)" in line)
    last_bin = next(line for line in out.splitlines() if "0.900,  1.000]" in line)
    assert "█" in first_bin and first_bin.rstrip().endswith(" 1")
    assert "█" in last_bin and last_bin.rstrip().endswith(" 2")


def test_render_rollout_prints_markup_literally() -> None:
    rollout = make(
        completion=[{"role": "assistant", "content": "[bold]x[/bold] [/oops]"}],
        metrics={"[red]m": 1.0},
        stop_reason="[/stop]",
        error=ErrorInfo("[b]Err", "msg [/i]", "env"),
    )
    console, buf = plain_console()
    render_rollout(console, rollout)
    out = buf.getvalue()
    assert "[bold]x[/bold] [/oops]" in out
    assert "[red]m=1.000" in out
    assert "[/stop]" in out
    assert "[b]Err: msg [/i]" in out


def test_render_rollout_shows_header_roles_tool_calls_and_tool_results() -> None:
    call = {"id": "call_7", "type": "function", "function": {"name": "move", "arguments": '{"cell": 4}'}}
    rollout = make(
        3,
        2,
        0.25,
        completion=[
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_7", "content": "placed X"},
            {"role": "assistant", "content": "done"},
        ],
        metrics={"win": 0.0},
        stop_reason="game_over",
    )
    rollout.prompt = [{"role": "system", "content": "play"}, *rollout.prompt]
    console, buf = plain_console()
    render_rollout(console, rollout)
    out = buf.getvalue()
    assert "example 3 · rollout 2" in out
    assert "reward 0.250" in out and "game_over" in out and "win=0.000" in out
    assert 'move({"cell": 4})' in out
    assert "tool · call_7" in out and "placed X" in out
    titles = [out.find(f"─ {title} ") for title in ("system", "user", "assistant", "tool · call_7")]
    assert -1 not in titles and titles == sorted(titles)


def test_render_rollout_truncates_long_content() -> None:
    rollout = make(completion=[{"role": "assistant", "content": "0123456789" * 15 + "TAIL"}])
    console, buf = plain_console()
    render_rollout(console, rollout, max_chars=100)
    out = buf.getvalue()
    assert "… (54 more chars)" in out
    assert "TAIL" not in out
    assert out.count("9") == 10  # exactly the first 100 characters are kept


@pytest.mark.parametrize("value", [-0.1, 0.0, 0.5, 1.0])
def test_a_run_whose_rewards_are_all_equal_still_shows_its_histogram_and_a_point_interval(
    value: float,
) -> None:
    s = summarize(group([value] * 10), rollouts_per_example=10)
    assert sum(s["histogram"]["counts"]) == 10 and s["reward"]["ci95"] == [value, value]
    console, buf = plain_console()
    render_summary(console, s)
    bars = [line for line in buf.getvalue().splitlines() if "█" in line]
    assert len(bars) == 1 and bars[0].rstrip().endswith(" 10")


def test_long_metric_names_are_wrapped_not_cut() -> None:
    name = "a_reward_function_with_a_very_long_name_indeed_x"
    s = summarize([make(0, 0, 1.0, metrics={name: 1.0})], rollouts_per_example=1)
    console, buf = plain_console()
    render_summary(console, s)
    out = buf.getvalue()
    column = "".join(
        line[1:36].strip() for line in out.splitlines() if line[1:36].strip().startswith(("a_", "g_"))
    )
    assert name in column and "…" not in out  # every character shown, over two lines
