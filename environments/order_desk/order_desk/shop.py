"""A shop's records and the questions asked about them, generated from a seed.

Every example has a shop of its own: 12-20 customers (an id, a name, a city), each with 1-4
orders on different days (an id, a day, a status, 1-3 lines of a product, a quantity and a unit
price). Row ``i`` of a dataset depends only on (``seed``, ``i``), so a smaller dataset is a prefix
of a larger one and two seeds share no shop.

A question is about one customer's order of one day, asked four ways, each needing a longer
chain of lookups: the customer's city (one tool), the order's id or status (two), its total
(three). The answer exists only in the shop's records, so a model that cannot look it up can only
guess: a city is one of 8, a status one of 5, an id or a total is practically never guessed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import palaestra as pa

FIRST = (
    "Ada Ben Cleo Dev Eli Fay Gus Hana Ivo Jun Kai Lena Milo Nia Omar Pia Quin Rosa Sven Tara Uma Vik "
    "Wren Yara"
).split()
LAST = "Ames Brook Cole Dunn Eck Ford Gale Hart Ives Jade Knox Lund Moss Nash Orr Park Reed Shaw Tate Vance".split()
CITIES = "Lisbon Oslo Porto Quito Riga Tunis Vigo Turin".split()
STATUSES = ("pending", "shipped", "delivered", "cancelled", "returned")
PRODUCTS = (
    "hammer wrench saw drill pliers chisel rake hose spade shears trowel kettle whisk ladle skillet "
    "grater stapler binder marker folder lamp candle mirror blanket pillow teapot mug basket"
).split()
KINDS = ("city", "status", "order_id", "total")


@dataclass(frozen=True)
class Line:
    product: str
    quantity: int
    price: float  # per unit


@dataclass(frozen=True)
class Order:
    id: str
    customer_id: str
    day: int
    status: str
    lines: tuple[Line, ...]

    @property
    def total(self) -> float:
        return round(sum(line.quantity * line.price for line in self.lines), 2)


@dataclass(frozen=True)
class Customer:
    id: str
    name: str
    city: str


@dataclass(frozen=True)
class Shop:
    customers: tuple[Customer, ...]
    orders: tuple[Order, ...]

    def customer_named(self, name: str) -> Customer | None:
        wanted = " ".join(name.split()).casefold()
        return next((c for c in self.customers if c.name.casefold() == wanted), None)

    def customer(self, customer_id: str) -> Customer | None:
        return next((c for c in self.customers if c.id == customer_id), None)

    def orders_of(self, customer_id: str) -> list[Order]:
        return sorted((o for o in self.orders if o.customer_id == customer_id), key=lambda o: o.day)

    def order(self, order_id: str) -> Order | None:
        return next((o for o in self.orders if o.id == order_id), None)


def make_shop(rng: random.Random) -> Shop:
    """A shop drawn from ``rng`` (see the module docstring)."""
    names = rng.sample([f"{f} {s}" for f in FIRST for s in LAST], rng.randint(12, 20))
    customer_ids = rng.sample(range(100, 1000), len(names))
    customers = tuple(
        Customer(f"C{n}", name, rng.choice(CITIES)) for n, name in zip(customer_ids, names, strict=True)
    )
    prices = {p: rng.randint(150, 9000) / 100 for p in PRODUCTS}
    order_numbers = iter(rng.sample(range(1000, 10000), 4 * len(customers)))
    orders = []
    for customer in customers:
        for day in sorted(rng.sample(range(1, 29), rng.randint(1, 4))):
            products = rng.sample(PRODUCTS, rng.randint(1, 3))
            lines = tuple(Line(p, rng.randint(1, 4), prices[p]) for p in products)
            orders.append(Order(f"W{next(order_numbers)}", customer.id, day, rng.choice(STATUSES), lines))
    return Shop(customers, tuple(orders))


def shop_of(shop_seed: int) -> Shop:
    """The shop of an example (``info["shop_seed"]``)."""
    return make_shop(random.Random(shop_seed))


def answer_of(shop: Shop, kind: str, order: Order) -> str:
    """The gold answer of a question of ``kind`` about ``order``."""
    if kind == "city":
        customer = shop.customer(order.customer_id)
        assert customer is not None
        return customer.city
    if kind == "status":
        return order.status
    if kind == "order_id":
        return order.id
    return f"{order.total:.2f}"


def question_text(kind: str, name: str, day: int) -> str:
    """The customer's question: ``kind`` of their order of ``day``."""
    if kind == "city":
        return f"I am {name} and I placed an order on day {day}. Which city is it shipped to?"
    what = {"status": "the status", "order_id": "the id", "total": "the total"}[kind]
    return f"I am {name}. What is {what} of the order I placed on day {day}?"


def make_dataset(num_examples: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[dict[str, object]]:
    """Rows of ``question``, ``answer`` and ``info`` (``shop_seed``, ``kind``, ``customer_id``,
    ``order_id``); the kinds cycle in ``kinds``' order, so every run of them is balanced."""
    rows: list[dict[str, object]] = []
    for i in range(num_examples):
        shop_seed = pa.derive_seed("order_desk", seed, i)
        rng = random.Random(shop_seed)
        shop = make_shop(rng)
        kind = kinds[i % len(kinds)]
        order = rng.choice(shop.orders)
        customer = shop.customer(order.customer_id)
        assert customer is not None
        rows.append(
            {
                "question": question_text(kind, customer.name, order.day),
                "answer": answer_of(shop, kind, order),
                "info": {
                    "shop_seed": shop_seed,
                    "kind": kind,
                    "customer_id": customer.id,
                    "order_id": order.id,
                },
            }
        )
    return rows
