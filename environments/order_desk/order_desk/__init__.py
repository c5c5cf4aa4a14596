"""Order desk: answer a customer's question about their order with a shop's three lookup tools.

``load_environment`` builds the environment (``env.py``); the shops and questions are generated
from a seed (``shop.py``); the tools read the rollout's shop (``tools.py``); ``policies`` holds
the scripted clerks (``palaestra eval order_desk -m scripted:order_desk.policies:clerk``).
"""

from order_desk.env import (
    CLOSED_BOOK_PROMPT,
    SYSTEM_PROMPT,
    OrderDeskEnv,
    correct,
    load_environment,
    normalize,
)
from order_desk.shop import KINDS, Shop, make_dataset, make_shop, shop_of
from order_desk.tools import TOOLS, find_customer, get_order, list_orders

__all__ = [
    "CLOSED_BOOK_PROMPT",
    "KINDS",
    "SYSTEM_PROMPT",
    "TOOLS",
    "OrderDeskEnv",
    "Shop",
    "correct",
    "find_customer",
    "get_order",
    "list_orders",
    "load_environment",
    "make_dataset",
    "make_shop",
    "normalize",
    "shop_of",
]
