"""The desk's three lookup tools, over the rollout's shop (a hidden argument the model never sees).

Each answers in a line or a few, as a support tool would: short enough for a small model to read,
with the ids the next tool takes. A name or an id that is not in the shop gets a sentence saying
so, with the closest ones, instead of an error: looking up the wrong thing is a move the model can
recover from.
"""

from __future__ import annotations

import difflib

from order_desk.shop import Shop


def _close(wanted: str, known: list[str]) -> str:
    close = difflib.get_close_matches(wanted.strip(), known, n=2, cutoff=0.6)
    return f" Did you mean {' or '.join(close)}?" if close else ""


def find_customer(name: str, shop: Shop) -> str:
    """Find a customer by their full name: their customer id and city.

    Args:
        name: The customer's first and last name, e.g. "Ada Moss".
    """
    customer = shop.customer_named(name)
    if customer is None:
        return f"No customer is named {name.strip()!r}." + _close(name, [c.name for c in shop.customers])
    return f"Customer {customer.id}: {customer.name}, city {customer.city}."


def list_orders(customer_id: str, shop: Shop) -> str:
    """List a customer's orders: each order's id, day and status.

    Args:
        customer_id: A customer id from find_customer, e.g. "C417".
    """
    customer = shop.customer(customer_id.strip())
    if customer is None:
        return f"No customer has the id {customer_id.strip()!r}." + _close(
            customer_id, [c.id for c in shop.customers]
        )
    lines = [f"Orders of {customer.id}:"]
    lines += [f"{o.id} | day {o.day} | {o.status}" for o in shop.orders_of(customer.id)]
    return "\n".join(lines)


def get_order(order_id: str, shop: Shop) -> str:
    """Show an order: its lines (product, quantity, unit price) and its total.

    Args:
        order_id: An order id from list_orders, e.g. "W4821".
    """
    order = shop.order(order_id.strip().lstrip("#"))
    if order is None:
        return f"No order has the id {order_id.strip()!r}." + _close(order_id, [o.id for o in shop.orders])
    lines = [f"Order {order.id} of {order.customer_id}, day {order.day}, {order.status}:"]
    lines += [f"{line.product} | {line.quantity} x {line.price:.2f}" for line in order.lines]
    lines.append(f"Total: {order.total:.2f}")
    return "\n".join(lines)


TOOLS = (find_customer, list_orders, get_order)
