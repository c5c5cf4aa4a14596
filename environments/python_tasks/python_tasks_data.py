"""The tasks of python_tasks: a function to write, a reference solution, and hidden test inputs.

The expected outputs are the reference solution's, computed on the host when the dataset is
built; they never enter the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Task:
    name: str  # the function to write
    signature: str
    description: str
    reference: str  # a solution (the solver policy's, and where the expected outputs come from)
    tests: tuple[tuple[Any, ...], ...]  # argument tuples of the hidden tests
    example: tuple[Any, ...]  # the arguments the solver tries in the REPL first

    def expected(self) -> list[Any]:
        """The reference's output for every test, as JSON holds it (tuples become lists)."""
        import json

        namespace: dict[str, Any] = {}
        exec(self.reference, namespace)  # the project's own reference solution, not model code
        return [json.loads(json.dumps(namespace[self.name](*args))) for args in self.tests]


TASKS = (
    Task(
        "fizzbuzz",
        "fizzbuzz(n: int) -> list[str]",
        "the numbers 1..n as strings, with multiples of 3 replaced by 'Fizz', of 5 by 'Buzz' and of both by 'FizzBuzz'",
        "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n        s = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')\n        out.append(s or str(i))\n    return out\n",
        ((1,), (5,), (15,), (0,), (31,)),
        (15,),
    ),
    Task(
        "is_palindrome",
        "is_palindrome(s: str) -> bool",
        "whether s reads the same backwards, ignoring case and every character that is not a letter or digit",
        "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
        (("A man, a plan, a canal: Panama",), ("hello",), ("",), ("No 'x' in Nixon",), ("ab",)),
        ("racecar",),
    ),
    Task(
        "gcd",
        "gcd(a: int, b: int) -> int",
        "the greatest common divisor of two non-negative integers (gcd(0, 0) is 0)",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
        ((12, 18), (17, 5), (0, 9), (0, 0), (1071, 462)),
        (12, 18),
    ),
    Task(
        "flatten",
        "flatten(items: list) -> list",
        "the elements of a list nested to any depth, in order, as one flat list",
        "def flatten(items):\n    out = []\n    for x in items:\n        out.extend(flatten(x) if isinstance(x, list) else [x])\n    return out\n",
        (([1, [2, [3, [4]]], 5],), ([],), ([[[]]],), ([["a"], "b", [["c"]]],)),
        ([1, [2, [3]]],),
    ),
    Task(
        "count_vowels",
        "count_vowels(s: str) -> int",
        "how many of the characters of s are vowels (a, e, i, o, u, in either case)",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
        (("hello world",), ("",), ("AEIOU aeiou",), ("rhythm",)),
        ("banana",),
    ),
    Task(
        "second_largest",
        "second_largest(nums: list[int]) -> int | None",
        "the second largest distinct value of nums, or None when there are fewer than two distinct values",
        "def second_largest(nums):\n    values = sorted(set(nums))\n    return values[-2] if len(values) >= 2 else None\n",
        (([3, 1, 4, 1, 5],), ([7, 7, 7],), ([],), ([-2, -1],), ([10, 9, 10, 8],)),
        ([1, 2, 3],),
    ),
    Task(
        "run_length",
        "run_length(s: str) -> list[list]",
        "the run-length encoding of s: a list of [character, count] pairs, one per run of equal characters",
        "def run_length(s):\n    out = []\n    for c in s:\n        if out and out[-1][0] == c:\n            out[-1][1] += 1\n        else:\n            out.append([c, 1])\n    return out\n",
        (("aaabcc",), ("",), ("abc",), ("zzzzzz",)),
        ("aab",),
    ),
    Task(
        "is_prime",
        "is_prime(n: int) -> bool",
        "whether the integer n is a prime number",
        "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True\n",
        ((2,), (1,), (0,), (97,), (91,), (7919,), (-5,)),
        (7,),
    ),
    Task(
        "fibonacci",
        "fibonacci(n: int) -> int",
        "the n-th Fibonacci number, with fibonacci(0) = 0 and fibonacci(1) = 1",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        ((0,), (1,), (2,), (10,), (50,)),
        (10,),
    ),
    Task(
        "reverse_words",
        "reverse_words(s: str) -> str",
        "the words of s (separated by whitespace) in reverse order, joined by single spaces",
        "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
        (("the quick brown fox",), ("  hello   world ",), ("",), ("one",)),
        ("a b c",),
    ),
    Task(
        "digit_sum",
        "digit_sum(n: int) -> int",
        "the sum of the decimal digits of the integer n (of its absolute value)",
        "def digit_sum(n):\n    return sum(int(d) for d in str(abs(n)))\n",
        ((0,), (123,), (-456,), (99999,)),
        (123,),
    ),
    Task(
        "two_sum",
        "two_sum(nums: list[int], target: int) -> list[int] | None",
        "the indices [i, j] with i < j of the first pair (by j, then i) whose values add up to target, or None",
        "def two_sum(nums, target):\n    seen = {}\n    for j, x in enumerate(nums):\n        if target - x in seen:\n            return [seen[target - x], j]\n        seen.setdefault(x, j)\n    return None\n",
        (([2, 7, 11, 15], 9), ([3, 2, 4], 6), ([1, 2], 7), ([3, 3], 6)),
        ([1, 4, 5], 9),
    ),
)
