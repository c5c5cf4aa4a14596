"""Order desk: generated shops and questions, the three tools, the reward, the scripted clerks."""

from __future__ import annotations

import statistics

import order_desk as od
import pytest
from order_desk import policies

import palaestra as pa


def test_dataset_is_generated_from_the_seed_and_balanced_by_kind() -> None:
    rows = od.make_dataset(40, seed=0)
    assert rows == od.make_dataset(40, seed=0) and rows[:8] == od.make_dataset(8, seed=0)
    assert rows != od.make_dataset(40, seed=1)
    assert [r["info"]["kind"] for r in rows[:8]] == list(od.KINDS) * 2
    for row in rows:  # the answer is read off that example's own shop
        shop = od.shop_of(row["info"]["shop_seed"])
        order = shop.order(row["info"]["order_id"])
        assert order is not None and order.customer_id == row["info"]["customer_id"]
        customer = shop.customer(order.customer_id)
        assert (
            customer is not None
            and customer.name in row["question"]
            and f"day {order.day}" in row["question"]
        )
        # one order a day per customer: the question names exactly one order
        assert [o.day for o in shop.orders_of(customer.id)].count(order.day) == 1


def test_the_tools_chain_from_a_name_to_an_order() -> None:
    shop = od.shop_of(od.make_dataset(1, seed=3)[0]["info"]["shop_seed"])
    customer = shop.customers[0]
    found = od.find_customer(f"  {customer.name.lower()} ", shop)
    assert found == f"Customer {customer.id}: {customer.name}, city {customer.city}."
    listed = od.list_orders(customer.id, shop).splitlines()
    orders = shop.orders_of(customer.id)
    assert listed == [f"Orders of {customer.id}:"] + [f"{o.id} | day {o.day} | {o.status}" for o in orders]
    shown = od.get_order(orders[0].id, shop)
    assert shown.endswith(f"Total: {orders[0].total:.2f}") and f"day {orders[0].day}" in shown
    assert od.get_order(f"#{orders[0].id}", shop) == shown


def test_unknown_names_and_ids_are_answered_with_the_closest_ones() -> None:
    shop = od.shop_of(od.make_dataset(1, seed=3)[0]["info"]["shop_seed"])
    customer = shop.customers[0]
    typo = customer.name[:-1]
    assert od.find_customer(typo, shop).startswith(
        f"No customer is named {typo!r}. Did you mean {customer.name}"
    )
    assert od.list_orders("C1", shop).startswith("No customer has the id 'C1'.")
    assert od.get_order("W0", shop).startswith("No order has the id 'W0'.")


def test_answers_are_compared_once_normalized() -> None:
    parser = pa.XMLParser(["answer"])

    def score(reply: str, answer: str) -> float:
        return od.correct(parser, [{"role": "assistant", "content": reply}], answer)

    assert score("<answer> 33 </answer>", "33.00") == 1.0
    assert score("<answer>$33.0</answer>", "33.00") == 1.0
    assert score("<answer>#W4821.</answer>", "W4821") == 1.0
    assert score("<answer>Shipped</answer>", "shipped") == 1.0
    assert score("<answer>33.01</answer>", "33.00") == 0.0
    assert score("shipped", "shipped") == 0.0  # no tags, no answer
    assert score("<answer></answer>", "") == 0.0


async def test_the_clerk_slips_on_the_order_list_and_the_careful_one_does_not() -> None:
    env = od.load_environment(num_examples=200, seed=2)
    clerk = await env.run(pa.ScriptedClient(policies.clerk), pa.RunSpec(seed=0))
    careful = await env.run(pa.ScriptedClient(policies.careful_clerk), pa.RunSpec(seed=0))
    assert all(r.error is None and r.stop_reason == "no_tool_calls" for r in clerk + careful)
    assert [r.reward for r in careful] == [1.0] * 200
    assert 0.7 < statistics.mean(r.reward or 0 for r in clerk) < 0.9
    city = [r.reward for r in clerk if r.info["kind"] == "city"]
    assert city == [1.0] * len(city)  # a city needs no order list: nothing to slip on
    calls = {
        k: statistics.mean(r.metrics["tool_calls"] for r in careful if r.info["kind"] == k) for k in od.KINDS
    }
    assert calls == {"city": 1, "status": 2, "order_id": 2, "total": 3}
    again = await env.run(pa.ScriptedClient(policies.clerk), pa.RunSpec(seed=0))
    assert [r.reward for r in again] == [r.reward for r in clerk]  # the same seeds, the same slips


async def test_closed_book_has_no_tools_and_guessing_scores_little() -> None:
    env = od.load_environment(num_examples=200, closed_book=True)
    assert env.tools is None and env.examples[0].prompt[0]["content"] == od.CLOSED_BOOK_PROMPT

    def guess(messages: pa.Messages) -> str:  # the likeliest answer of each kind, without looking
        question = str(messages[-1]["content"])
        return "<answer>Lisbon</answer>" if "city" in question else "<answer>shipped</answer>"

    rollouts = await env.run(pa.ScriptedClient(guess), pa.RunSpec())
    assert statistics.mean(r.reward or 0 for r in rollouts) <= 0.2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"num_examples": 0}, "num_examples must be an integer ≥ 1"),
        ({"closed_book": "yes"}, "closed_book must be true or false"),
        ({"kinds": ["total", "price"]}, "kinds must be a list of distinct names"),
        ({"kinds": []}, "kinds must be a list of distinct names"),
    ],
)
def test_bad_arguments_are_refused_with_their_name(args: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        od.load_environment(**args)
