"""verifiers' dataset helpers (``verifiers.utils.data_utils``): answer extraction and prompts.

``load_example_dataset`` downloads datasets from the Hugging Face Hub in verifiers; here it raises
a clear error instead (palaestra never downloads on an environment's behalf): build the dataset
in the package, or install the real ``verifiers`` to use its helper.
"""

from __future__ import annotations

from typing import Any

THINK_BOXED_SYSTEM_PROMPT = (
    "Think step-by-step inside <think>...</think> tags.     Then, give your final answer inside \\boxed{}."
)
BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def extract_boxed_answer(text: str) -> str:
    """The content of the last ``\\boxed{...}`` (braces matched), or ``text`` itself if there is none."""
    start = text.rfind("\\boxed{")
    if start == -1:
        return text
    begin = i = start + len("\\boxed{")
    depth = 1
    while i < len(text) and depth > 0:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
        i += 1
    return text[begin : i - 1] if depth == 0 else text


def strip_non_numeric(text: str) -> str:
    """Only the digits and dots of ``text``."""
    return "".join(c for c in text if c.isdigit() or c == ".")


def extract_hash_answer(text: str) -> str:
    """The text after ``####`` (GSM8K's answer marker), stripped; ``text`` itself if there is none."""
    if "####" not in text:
        return text
    return text.split("####")[1].strip()


class DatasetDownloadError(RuntimeError):
    """``load_example_dataset`` is not available: it would download a dataset."""


def load_example_dataset(
    name: str = "gsm8k", split: str | None = None, n: int | None = None, seed: int = 0
) -> Any:
    """Not available in palaestra's compatibility layer: verifiers downloads these datasets."""
    raise DatasetDownloadError(
        f"load_example_dataset({name!r}) downloads a dataset from the Hugging Face Hub, which palaestra's "
        "verifiers compatibility layer does not do. Build the dataset in the environment package (for "
        "example with datasets.load_dataset), or install the real verifiers library to use this helper."
    )


__all__ = [
    "BOXED_SYSTEM_PROMPT",
    "THINK_BOXED_SYSTEM_PROMPT",
    "DatasetDownloadError",
    "extract_boxed_answer",
    "extract_hash_answer",
    "load_example_dataset",
    "strip_non_numeric",
]
