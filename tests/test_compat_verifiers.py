"""palaestra.compat.verifiers: verifiers 0.1.x environment packages run on palaestra unchanged.

The packages under tests/verifiers_envs/ are written in verifiers' own style (``import verifiers as
vf``, ``load_environment(**kwargs)``). Each runs through palaestra's engine with scripted policies
and must give the same rewards as a twin written with palaestra's own API (the bundled
reverse_text and double_check environments, or a twin in this file) for the same policy and seed.
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
import types
from pathlib import Path
from typing import Any

import double_check
import pytest
import reverse_text

import palaestra as pa
import palaestra.compat.verifiers as vf
from palaestra.compat.verifiers.loading import (
    eval_defaults,
    find_package,
    install,
    load_verifiers_environment,
)
from palaestra.testing import FakeOpenAIServer

ENVS = Path(__file__).parent / "verifiers_envs"
OURS = ("verifiers", "vf_")  # module-name prefixes a test may add to sys.modules


@pytest.fixture(autouse=True)
def verifiers_alias(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``import verifiers`` gives the compat layer during a test; the modules it added go afterwards."""
    monkeypatch.syspath_prepend(str(ENVS))
    before = {name for name in sys.modules if name.startswith(OURS)}
    assert install(), "a real verifiers library is installed: these tests need it absent"
    yield
    for name in [n for n in sys.modules if n.startswith(OURS) and n not in before]:
        del sys.modules[name]


def spec(**changes: Any) -> pa.RunSpec:
    return pa.RunSpec(**{"rollouts_per_example": 3, "seed": 11, **changes})


def assert_same(
    ours: list[pa.Rollout],
    twin: list[pa.Rollout],
    metrics: dict[str, str],
    *,
    roles: tuple[str, ...] = ("assistant", "user"),
) -> None:
    """Same rewards per rollout, the same values for the metrics ``{ours: twin's}``, the same text in
    messages of ``roles`` (tool error messages are worded differently)."""
    assert len(ours) == len(twin) > 0
    for a, b in zip(ours, twin, strict=True):
        assert (a.example_id, a.rollout_index, a.seed) == (b.example_id, b.rollout_index, b.seed)
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.reward == pytest.approx(b.reward), (a.completion, b.completion)
        for mine, theirs in metrics.items():
            assert a.metrics[mine] == pytest.approx(b.metrics[theirs]), mine
        assert [m["role"] for m in a.completion] == [m["role"] for m in b.completion]
        assert _texts(a.completion, roles) == _texts(b.completion, roles)
        assert len(a.turns) == len(b.turns)
        if roles == ("assistant", "user"):  # the scripted client counts prompt words: tool texts differ
            assert a.usage == b.usage


def _texts(messages: list[dict[str, Any]], roles: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in messages if m["role"] in roles]


# single turn: reverse-text


async def test_reverse_text_matches_the_bundled_palaestra_env() -> None:
    import vf_reverse_text

    env = vf_reverse_text.load_environment(num_examples=6, seed=2)
    twin = reverse_text.load_environment(num_examples=6, seed=2, system_prompt=env.system_prompt)
    assert isinstance(env, pa.Environment) and isinstance(env, vf.SingleTurnEnv)
    assert [e.prompt for e in env.examples] == [e.prompt for e in twin.examples]
    assert env.examples[0].row["task"] == "reverse-text" and env.examples[0].row["example_id"] == 0
    ours = await env.run(pa.ScriptedClient(reverse_text.noisy_reverser), spec())
    theirs = await twin.run(pa.ScriptedClient(reverse_text.noisy_reverser), spec())
    assert_same(ours, theirs, {"lcs_reward_func": "lcs_reward"})
    assert len({r.reward for r in ours}) > 3  # the noisy policy spreads the rewards
    assert {r.stop_reason for r in ours} == {"max_turns_reached"}
    assert all(r.metrics["num_turns"] == 1.0 for r in ours)  # MultiTurnEnv's monitor rubric


# multi-turn with state: double-check, in both dialects


@pytest.mark.parametrize("module", ["vf_double_check", "vf_double_check_legacy"])
async def test_double_check_matches_the_bundled_palaestra_env(module: str) -> None:
    package = __import__(module)
    env = package.load_environment(num_examples=8, seed=4)
    twin = double_check.load_environment(num_examples=8, seed=4)
    ours = await env.run(pa.ScriptedClient(double_check.doubter), spec())
    theirs = await twin.run(pa.ScriptedClient(double_check.doubter), spec())
    assert_same(ours, theirs, {"correct_answer": "correct_answer"})
    assert {r.reward for r in ours} == {0.0, 1.0}
    assert all(len(r.turns) == 2 and r.completion[1]["content"] == "Are you sure?" for r in ours)
    if module == "vf_double_check":
        assert {r.stop_reason for r in ours} == {"double_checked"}
        assert all(
            r.metrics["changed_answer"] == t.metrics["changed_answer"]
            for r, t in zip(ours, theirs, strict=True)
        )
    else:  # the 0.1.7 loop: is_completed(messages, state), a tuple from a sync env_response
        assert {r.stop_reason for r in ours} == {"is_completed"}
        assert all(r.state["turn"] == 2 and r.state["asked"] == 1 for r in ours)
        assert env.client is None and env.model is None  # legacy constructor arguments: attributes


# custom parsers and rubrics: tic-tac-toe against a palaestra twin


def newest_move(messages: pa.Messages) -> str:
    """verifiers' XMLParser.parse_answer: the newest assistant message with a <move> tag."""
    parser = pa.XMLParser(["reasoning", "move"])
    for text in reversed(parser.assistant_texts(messages)):
        move = parser.parse(text).get("move")
        if move is not None:
            return move
    return ""


class TwinTicTacToe(pa.MultiTurnEnv):
    """The tic-tac-toe game of vf_tictactoe, written for palaestra."""

    def __init__(self, max_invalid: int = 3, **kwargs: Any) -> None:
        super().__init__(max_turns=8, **kwargs)
        self.max_invalid = max_invalid

    async def setup_state(self, state: pa.State) -> None:
        info = state.example.info
        state.update(
            board=list(info["initial_board"]), seed=info["example_seed"], winner=None, invalid_moves=0
        )

    async def env_response(self, messages: pa.Messages, state: pa.State) -> pa.Messages | pa.Final:
        from vf_tictactoe import opponent_move, outcome, render

        move, board = newest_move(messages), state["board"]
        if not (move.isdigit() and 1 <= int(move) <= 9 and board[int(move) - 1] == "."):
            state["invalid_moves"] += 1
            if state["invalid_moves"] >= self.max_invalid:
                state["winner"] = "O"
                return pa.Final([{"role": "user", "content": "Too many invalid moves: you lose."}])
            return [{"role": "user", "content": f"Invalid move {move!r}. The board:\n{render(board)}"}]
        board[int(move) - 1] = "X"
        result = outcome(board)
        if result is None:
            board[opponent_move(board, state["seed"])] = "O"
            result = outcome(board)
        if result is not None:
            state["winner"] = result
            return pa.Final([{"role": "user", "content": f"Game over ({result}).\n{render(board)}"}])
        return [{"role": "user", "content": f"The board:\n{render(board)}\nYour move."}]


def vf_format_score(text: str, fields: tuple[str, ...] = ("reasoning", "move")) -> float:
    """verifiers' XMLParser format score of one message, written out: 0.4 x share of fields present
    (a field also counts when only one of its tags is there), 0.2 for spacing (always met), 0.2 for
    starting with the first field's tag, 0.2 for ending with the last field's closing tag."""
    parsed = [re.search(rf"<{f}>\s*(.*?)\s*</{f}>", text, re.DOTALL) for f in fields]
    present = sum(
        1 for f, m in zip(fields, parsed, strict=True) if m or f"<{f}>" in text or f"</{f}>" in text
    )
    score = 0.4 * present / len(fields) if any(parsed) else 0.0
    stripped = text.strip()
    return (
        score
        + 0.2
        + 0.2 * stripped.startswith(f"<{fields[0]}>")
        + 0.2 * stripped.endswith(f"</{fields[-1]}>")
    )


def twin_tictactoe(num_examples: int, seed: int) -> TwinTicTacToe:
    from vf_tictactoe import SYSTEM_PROMPT, make_rows

    def win_reward(state: pa.State) -> float:
        return {"X": 1.0, "draw": 0.5}.get(state["winner"], 0.0)

    def invalid_move_penalty(state: pa.State) -> float:
        return -0.1 * state["invalid_moves"]

    def format_reward(completion: pa.Messages) -> float:
        texts = pa.Parser.assistant_texts(completion)
        return sum(map(vf_format_score, texts)) / len(texts) if texts else 0.0

    rows = [{**row, "info": json.loads(row["info"])} for row in make_rows(num_examples, seed)]
    rubric = pa.Rubric([win_reward, invalid_move_penalty, format_reward], weights=[1.0, 1.0, 0.2])
    return TwinTicTacToe(dataset=rows, system_prompt=SYSTEM_PROMPT, rubric=rubric)


def tictactoe_player(messages: pa.Messages, rng: random.Random) -> str:
    """Plays a random free cell; sometimes forgets the tags, plays a taken cell or skips the reasoning."""
    lines = [line.split() for line in str(messages[-1]["content"]).splitlines()]
    board = [c for line in lines if len(line) == 3 and set(line) <= {"X", "O", "."} for c in line][-9:]
    free = [i + 1 for i, c in enumerate(board) if c == "."] or [5]
    taken = [i + 1 for i, c in enumerate(board) if c != "."] or [5]
    roll = rng.random()
    if roll < 0.12:
        return "I would rather not say."
    cell = rng.choice(taken if roll < 0.25 else free)
    if roll < 0.5:
        return f"<move>{cell}</move>"
    return f"<reasoning>\nCell {cell} looks good.\n</reasoning>\n<move>\n{cell}\n</move>"


async def test_tictactoe_matches_a_palaestra_twin() -> None:
    import vf_tictactoe

    env = vf_tictactoe.load_environment(num_examples=10, seed=1, max_invalid=3)
    assert env.max_invalid == 3  # an unknown constructor argument became an attribute
    ours = await env.run(pa.ScriptedClient(tictactoe_player), spec(rollouts_per_example=4))
    theirs = await twin_tictactoe(10, 1).run(
        pa.ScriptedClient(tictactoe_player), spec(rollouts_per_example=4)
    )
    assert_same(
        ours,
        theirs,
        {
            "win_reward_func": "win_reward",
            "invalid_move_penalty_func": "invalid_move_penalty",
            "format_reward_func": "format_reward",
        },
    )
    for a, b in zip(ours, theirs, strict=True):
        assert {k: a.state[k] for k in ("board", "winner", "invalid_moves")} == {
            k: b.state[k] for k in ("board", "winner", "invalid_moves")
        }
    assert {r.stop_reason for r in ours} == {"has_final_env_response"}  # the game always ends itself
    rewards = {r.reward for r in ours}
    assert min(rewards) < 0 < max(rewards) and len(rewards) > 5
    assert {r.state["winner"] for r in ours} >= {"X", "O"}
    assert any(r.metrics["invalid_move_penalty_func"] < 0 for r in ours)


def either_policy(messages: pa.Messages, rng: random.Random) -> str:
    if "Reverse" in str(messages[0]["content"]):
        return reverse_text.noisy_reverser(messages, rng)
    return double_check.doubter(messages, rng)


async def test_env_group_runs_each_environment_as_it_runs_alone() -> None:
    import vf_double_check
    import vf_reverse_text

    def members() -> list[vf.Environment]:
        return [
            vf_reverse_text.load_environment(num_examples=3),
            vf_double_check.load_environment(num_examples=2),
        ]

    group = vf.EnvGroup(envs=members(), env_names=["reverse", "check"])
    assert isinstance(group, pa.EnvGroup) and len(group.examples) == 5
    rollouts = await group.run(pa.ScriptedClient(either_policy), spec(rollouts_per_example=2))
    alone = {
        name: await env.run(pa.ScriptedClient(either_policy), spec(rollouts_per_example=2))
        for name, env in zip(("reverse", "check"), members(), strict=True)
    }
    every = {"lcs_reward_func", "num_turns", "correct_answer", "changed_answer"}
    for rollout in rollouts:
        source = group.source(group.examples[rollout.example_id])
        [twin] = [
            r
            for r in alone[rollout.env]
            if (r.example_id, r.rollout_index) == (source.id, rollout.rollout_index)
        ]
        assert (rollout.reward, rollout.completion) == (twin.reward, twin.completion)
        assert set(rollout.metrics) == every and rollout.state["task"] == rollout.env


# tools


def tool_user(messages: pa.Messages, rng: random.Random) -> dict[str, Any] | str:
    """Calls the right tool (sometimes with broken arguments, sometimes none), then answers with its result."""
    last = messages[-1]
    if last["role"] == "tool":
        text = str(last["content"])
        return text if text.isdigit() or text in ("Paris", "Tokyo", "Nairobi") else "unknown"
    question = str(last["content"])
    if (match := re.search(r"What is (\d+) \+ (\d+)\?", question)) is not None:
        name, args = "add", {"a": int(match[1]), "b": int(match[2])}
    else:
        name, args = "lookup_capital", {"country": question.rsplit(" ", 1)[-1].rstrip("?")}
    roll = rng.random()
    if roll < 0.15:
        return "No tools needed."
    arguments = "{not json" if roll < 0.3 else json.dumps(args)
    return {
        "content": "",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


async def test_tool_env_matches_a_palaestra_twin_and_builds_openai_schemas() -> None:
    import vf_tools

    env = vf_tools.load_environment()
    twin = pa.ToolEnv(
        dataset=vf_tools.make_rows(),
        system_prompt="Use the tools, then answer with the bare result.",
        tools=[vf_tools.add, vf_tools.lookup_capital],
        rubric=pa.Rubric([vf_tools.exact_answer]),
        max_turns=4,
    )
    add = env.oai_tools[0]["function"]
    assert add["name"] == "add" and add["description"] == "Add two integers."
    assert add["parameters"]["properties"]["a"] == {"description": "The first integer.", "type": "integer"}
    assert add["parameters"]["required"] == ["a", "b"] and add["parameters"]["additionalProperties"] is False
    ours = await env.run(pa.ScriptedClient(tool_user), spec(rollouts_per_example=5))
    theirs = await twin.run(pa.ScriptedClient(tool_user), spec(rollouts_per_example=5))
    assert_same(
        ours,
        theirs,
        {
            "exact_answer": "exact_answer",
            "add_calls": "add_calls",
            "lookup_capital_calls": "lookup_capital_calls",
        },
        roles=("assistant",),
    )
    assert {r.reward for r in ours} == {0.0, 1.0}
    assert all(r.tools == env.oai_tools for r in ours)
    failed = [
        m["content"]
        for r in ours
        for m in r.completion
        if m["role"] == "tool" and "unknown country" in m["content"]
    ]
    assert failed and all(text == "unknown country: Atlantis" for text in failed)  # error_formatter's text
    assert {r.stop_reason for r in ours} == {"no_tools_called"}
    assert all(
        r.metrics["total_tool_calls"] == r.metrics["add_calls"] + r.metrics["lookup_capital_calls"]
        for r in ours
    )


async def test_stop_errors_end_the_rollout_as_a_tool_error() -> None:
    import vf_tools

    env = vf_tools.load_environment(stop_errors=[ValueError])

    def policy(messages: pa.Messages) -> Any:
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "lookup_capital", "arguments": '{"country": "Oz"}'},
        }
        return {"content": "", "tool_calls": [call]}

    [rollout] = await env.run(pa.ScriptedClient(policy), pa.RunSpec(num_examples=1))
    assert rollout.error is not None and (rollout.error.type, rollout.error.stage) == (
        "ToolCallError",
        "tool",
    )
    assert "ValueError: unknown country: Oz" in rollout.error.message
    assert rollout.stop_reason == "error" and rollout.reward is None


async def test_stateful_tool_env_hides_skipped_arguments_and_fills_them() -> None:
    seen: list[str] = []

    def remember(note: str, session: str) -> str:
        """Save a note.

        Args:
            note: What to remember.
            session: The session (filled by the environment).
        """
        seen.append(f"{session}:{note}")
        return "saved"

    class NotesEnv(vf.StatefulToolEnv):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.add_tool(remember, args_to_skip=["session"])

        async def setup_state(self, state: vf.State) -> vf.State:
            state["session"] = f"s{state['example_id']}"
            return state

        def update_tool_args(
            self, tool_name: str, tool_args: dict, messages: Any, state: vf.State, **kw: Any
        ) -> dict:
            return {**tool_args, "session": state["session"]}

    env = NotesEnv(dataset=[{"question": "Remember milk."}, {"question": "Remember eggs."}], max_turns=3)
    schema = env.oai_tools[0]["function"]["parameters"]
    assert list(schema["properties"]) == ["note"] and schema["required"] == ["note"]

    def policy(messages: pa.Messages) -> Any:
        if messages[-1]["role"] == "tool":
            return "Done."
        note = str(messages[-1]["content"]).split()[-1].rstrip(".")
        args = json.dumps({"note": note})
        return {
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "remember", "arguments": args}}
            ],
        }

    rollouts = await env.run(pa.ScriptedClient(policy), pa.RunSpec())
    assert sorted(seen) == ["s0:milk", "s1:eggs"]
    assert [r.metrics["remember_calls"] for r in rollouts] == [1.0, 1.0]


# the judge, through a real openai.AsyncOpenAI at palaestra's fake server


def judge_reply(body: dict[str, Any]) -> Any:
    _question, a, r = (line[3:] for line in body["messages"][-1]["content"].split("\n"))
    if r == "boom":
        return {"fault": "status", "status": 400, "message": "bad request"}
    return "yes" if r == a else "no"


def answerer(messages: pa.Messages, rng: random.Random) -> str:
    right = {
        "What is 2 + 2?": "4",
        "What is the capital of France?": "Paris",
        "Name a primary colour.": "red",
    }
    return right[str(messages[-1]["content"])] if rng.random() < 0.5 else rng.choice(["5", "Lyon", "boom"])


async def test_judge_rubric_over_http_matches_palaestra_judge() -> None:
    import vf_judged

    async with FakeOpenAIServer(judge_reply, model="fake-judge") as server:
        env = vf_judged.load_environment(judge_base_url=server.base_url)
        ours = await env.run(pa.ScriptedClient(answerer), spec(rollouts_per_example=6, max_concurrent=4))
        async with pa.OpenAIClient("fake-judge", base_url=server.base_url, max_retries=0) as client:
            rubric = pa.JudgeRubric(client=client, prompt=vf_judged.JUDGE_PROMPT)
            twin = pa.SingleTurnEnv(dataset=vf_judged.ROWS, rubric=rubric)
            theirs = await twin.run(pa.ScriptedClient(answerer), spec(rollouts_per_example=6))
    booms = [i for i, r in enumerate(ours) if r.completion[-1]["content"] == "boom"]
    assert booms and len(booms) < len(ours)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.completion == b.completion
        if i in booms:  # a failed judgement: verifiers scores it 0.0, palaestra records an error
            assert (a.reward, a.error) == (0.0, None) and b.reward is None and b.error is not None
            assert (
                "judge_reward_func" in a.state["reward_errors"]
                and "BadRequest" in a.state["reward_errors"]["judge_reward_func"]
            )
        else:
            assert a.reward == b.reward == a.metrics["judge_reward_func"] == b.metrics["judge"]
            [(filled, verdict)] = a.state["judge_response"].items()
            assert verdict in ("yes", "no") and filled.endswith(f"R: {a.completion[-1]['content']}")
    assert {r.reward for r in ours} == {0.0, 1.0}


# the rollout loop's semantics


class Counter(vf.MultiTurnEnv):
    """Counts env_response calls; ends early at a "stop" reply through @vf.stop."""

    async def setup_state(self, state: vf.State) -> vf.State:
        state["env_calls"] = 0
        return state

    @vf.stop(priority=5)
    async def said_stop(self, state: vf.State) -> bool:
        trajectory = state["trajectory"]
        return bool(trajectory) and trajectory[-1]["completion"][-1]["content"] == "stop"

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        state["env_calls"] += 1
        assert messages[-1]["role"] == "assistant" and len(messages) == 2 + 2 * (state["env_calls"] - 1)
        return [{"role": "user", "content": f"again {state['env_calls']}"}]


@pytest.mark.parametrize(
    ("max_turns", "stop_at", "turns", "env_calls", "stop"),
    [
        (3, None, 3, 2, "max_turns_reached"),  # the reply reaching max_turns is never answered
        (-1, 4, 4, 3, "said_stop"),  # -1: no limit
        (3, 1, 1, 0, "said_stop"),
    ],
)
async def test_max_turns_counts_replies_and_the_last_one_gets_no_env_response(
    max_turns: int, stop_at: int | None, turns: int, env_calls: int, stop: str
) -> None:
    env = Counter(dataset=[{"question": "go"}], max_turns=max_turns)

    def policy(messages: pa.Messages) -> str:
        return "stop" if sum(m["role"] == "assistant" for m in messages) + 1 == stop_at else "more"

    [rollout] = await env.run(pa.ScriptedClient(policy), pa.RunSpec())
    assert (len(rollout.turns), rollout.state["env_calls"], rollout.stop_reason) == (turns, env_calls, stop)
    assert rollout.completion[-1]["role"] == "assistant" and rollout.metrics["num_turns"] == turns
    assert [t.prompt_messages for t in rollout.turns] == [1 + 2 * i for i in range(turns)]


async def test_a_vf_error_in_setup_state_ends_the_rollout_unscored() -> None:
    class Broken(vf.SingleTurnEnv):
        async def setup_state(self, state: vf.State) -> vf.State:
            raise vf.InfraError("no sandbox")

    [rollout] = await Broken(dataset=[{"question": "q"}]).run(pa.ScriptedClient(lambda: "a"), pa.RunSpec())
    assert rollout.error == pa.ErrorInfo("InfraError", "no sandbox", "env")
    assert rollout.turns == [] and rollout.reward is None and rollout.state["stop_condition"] == "has_error"


async def test_cleanup_runs_on_stop_and_teardown_on_aclose() -> None:
    events: list[str] = []

    class Hooks(vf.SingleTurnEnv):
        @vf.cleanup
        async def release(self, state: vf.State) -> None:
            events.append(f"cleanup {state['stop_condition']}")

        @vf.teardown
        async def close_pool(self) -> None:
            events.append("teardown")

    def unreachable() -> str:
        raise pa.ModelHTTPError(503, "overloaded")

    async with Hooks(dataset=[{"question": "q"}]) as env:
        await env.run(pa.ScriptedClient(lambda: "a"), pa.RunSpec())
        [failed] = await env.run(pa.ScriptedClient(unreachable), pa.RunSpec(max_failures_in_a_row=0))
    # palaestra releases a rollout's resources however it ends: a model error too
    assert events == ["cleanup max_turns_reached", "cleanup None", "teardown"]
    assert failed.error is not None and (failed.error.stage, failed.stop_reason) == ("model", "error")
    assert failed.reward is None and failed.completion == []


async def test_model_turns_keep_token_ids_logprobs_and_sampling() -> None:
    seen: list[pa.Sampling] = []

    def policy(messages: pa.Messages, sampling: pa.Sampling) -> pa.ModelResponse:
        seen.append(sampling)
        return pa.ModelResponse(
            {"role": "assistant", "content": "hi"}, "stop", pa.Usage(3, 1), [7], [-0.5], [1, 2, 3]
        )

    env = vf.SingleTurnEnv(
        dataset=[{"question": "q"}],
        sampling_args={"temperature": 0.3, "max_tokens": 9, "extra_body": {"top_k": 4}},
    )
    [rollout] = await env.run(pa.ScriptedClient(policy), pa.RunSpec(sampling=pa.Sampling(temperature=0.9)))
    [turn] = rollout.turns
    assert (turn.token_ids, turn.logprobs, turn.prompt_token_ids, turn.usage) == (
        [7],
        [-0.5],
        [1, 2, 3],
        pa.Usage(3, 1),
    )
    assert (seen[0].temperature, seen[0].max_tokens, seen[0].extra) == (
        0.9,
        9,
        {"top_k": 4},
    )  # the run's over the env's
    assert seen[0].seed == pa.derive_seed(rollout.seed, 0)
    step = rollout.state  # the trajectory itself is not saved; its tokens were the response's
    assert "trajectory" not in step and step["turn"] == 1


async def test_reward_functions_get_arguments_by_name_and_failures_score_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: dict[str, Any] = {}

    def by_name(completion, answer, info, task, parser) -> float:
        calls["by_name"] = (answer, info, task, type(parser).__name__)
        return 0.5

    async def everything(**kwargs: Any) -> float:
        calls["everything"] = sorted(kwargs)
        return 1.0

    def broken(state) -> float:
        raise KeyError("missing")

    def lengths(completions, states) -> list[float]:
        return [float(len(c)) + len(s["trajectory"]) for c, s in zip(completions, states, strict=True)]

    first = vf.Rubric(
        funcs=[by_name, everything, broken], weights=[2.0, -1.0, 5.0], parser=vf.XMLParser(["a"])
    )
    rubric = vf.RubricGroup([first, vf.Rubric(funcs=[lengths, by_name], weights=[0.0, 1.0])])
    rows = [{"question": "q", "answer": "x", "info": '{"k": 1}'}]
    env = vf.SingleTurnEnv(dataset=rows, rubric=rubric, parser=vf.XMLParser(["a"]))
    with caplog.at_level(logging.ERROR):
        rollouts = await env.run(pa.ScriptedClient(lambda: "a"), pa.RunSpec(rollouts_per_example=2))
    assert calls["by_name"] == ("x", {"k": 1}, "default", "Parser")  # the second rubric's own parser
    assert calls["everything"] == [
        "answer",
        "completion",
        "example_id",
        "info",
        "parser",
        "prompt",
        "state",
        "task",
    ]
    for rollout in rollouts:
        assert rollout.reward == 2 * 0.5 - 1.0 + 5 * 0.0 + 0.5  # RubricGroup sums; broken scores 0.0
        assert rollout.metrics == {
            "by_name": 1.0,
            "everything": 1.0,
            "broken": 0.0,
            "lengths": 2.0,
            "num_turns": 1.0,
        }
        assert rollout.state["reward_errors"] == {"broken": "KeyError: 'missing'"} and rollout.error is None
    assert "Error calling reward function broken" in caplog.text


async def test_a_rubric_subclass_overriding_score_group_still_scores_palaestra_rollouts() -> None:
    class Ranked(vf.Rubric):
        async def score_group(self, states: list[vf.State], score_sem: Any = None) -> None:
            await super().score_group(states, score_sem)
            for rank, state in enumerate(sorted(states, key=lambda s: s["reward"])):
                state["metrics"]["rank"] = float(rank)

    def length(completion) -> float:
        return float(len(completion[-1]["content"]))

    env = vf.SingleTurnEnv(dataset=[{"question": "q"}], rubric=Ranked(funcs=[length]))
    env.rubric = env.rubric.rubrics[0]  # as a package may replace it after construction
    replies = iter(["a", "aaa", "aa"])
    rollouts = await env.run(
        pa.ScriptedClient(lambda: next(replies)), pa.RunSpec(rollouts_per_example=3, max_concurrent=1)
    )
    assert [(r.reward, r.metrics["rank"]) for r in rollouts] == [(1.0, 0.0), (3.0, 2.0), (2.0, 1.0)]
    assert [r.state["advantage"] for r in rollouts] == [-1.0, 1.0, 0.0]


# parsers, state and helpers


def test_xml_parser_is_verifiers_own() -> None:
    parser = vf.XMLParser(["think", ("code", "answer")], answer_field="code")
    parsed = parser.parse("<think>\n hmm \n</think><answer> 42 </answer><answer>43</answer>")
    assert (parsed.think, parsed.code, parsed.answer) == ("hmm", None, "42")
    assert parser.parse("<code>1</code><code>2</code>", last=True).code == "2"
    assert parser.get_fields() == ["think", "code"]
    assert parser.get_format_str() == "<think>\n...\n</think>\n<[ code | answer ]>\n...\n</[ code | answer ]>"
    assert parser.format(think="t", answer="a") == "<think>\nt\n</think>\n<code>\na\n</code>"
    with pytest.raises(ValueError, match="Missing value for field 'code'"):
        parser.format(think="t")
    messages = [
        {"role": "assistant", "content": "<code>old</code>"},
        {"role": "user", "content": "<code>u</code>"},
        {"role": "assistant", "content": "no tag"},
    ]
    assert parser.parse_answer(messages) == "old"  # newest to oldest
    reward = parser.get_format_reward_func()
    assert reward([{"role": "assistant", "content": "<think>a</think>\n<code>b</code>"}]) == pytest.approx(
        1.0
    )
    assert reward([{"role": "assistant", "content": "x <code>b</code>"}]) == pytest.approx(0.2 + 0.2 + 0.2)
    assert reward([{"role": "assistant", "content": "plain"}]) == pytest.approx(0.2) and reward([]) == 0.0


def test_other_parsers_and_helpers() -> None:
    assert vf.Parser().parse_answer([{"role": "assistant", "content": " x "}]) == " x "
    boxed = vf.Parser(extract_fn=vf.extract_boxed_answer)
    assert boxed.parse_answer("so \\boxed{\\frac{1}{2}} ok") == "\\frac{1}{2}"
    assert vf.extract_hash_answer("steps #### 72 ") == "72" and vf.extract_boxed_answer("none") == "none"
    think = vf.ThinkParser(extract_fn=str.upper)
    assert think.parse("<think>r</think> yes") == "YES" and think.parse("no close") == ""
    fmt = think.get_format_reward_func()
    assert (
        fmt([{"role": "assistant", "content": "<think>r</think>a"}, {"role": "assistant", "content": "a"}])
        == 0.5
    )
    assert (
        vf.MaybeThinkParser().parse("<think>r</think> a ") == "a" and vf.MaybeThinkParser().parse("b") == "b"
    )
    with pytest.raises(RuntimeError, match="downloads a dataset"):
        vf.load_example_dataset("gsm8k")
    with pytest.raises(AttributeError, match="TextArenaEnv needs the textarena integration"):
        vf.TextArenaEnv  # noqa: B018 - the attribute access is what is tested
    with pytest.raises(ImportError, match="math-verify"):
        vf.MathRubric()


def test_state_forwards_input_fields() -> None:
    state = vf.State(input={"prompt": [], "answer": "a", "task": "t"})
    state["answer"] = "b"
    state["other"] = 1
    assert state["input"]["answer"] == "b" and "answer" not in dict(state) and "answer" in state
    assert state.get("info", {}) == {} and state["other"] == 1


def test_dataset_formatting_follows_verifiers() -> None:
    rows = [
        {"prompt": [{"role": "user", "content": "hi"}], "example_id": "a1", "info": '{"x": 1}'},
        {
            "prompt": [{"role": "system", "content": "own"}, {"role": "user", "content": "yo"}],
            "example_id": "b2",
        },
    ]
    env = vf.SingleTurnEnv(
        eval_dataset=rows, dataset=[{"question": "train"}], system_prompt="sys", few_shot=[]
    )
    first, second = env.examples  # the eval dataset's
    assert first.prompt == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert second.prompt[0] == {"role": "system", "content": "own"} and len(second.prompt) == 2
    assert (first.row["src_id"], first.row["example_id"], first.row["task"], first.info) == (
        "a1",
        0,
        "default",
        {"x": 1},
    )
    assert env.get_dataset()[0]["prompt"][-1] == {"role": "user", "content": "train"}
    with pytest.raises(ValueError, match="Either dataset or eval_dataset"):
        vf.SingleTurnEnv()
    with pytest.raises(ValueError, match="completion mode"):
        vf.SingleTurnEnv(dataset=rows, message_type="completion")


# loading and the `verifiers` alias

ECHO = """
import verifiers as vf
from verifiers.rubrics.rubric import Rubric


def load_environment(num_examples: int = 2, system_prompt: str | None = None) -> vf.Environment:
    rows = [{"question": f"say {i}", "answer": f"say {i}"} for i in range(num_examples)]

    def echoed(completion, answer) -> float:
        return float(completion[-1]["content"] == answer)

    return vf.SingleTurnEnv(dataset=rows, rubric=Rubric(funcs=[echoed]), system_prompt=system_prompt)
"""


def write_package(root: Path) -> Path:
    folder = root / "vf-echo-test"
    folder.mkdir()
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "vf-echo-test"\nversion = "0.1.0"\ndependencies = ["verifiers>=0.1.9"]\n\n'
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[tool.hatch.build]\ninclude = ["vf_echo_test.py", "pyproject.toml"]\n\n'
        "[tool.verifiers.eval]\nnum_examples = 2\nrollouts_per_example = 4\n"
    )
    (folder / "vf_echo_test.py").write_text(ECHO)
    return folder


async def test_load_verifiers_environment_finds_a_package_by_verifiers_naming_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(write_package(tmp_path)))
    import verifiers

    assert (
        verifiers is vf
        and sys.modules["verifiers.rubrics.rubric"]
        is sys.modules["palaestra.compat.verifiers.rubrics.rubric"]
    )
    assert eval_defaults("vf-echo-test") == {"num_examples": 2, "rollouts_per_example": 4}
    assert eval_defaults("no-such-env") == {} and eval_defaults("json") == {}
    assert find_package("vf-echo-test") is sys.modules["vf_echo_test"]
    assert find_package("no-such-env") is None and find_package("json") is None
    (tmp_path / "vf_not_an_env.py").write_text(
        "raise RuntimeError('imported')\ndef load_environment(): ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_package("vf-not-an-env") is None  # it never imports verifiers: not even imported
    env = load_verifiers_environment("someone/vf-echo-test", num_examples=3)
    assert isinstance(env, vf.Environment) and (env.env_id, env.env_args) == (
        "someone/vf-echo-test",
        {"num_examples": 3},
    )
    rollouts = await env.run(pa.ScriptedClient(lambda messages: messages[-1]["content"]), pa.RunSpec())
    assert [r.reward for r in rollouts] == [1.0, 1.0, 1.0]
    assert vf.load_environment("vf-echo-test").env_id == "vf-echo-test"
    with pytest.raises(pa.EnvironmentArgsError, match="does not take 'bogus'"):
        load_verifiers_environment("vf-echo-test", bogus=1)
    with pytest.raises(pa.EnvironmentNotFound, match="no_such_env"):
        load_verifiers_environment("no-such-env")


def test_install_never_shadows_a_real_verifiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "verifiers" or n.startswith("verifiers.")]:
        monkeypatch.delitem(sys.modules, name)
    real = tmp_path / "site" / "verifiers"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text(
        "class SingleTurnEnv:\n    def __init__(self, **kwargs):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(real.parent))
    assert install() is False and "verifiers" not in sys.modules  # installed: left alone
    fake = types.ModuleType("verifiers")
    fake.SingleTurnEnv = lambda **kwargs: object()  # type: ignore[attr-defined]
    fake.Environment = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "verifiers", fake)
    assert install() is False and sys.modules["verifiers"] is fake  # already imported: left alone
    (tmp_path / "vf_plain_test.py").write_text(
        "import verifiers as vf\n\ndef load_environment():\n    return vf.SingleTurnEnv()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="real verifiers library is installed"):
        load_verifiers_environment("vf-plain-test")


async def test_eval_saves_small_json_rows(tmp_path: Path) -> None:
    import vf_tictactoe

    env = vf_tictactoe.load_environment(num_examples=3, seed=5)
    client = pa.ScriptedClient(tictactoe_player)
    run = await pa.evaluate(env, client, spec(), output_dir=tmp_path, env_id="vf-tictactoe")
    lines = (run.path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 9
    for line in lines:
        row = json.loads(line)
        assert set(row["state"]).isdisjoint(
            {"trajectory", "responses", "input", "client", "prompt", "completion"}
        )
        assert {"board", "winner", "invalid_moves", "stop_condition", "task"} <= set(row["state"])
        assert len(line) < 2 * len(json.dumps(row["prompt"] + row["completion"])) + 1500
    saved = pa.load_run(run.path).rollouts
    assert [r.reward for r in saved] == [r.reward for r in run.rollouts] and run.summary["n_rollouts"] == 9


def test_palaestra_eval_runs_a_verifiers_package_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The registry falls back to verifiers packages: ``palaestra eval NAME``, with their eval defaults."""
    from palaestra.cli import main

    monkeypatch.syspath_prepend(str(write_package(tmp_path)))
    (tmp_path / "echo_policy.py").write_text("def echo(messages):\n    return messages[-1]['content']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(
        ["eval", "vf-echo-test", "-m", "scripted:echo_policy:echo", "-o", str(tmp_path / "out"), "--quiet"]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    (run_dir,) = (tmp_path / "out" / "evals").glob("*/*")
    run = pa.load_run(run_dir)
    assert (run.metadata.spec.num_examples, run.metadata.spec.rollouts_per_example) == (
        2,
        4,
    )  # [tool.verifiers.eval]
    assert [r.reward for r in run.rollouts] == [1.0] * 8
    code = main(
        ["eval", "vf-echo-test", "-a", '{"bogus": 1}', "-m", "scripted:echo_policy:echo", "-o", str(tmp_path)]
    )
    assert code == 2 and "does not take 'bogus'" in capsys.readouterr().err
